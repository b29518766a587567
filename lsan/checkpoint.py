"""A checkpoint is a directory; `load_model(dir)` is the one way every tool reads it.

model.pt          tensors only (state_dict of the best epoch), loads with weights_only=True
config.json       the full RunConfig (data, model name and config, train, eval) and DataInfo
metrics.json      validation/test metrics of model.pt, with the protocol and timings
dataset.json      dataset stats and the maps needed downstream: raw item id per index,
                  category per item, category names, time-slot rule
train_log.jsonl   one JSON line per epoch
trainer_state.pt  optimizer state and progress, to resume an interrupted run

Every file that cannot be used (a pickle with Python objects, a truncated file, the weights of
another model or size) is one `CheckpointError("<path>: <reason>")`; `check_resume` refuses a
--resume that would not continue the stored run before the trainer writes anything.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lsan.config import DataConfig, EvalConfig, RunConfig, TrainConfig, override, to_dict
from lsan.data.batching import item_counts
from lsan.data.prepare import SeqDataset
from lsan.models import DataInfo, build_model, model_config

# what --resume may change: the run's length, nothing that shapes the model or its data
RESUMABLE = ("train.epochs", "train.max_minutes", "train.patience")
TRAINER_STATE_KEYS = ("model", "optimizer", "epoch", "best", "best_epoch", "bad", "seconds")


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


def recorded_slot_rule(ckpt: str | Path) -> str:
    """The time-slot rule checkpoint `ckpt` was trained with (its dataset.json); "" if unread."""
    try:
        return str(json.loads((Path(ckpt) / "dataset.json").read_text())["slot_rule"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""


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
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: corrupt, not JSON ({exc})") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(
            f"{path}: corrupt or from another version ({_first_line(exc)})"
        ) from None
    return run, info


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def load_tensors(path: Path, device: str | torch.device = "cpu") -> Any:
    """`torch.load(path, weights_only=True)`; every failure is one `path: reason` error."""
    try:
        with warnings.catch_warnings():  # torch warns about odd pickle protocols on stderr
            warnings.simplefilter("ignore")
            return torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"{path}: not a tensor-only checkpoint: refused (it holds Python objects, which "
            "are never unpickled)"
        ) from None
    except Exception as exc:  # torch raises many types for damaged files (EOF, zip, key errors)
        raise CheckpointError(
            f"{path}: truncated or not a torch checkpoint ({_first_line(exc)})"
        ) from None


def check_state(model: nn.Module, state: Any, path: Path) -> None:
    """Refuse a state dict that does not fit `model`: another model type, size or dataset."""
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: not a state dict of tensors")
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    extra = sorted(set(state) - set(own))
    if missing or extra:
        parts = [f"missing {', '.join(missing[:3])}" if missing else "",
                 f"unexpected {', '.join(extra[:3])}" if extra else ""]  # fmt: skip
        raise CheckpointError(
            f"{path}: weights of another model than {type(model).__name__} in config.json "
            f"({'; '.join(p for p in parts if p)})"
        )
    for key, tensor in own.items():
        if tuple(state[key].shape) != tuple(tensor.shape):
            raise CheckpointError(
                f"{path}: weights of another size: {key} is {tuple(state[key].shape)}, "
                f"the model in config.json needs {tuple(tensor.shape)}"
            )


def load_model(
    ckpt: str | Path, device: str | torch.device = "cpu"
) -> tuple[nn.Module, RunConfig, DataInfo]:
    """Rebuild the model of checkpoint `ckpt` with its best weights, in eval mode."""
    ckpt = Path(ckpt)
    run, info = read_config(ckpt)
    try:
        model = build_model(run.model_name, run.model, info)
    except ValueError as exc:
        raise CheckpointError(f"{ckpt / 'config.json'}: {_first_line(exc)}") from None
    weights = ckpt / "model.pt"
    if not weights.is_file():
        raise CheckpointError(f"{ckpt} has no model.pt (training did not finish an evaluation)")
    state = load_tensors(weights, device)
    check_state(model, state, weights)
    model.load_state_dict(state)
    return model.to(device).eval(), run, info


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_resume(out: Path, run: RunConfig, info: DataInfo, model: nn.Module, resume: bool) -> None:
    """Before a resumed run writes anything: refuse it unless it continues the stored run.

    The stored config must equal the requested one except for RESUMABLE (the run's length);
    the teacher counts as architecture. The data must have the stored shape (items, categories,
    slots, users, max_len), and every file the resumed run reads (trainer_state.pt, model.pt,
    train_log.jsonl) must load and fit the model. A fresh directory has nothing to check.
    """
    if not resume or not (out / "config.json").is_file():
        return
    path = out / "config.json"
    stored, stored_info = read_config(out)
    old = _flat(to_dict(stored)) | {
        f"data info {k}": v for k, v in dataclasses.asdict(stored_info).items()
    }
    new = _flat(to_dict(run)) | {f"data info {k}": v for k, v in dataclasses.asdict(info).items()}
    sha = "train.teacher_sha256"
    keys = sorted(set(old) | set(new), key=lambda k: (k != "model_name", k))
    if old["model_name"] != new["model_name"]:  # then every model field differs too
        keys = [k for k in keys if not k.startswith("model.")]
    diffs = [f"{k}: stored {old.get(k)!r}, requested {new.get(k)!r}"
             for k in keys if k not in (*RESUMABLE, sha) and old.get(k) != new.get(k)]  # fmt: skip
    if old[sha] and new[sha] and old[sha] != new[sha]:  # a digest not given is not a change
        diffs.append(f"{sha}: stored {old[sha]!r}, requested {new[sha]!r}")
    if diffs:
        shown = "; ".join(diffs[:4]) + (f"; and {len(diffs) - 4} more" if len(diffs) > 4 else "")
        raise CheckpointError(
            f"{path}: --resume refused, the run differs from the stored one ({shown}); only "
            f"{', '.join(RESUMABLE)} may change (train into a new --out instead)"
        )
    state_path = out / "trainer_state.pt"
    if state_path.is_file():
        state = load_tensors(state_path)
        if not isinstance(state, dict) or any(k not in state for k in TRAINER_STATE_KEYS):
            raise CheckpointError(
                f"{state_path}: lacks the trainer state ({', '.join(TRAINER_STATE_KEYS)})"
            )
        check_state(model, state["model"], state_path)
    if (out / "model.pt").is_file():
        check_state(model, load_tensors(out / "model.pt"), out / "model.pt")
    log = out / "train_log.jsonl"
    if log.is_file():
        for lineno, line in enumerate(log.read_text().splitlines(), 1):
            try:
                json.loads(line)
            except json.JSONDecodeError:
                raise CheckpointError(f"{log}:{lineno}: not a JSON line") from None


def read_metrics(ckpt: str | Path) -> dict[str, Any]:
    path = Path(ckpt) / "metrics.json"
    return json.loads(path.read_text()) if path.is_file() else {}
