"""Every checkpoint exported in every format, the way users export (export/export.py).

Each artifact is written by `lsan.export.export.export` with one fixed format, so its bytes, its
verification and its test NDCG@10 (computed with onnxruntime on that exact file) come from the
same code path users run. `--force` is passed: a format that misses the export's accuracy check
is still measured, and the check's verdict is kept in the record.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch import nn

from lsan.artifact import ArtifactError, ArtifactMeta, read
from lsan.checkpoint import load_model
from lsan.config import RunConfig
from lsan.data.prepare import SeqDataset, load_configured
from lsan.export import ExportError
from lsan.export.export import export
from lsan.info import DataInfo


@dataclass
class Checkpoint:
    label: str  # the checkpoint folder's name, unique within a run
    path: Path
    model: nn.Module
    run: RunConfig
    info: DataInfo

    @property
    def name(self) -> str:
        return self.run.model_name


@dataclass
class Artifact:
    ckpt: Checkpoint
    format: str
    path: Path  # artifact directory (lsan.artifact)
    meta: ArtifactMeta

    @property
    def key(self) -> dict[str, str]:
        """The fields that identify a row in every results table."""
        return {"label": self.ckpt.label, "model": self.ckpt.name, "format": self.format}


def load_checkpoints(paths: list[Path]) -> list[Checkpoint]:
    out, seen = [], set()
    for path in paths:
        model, run, info = load_model(path)
        label = path.resolve().name
        while label in seen:  # two folders with the same name from different parents
            label += "'"
        seen.add(label)
        out.append(Checkpoint(label, Path(path), model, run, info))
    return out


def dataset_for(ckpt: Checkpoint, data_dir: str, cache: dict[tuple, SeqDataset]) -> SeqDataset:
    """The checkpoint's dataset, loaded once per run for every checkpoint trained on it."""
    d = ckpt.run.data
    key = (d.dataset, data_dir or d.data_dir, d.cache_dir, d.min_count, d.slot_rule)
    if key not in cache:
        cache[key] = load_configured(d, data_dir)
    return cache[key]


def export_all(
    ckpt: Checkpoint, work: Path, formats: list[str], k: int, ds: SeqDataset | None, log=print
) -> list[Artifact]:
    """One artifact per format; `ds` None skips the test metrics (NDCG None)."""
    out: list[Artifact] = []
    k = min(k, ckpt.info.num_items)
    try:  # one ONNX export and one PyTorch evaluation; every format written as work/<label>-<fmt>
        export(ckpt.path, work / f"{ckpt.label}-shipped", k=k, force=True, evaluate_data=ds is not None,
               ds=ds, log=lambda *_: None, formats=tuple(formats), every_format=work / ckpt.label)  # fmt: skip
    except (ExportError, OSError, RuntimeError, ValueError) as exc:
        log(f"  {ckpt.label}: export failed ({type(exc).__name__}: {exc}), skipped")
        return out
    for fmt in formats:
        path = work / f"{ckpt.label}-{fmt}"
        try:
            meta = read(path).meta
        except ArtifactError:
            # a format that cannot be produced (e.g. a quantizer failure) is reported, not fatal
            log(f"  {ckpt.label} {fmt}: export failed, skipped")
            continue
        ndcg = (meta.test_metrics or {}).get("NDCG@10")
        shown = f"NDCG@10 {ndcg:.4f}" if ndcg is not None else "not evaluated"
        log(f"  {ckpt.label:24s} {fmt:12s} {meta.artifact_bytes:>12,d} B (model.onnx "
            f"{meta.model_onnx_bytes:,})  {shown}")  # fmt: skip
        out.append(Artifact(ckpt, fmt, path, meta))
    return out
