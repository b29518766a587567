"""A checkpoint is a directory; `load_model(dir)` is the one way every tool reads it.

model.pt          tensors only (state_dict of the best epoch), loads with weights_only=True
config.json       the full RunConfig (data, model name and config, train, eval) and DataInfo
metrics.json      validation/test metrics of model.pt, with the protocol and timings
dataset.json      dataset stats and the maps needed downstream: raw item id per index,
                  category per item, category names, time-slot rule
train_log.jsonl   one JSON line per epoch
trainer_state.pt  optimizer state and progress, to resume an interrupted run
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lsan.config import DataConfig, EvalConfig, RunConfig, TrainConfig, override, to_dict
from lsan.data.batching import item_counts
from lsan.data.prepare import SeqDataset
from lsan.models import DataInfo, build_model, model_config


class CheckpointError(ValueError):
    """A checkpoint directory is missing, incomplete or corrupt."""


def write_json(path: Path, obj: Any) -> None:
    """Write JSON atomically (temp file, then rename) so a crash never leaves half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)


def save_tensors(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def dataset_record(ds: SeqDataset) -> dict[str, Any]:
    return {
        "name": ds.name,
        "stats": ds.stats,
        "slot_rule": ds.slot_rule,
        "category_rule": ds.category_rule,
        "category_names": ds.category_names,
        "raw_item_ids": ds.raw_item_ids.tolist(),
        "item_category": ds.item_category.tolist(),
        "item_counts": item_counts(ds).astype(int).tolist(),  # training interactions per item
    }


def save_config(out: Path, run: RunConfig, info: DataInfo) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", {"run": to_dict(run), "info": dataclasses.asdict(info)})


def read_config(ckpt: Path) -> tuple[RunConfig, DataInfo]:
    path = Path(ckpt) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{ckpt} is not a checkpoint directory (no config.json)")
    try:
        raw = json.loads(path.read_text())
        r = raw["run"]
        run = RunConfig(
            data=override(DataConfig(), r["data"]),
            model_name=r["model_name"],
            model=model_config(r["model_name"], r["model"]),
            train=override(TrainConfig(), r["train"]),
            eval=override(EvalConfig(), r["eval"]),
        )
        info = DataInfo(**raw["info"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path} is corrupt or from another version: {exc}") from None
    return run, info


def load_model(
    ckpt: str | Path, device: str | torch.device = "cpu"
) -> tuple[nn.Module, RunConfig, DataInfo]:
    """Rebuild the model of checkpoint `ckpt` with its best weights, in eval mode."""
    ckpt = Path(ckpt)
    run, info = read_config(ckpt)
    model = build_model(run.model_name, run.model, info)
    weights = ckpt / "model.pt"
    if not weights.is_file():
        raise CheckpointError(f"{ckpt} has no model.pt (training did not finish an evaluation)")
    try:
        state = torch.load(weights, map_location=device, weights_only=True)
        model.load_state_dict(state)
    except (RuntimeError, OSError, EOFError, ValueError) as exc:
        raise CheckpointError(f"{weights} cannot be loaded: {str(exc).splitlines()[0]}") from None
    return model.to(device).eval(), run, info


def read_metrics(ckpt: str | Path) -> dict[str, Any]:
    path = Path(ckpt) / "metrics.json"
    return json.loads(path.read_text()) if path.is_file() else {}
