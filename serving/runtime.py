"""Artifact -> recommendations with onnxruntime and numpy only (the device's footprint).

Used by the HTTP server and the benchmarks. It never imports torch: loading an artifact checks
the model file's sha256 against metadata.json, maps raw item ids to indices, derives categories
and time slots exactly as training did, truncates to the model's max length (most recent kept),
left-pads, and runs one onnxruntime session (safe to call from many threads at once).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from lsan.data.slots import NUM_SLOTS, PAD, UNKNOWN, time_slots
from lsan.digest import file_digest

NEG = -1e9  # the graph's score for excluded and padding items (lsan.models.layers.NEG)


class ArtifactError(RuntimeError):
    """The artifact directory is missing, incomplete or has been tampered with."""


@dataclass
class Result:
    items: list[tuple[int, float]]  # (raw item id, score), best first
    unknown_items: list[int] = field(default_factory=list)  # raw ids not in the catalogue, skipped
    fallback: str | None = None  # why the answer is not personalised (e.g. "popular")


class Artifact:
    """A loaded artifact: metadata, id maps and an onnxruntime session."""

    def __init__(self, path: Path, meta: dict[str, Any], threads: int = 1):
        self.path, self.meta = path, meta
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(
            str(path / "model.onnx"), opts, providers=["CPUExecutionProvider"]
        )
        self.raw_ids = np.asarray(meta["raw_item_ids"], dtype=np.int64)  # index -> raw id
        self.index_of = {int(r): i for i, r in enumerate(meta["raw_item_ids"]) if i > 0}
        self.category = np.asarray(meta["item_category"], dtype=np.int64)
        self.slot_rule = meta["time_slot_rule"]["rule"]
        if self.slot_rule not in NUM_SLOTS:
            raise ArtifactError(f"unknown time-slot rule {self.slot_rule!r} in metadata")
        self.max_len = int(meta["contract"]["max_len"])
        self.k_max = int(meta["contract"]["k"])
        self.popular = [int(i) for i in meta.get("popular_items", [])]

    @property
    def model(self) -> str:
        return str(self.meta["model"])

    def encode(
        self, histories: list[list[tuple[int, float | None]]], exclude_seen: bool
    ) -> tuple[dict[str, np.ndarray], list[list[int]], list[int]]:
        """Raw histories -> model feeds; also the unknown ids and known-item count per user."""
        rows, unknown, known_counts = [], [], []
        for hist in histories:
            idx = [self.index_of.get(int(item)) for item, _ in hist]
            unknown.append([int(item) for (item, _), i in zip(hist, idx, strict=True) if i is None])
            kept = [(i, ts) for i, (_, ts) in zip(idx, hist, strict=True) if i is not None]
            known_counts.append(len(kept))
            rows.append(kept)
        b = len(rows)
        t = self.max_len  # always the training length: scores then match training exactly
        e = max(1, max((len(r) for r in rows), default=1)) if exclude_seen else 1
        items = np.zeros((b, t), dtype=np.int64)
        slots = np.zeros((b, t), dtype=np.int64)
        exclude = np.zeros((b, e), dtype=np.int64)
        for r, kept in enumerate(rows):
            if not kept:
                continue
            ids = np.fromiter((i for i, _ in kept), dtype=np.int64, count=len(kept))
            ts = np.fromiter(
                (-1 if s is None else int(s) for _, s in kept), dtype=np.int64, count=len(kept)
            )
            recent = slice(max(0, len(kept) - t), len(kept))  # keep the most recent max_len
            n = recent.stop - recent.start
            items[r, t - n :] = ids[recent]
            slots[r, t - n :] = time_slots(ts[recent], self.slot_rule)
            if exclude_seen:
                exclude[r, : len(ids)] = ids
        cats = np.where(items == PAD, PAD, self.category[items])
        slots = np.where(items == PAD, PAD, np.where(slots == 0, UNKNOWN, slots))
        return (
            {"items": items, "cats": cats, "slots": slots, "exclude": exclude},
            unknown,
            known_counts,
        )

    def recommend(
        self,
        histories: list[list[tuple[int, float | None]]],
        k: int = 10,
        exclude_seen: bool = True,
    ) -> list[Result]:
        """Top-k raw item ids and scores for each history (a batch in one onnxruntime call)."""
        if not 1 <= k <= self.k_max:
            raise ValueError(f"k must be between 1 and {self.k_max}")
        feeds, unknown, known = self.encode(histories, exclude_seen)
        top_items, top_scores = self.session.run(["top_items", "top_scores"], feeds)
        results = []
        for r in range(len(histories)):
            if known[r] == 0:
                pop = self.popular[:k]
                results.append(
                    Result([(int(self.raw_ids[i]), 0.0) for i in pop], unknown[r], "popular")
                )
                continue
            real = top_scores[r, :k] > NEG / 2  # fewer than k unseen items left: drop masked ones
            ids, scores = top_items[r, :k][real], top_scores[r, :k][real]
            pairs = [(int(self.raw_ids[i]), float(s)) for i, s in zip(ids, scores, strict=True)]
            results.append(Result(pairs, unknown[r]))
        return results

    def warm_up(self) -> float:
        """One full-length request, so the first real request does not pay graph initialisation."""
        t0 = time.perf_counter()
        first = next(iter(self.index_of))
        self.recommend([[(first, None)] * min(self.max_len, 8)], k=1)
        return time.perf_counter() - t0


def load_artifact(path: str | Path, threads: int = 1) -> Artifact:
    """Load and verify an artifact directory (metadata.json + model.onnx)."""
    path = Path(path)
    meta_path, model_path = path / "metadata.json", path / "model.onnx"
    if not meta_path.is_file() or not model_path.is_file():
        raise ArtifactError(
            f"{path} is not an artifact directory (needs metadata.json and model.onnx)"
        )
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{meta_path} is not valid JSON: {exc}") from None
    want = meta.get("sha256")
    if not want or file_digest(model_path) != want:
        raise ArtifactError(
            f"{model_path}: checksum mismatch with metadata.json (file changed or corrupt)"
        )
    try:
        return Artifact(path, meta, threads)
    except (KeyError, TypeError) as exc:
        raise ArtifactError(f"{meta_path} lacks a field the runtime needs: {exc}") from None
    except ort.capi.onnxruntime_pybind11_state.Fail as exc:
        raise ArtifactError(f"{model_path} cannot be loaded by onnxruntime: {exc}") from None
