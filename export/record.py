"""What the artifact records about its checkpoint: the metadata and the catalogue tables."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch

from lsan.artifact import SCHEMA_VERSION, ArtifactMeta, Check, Contract, Source, Tables
from lsan.config import RunConfig
from lsan.digest import file_digest
from lsan.export.graph import OPSET
from lsan.info import DataInfo


def describe(fmt: str, c: Check) -> str:
    """One line per format for the export's log."""
    if c.error is not None:
        return f"  {fmt:12s} failed: {c.error}"
    shown = f"NDCG@10 {c.test['NDCG@10']:.4f}" if c.test else "no data"
    batch = "" if c.batch_invariant else "  (batch-dependent: served row by row)"
    return (f"  {fmt:12s} {c.bytes or 0:>11,d} B  {c.latency_ms_b1 or 0:.3f} ms  "
            f"top10 overlap {c.top10_overlap or 0:.3f}  {shown}{batch}")  # fmt: skip


def describe_artifact(
    run: RunConfig, info: DataInfo, dataset: dict[str, Any], fmt: str,
    candidates: dict[str, Check], torch_test: dict[str, float] | None, k: int,
    problems: list[str], ckpt: Path,
) -> ArtifactMeta:  # fmt: skip
    """The metadata of the artifact shipping format `fmt` (sizes are filled in by write)."""
    return ArtifactMeta(
        schema_version=SCHEMA_VERSION, model=run.model_name,
        hyperparameters=dataclasses.asdict(run.model), dataset=dataset["name"],
        dataset_stats=dataset["stats"], info=info, category_names=dataset["category_names"],
        time_slot_rule=dataset["slot_rule"], contract=Contract(k=k, max_len=info.max_len, opset=OPSET),
        quantization=fmt, batch_invariant=bool(candidates[fmt].batch_invariant), parity=candidates,
        verification_problems=problems, test_metrics=candidates[fmt].test,
        test_metrics_pytorch=torch_test,
        source=Source(checkpoint=ckpt.resolve().name, model_pt_sha256=file_digest(ckpt / "model.pt"),
                      versions={"torch": torch.__version__, "onnx": onnx.__version__,
                                "onnxruntime": ort.__version__}),
        model_onnx_bytes=0, artifact_bytes=0,
    )  # fmt: skip


def artifact_tables(
    dataset: dict[str, Any], info: DataInfo, n: int = 100, titles: dict[int, str] | None = None
) -> Tables:
    """Raw id and category of every item index; the most frequent training items (indices);
    each item's title from `titles` (raw id -> title), none when no catalogue item has one."""
    counts = dataset.get("item_counts")
    if counts is None:
        popular = list(range(1, min(n, info.num_items) + 1))
    else:
        popular = [int(i) for i in np.argsort(-np.asarray(counts), kind="stable") if i != 0][:n]
    named = ["", *(titles.get(int(r), "") for r in dataset["raw_item_ids"][1:])] if titles else []
    return Tables(raw_item_ids=np.asarray(dataset["raw_item_ids"]),
                  item_category=np.asarray(dataset["item_category"]),
                  popular_items=np.asarray(popular),
                  item_titles=named if any(named) else None)  # fmt: skip
