"""Artifact -> recommendations with onnxruntime and numpy only (the device's footprint).

Used by the HTTP server and the benchmarks; it never imports torch. `load_artifact` opens the
artifact with `lsan.artifact.read` (every file checked, every field validated, one probe batch),
then `recommend` maps raw item ids to indices, derives categories and time slots exactly as
training did, truncates to the model's max length (most recent kept), left-pads to it, and runs
the one onnxruntime session (safe to call from many threads at once). A batch of histories is
one session run, or one run per history when the artifact's format is batch-dependent (int8
dynamic quantization scales activations over the whole batch): either way a history gets the
same answer alone and in any batch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lsan.artifact import NEG, ArtifactError, read
from lsan.artifact import Artifact as Verified
from lsan.data.slots import PAD, time_slots

__all__ = ["Artifact", "ArtifactError", "Result", "load_artifact"]

DIRECT_SLOTS = 2  # a direct id table at most this many slots per catalogue item
History = list[tuple[int, float | None]]  # (raw item id, unix seconds or None), oldest first


@dataclass
class Result:
    items: list[tuple[int, float]]  # (raw item id, score), best first
    unknown_items: list[int] = field(default_factory=list)  # raw ids not in the catalogue, skipped
    fallback: str | None = None  # why the answer is not personalised (e.g. "popular")


class Artifact:
    """A verified artifact ready to answer: metadata, id maps and the onnxruntime session."""

    def __init__(self, verified: Verified):
        self.path, self.meta, self.session = verified.path, verified.meta, verified.session
        self.files = verified.manifest.files  # bytes and sha256 of each file
        t = verified.tables
        self.raw_ids = t.raw_item_ids  # index -> raw id
        self.catalogue = t.raw_item_ids[1:]  # raw ids of items 1..|V|
        # raw id -> index by binary search: a fraction of a dict's memory on a phone
        order = np.argsort(self.catalogue, kind="stable")
        self.sorted_ids = self.catalogue[order]
        self.sorted_index = order + 1  # item index of each sorted raw id
        # raw ids that are small non-negative ints (most datasets' are 1..|V| or near): a direct
        # table, one memory access per id where the binary search above makes ~log2 |V|, cache
        # misses in the server (its caches are cold after every onnxruntime run). Entry raw + 1
        # holds raw's index, 0 where raw is no item, and a 0 at each end catches every id
        # outside the range (clipped to an end; raw + 1 wraps for the largest int64, to the low end)
        top = int(self.catalogue.max(initial=0)) + 1
        self.direct: np.ndarray | None = None
        if self.catalogue.min(initial=0) >= 0 and top <= DIRECT_SLOTS * len(self.raw_ids):
            self.direct = np.zeros(top + 2, dtype=np.int64)
            self.direct[self.catalogue + 1] = np.arange(1, len(self.raw_ids), dtype=np.int64)
        self.category = t.item_category.copy()
        self.category[0] = PAD  # padding positions then look up their own category, PAD
        self.titles = t.item_titles  # title of each item index, None when the dataset has none
        self.popular = t.popular_items.tolist()
        self.popular_raw = t.raw_item_ids[t.popular_items].tolist()  # the cold-start answer
        self.slot_rule = self.meta.time_slot_rule
        self.max_len, self.k_max = self.meta.contract.max_len, self.meta.contract.k
        self.row_by_row = not self.meta.batch_invariant

    @property
    def model(self) -> str:
        return self.meta.model

    def encode(
        self, histories: list[History], exclude_seen: bool, at: Sequence[float | None] = ()
    ) -> tuple[dict[str, np.ndarray], list[list[int]], list[int]]:
        """Raw histories -> model feeds; also the unknown ids and known-item count per user.
        `at`: each request's unix time (missing or None: this machine's clock), which only the
        "ahead" time rule reads (the last entry's slot is the time until the request).

        A few numpy calls per history, none per entry: in the server this runs between
        onnxruntime calls, with cold caches, where each numpy call costs several microseconds.
        """
        b, t = len(histories), self.max_len  # always the training length: scores match training
        items = np.zeros((b, t), dtype=np.int64)
        slots = np.zeros((b, t), dtype=np.int64)
        unknown: list[list[int]] = []
        kept: list[np.ndarray] = []
        for r, hist in enumerate(histories):
            raw_ids, seconds = zip(*hist, strict=True) if hist else ((), ())
            idx = self.indices(raw_ids)
            if np.count_nonzero(idx) == len(idx):  # a reduction (idx.all()) costs more
                unknown.append([])
            else:
                known = idx != 0
                flags = known.tolist()
                unknown.append([i for i, k in zip(raw_ids, flags, strict=True) if not k])
                seconds = tuple(s for s, k in zip(seconds, flags, strict=True) if k)
                idx = idx[known]
            kept.append(idx)
            n = min(len(idx), t)  # keep the most recent max_len
            if n:
                items[r, t - n :] = idx[len(idx) - n :]
                # None (no timestamp) -> NaN -> -1, which time_slots reads as unknown; "gap"
                # reads the whole history (a kept entry's gap is to the entry before it)
                since = 0 if self.slot_rule == "gap" else len(seconds) - n
                times = seconds[since:]
                m = len(times)
                if self.slot_rule == "ahead":  # one time more, the request's: read, not kept
                    times = (*times, at[r] if r < len(at) and at[r] is not None else time.time())
                ts = np.fmax(np.array(times, dtype=np.float64), -1.0)
                slots[r, t - n :] = time_slots(ts, self.slot_rule)[m - n : m]
        known_counts = [len(idx) for idx in kept]
        # the exclude width in powers of two (PAD entries exclude nothing): few distinct input
        # shapes, so onnxruntime's per-shape buffers stay few
        e = 1 << (max(1, max(known_counts, default=1)) - 1).bit_length() if exclude_seen else 1
        exclude = np.zeros((b, e), dtype=np.int64)
        if exclude_seen:
            for r, idx in enumerate(kept):
                exclude[r, : len(idx)] = idx
        cats = self.category[items]  # slots: PAD where padded, time_slots never gives 0
        return (
            {"items": items, "cats": cats, "slots": slots, "exclude": exclude},
            unknown,
            known_counts,
        )

    def indices(self, raw_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Item index of each raw id, 0 for an id not in the catalogue."""
        ids = np.asarray(raw_ids, dtype=np.int64)
        if self.direct is not None:
            return self.direct.take(ids + 1, mode="clip")
        pos = np.searchsorted(self.sorted_ids, ids)  # an id past the last one clips to it
        hit = self.sorted_ids.take(pos, mode="clip") == ids
        return np.where(hit, self.sorted_index.take(pos, mode="clip"), 0)

    def recommend(
        self,
        histories: list[History],
        k: int = 10,
        exclude_seen: bool = True,
        at: Sequence[float | None] = (),
    ) -> list[Result]:
        """Top-k raw item ids and scores for each history (`at`: see `encode`)."""
        return self.recommend_timed(histories, k, exclude_seen, at)[0]

    def recommend_timed(
        self,
        histories: list[History],
        k: int = 10,
        exclude_seen: bool = True,
        at: Sequence[float | None] = (),
    ) -> tuple[list[Result], float]:
        """`recommend`, and the seconds spent in onnxruntime (every session run summed): the
        model's share of the answer, which the server reports next to its own total."""
        if not 1 <= k <= self.k_max:
            raise ValueError(f"k must be between 1 and {self.k_max}")
        if self.row_by_row and len(histories) > 1:
            results, model_s = [], 0.0
            for r, h in enumerate(histories):
                (res,), s = self.recommend_timed([h], k, exclude_seen, at[r : r + 1])
                results.append(res)
                model_s += s
            return results, model_s
        feeds, unknown, known = self.encode(histories, exclude_seen, at)
        t0 = time.perf_counter()
        top_items, top_scores = self.session.run(["top_items", "top_scores"], feeds)
        model_s = time.perf_counter() - t0
        results = []
        for r in range(len(histories)):
            if known[r] == 0:
                pop = [(i, 0.0) for i in self.popular_raw[:k]]
                results.append(Result(pop, unknown[r], "popular"))
                continue
            ids = self.raw_ids.take(top_items[r, :k]).tolist()
            scores = top_scores[r, :k].tolist()
            # fewer than k unseen items left: drop the masked ones (sorted last)
            found = [(i, s) for i, s in zip(ids, scores, strict=True) if s > NEG / 2]
            results.append(Result(found, unknown[r]))
        return results, model_s

    def warm_up(self, requests: int = 21, budget_s: float = 1.0) -> list[float]:
        """Full-length requests (distinct catalogue items, k max, seen items excluded), so the
        first real request does not pay graph initialisation; returns each one's seconds, the
        first (the initialisation) included. Stops early once `budget_s` is spent."""
        n = len(self.catalogue)
        hist: History = [(int(self.catalogue[(p * 7919) % n]), None) for p in range(self.max_len)]
        times: list[float] = []
        stop = time.perf_counter() + budget_s
        while len(times) < max(1, requests) and (not times or time.perf_counter() < stop):
            t0 = time.perf_counter()
            self.recommend([hist], k=self.k_max)
            times.append(time.perf_counter() - t0)
        return times


def load_artifact(path: str | Path, threads: int = 1) -> Artifact:
    """Open and verify an artifact directory (lsan.artifact.read); ArtifactError if unusable."""
    return Artifact(read(path, threads))
