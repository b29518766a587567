"""Typed run configuration and its one override path: defaults -> config file -> --set flags.

Every section is a frozen dataclass; a run is `RunConfig(data, model_name, model, train, eval)`.
Overrides are dotted keys (`train.lr=3e-4`, `model.dim=128`, `data.max_len=200`) coerced to the
field's declared type, so a typo or a wrong type is a clear error instead of a silent default.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration value or key the user gave is invalid."""


@dataclass(frozen=True)
class DataConfig:
    dataset: str = "synthetic"  # dataset name: ml-100k, ml-1m, beauty, sports, toys, yelp, lastfm, video, synthetic, synthetic-1m
    data_dir: str = ""  # root holding raw datasets; "" = $LSAN_DATA_DIR or ./data
    cache_dir: str = ""  # where prepared datasets are cached; "" = $LSAN_CACHE_DIR or ~/.cache/lsan
    min_count: int = (
        5  # k-core: drop users and items with fewer interactions, repeated until stable
    )
    max_len: int = (
        0  # longest history fed to a model, in items; 0 = dataset default (50; 200 for ML-1M)
    )


@dataclass(frozen=True)
class TrainConfig:
    lr: float = 1e-3  # Adam learning rate
    batch_size: int = 256  # training sequences per step, over all processes (torchrun splits it)
    weight_decay: float = 1e-5  # L2 strength (Adam's coupled weight decay, as in the LSAN paper)
    epochs: int = 200  # upper bound on epochs; early stopping usually ends sooner
    patience: int = 10  # evaluations without validation NDCG@10 improvement before stopping
    eval_every: int = 1  # epochs between validation evaluations
    seed: int = 42  # seeds Python, numpy and torch for a reproducible run
    device: str = "auto"  # auto (cuda if available), cpu, cuda, cuda:N
    threads: int = 0  # torch intra-op threads on CPU; 0 = torch default
    max_minutes: float = 0.0  # wall-clock budget for training; 0 = none
    loss: str = "ce"  # ce (full softmax), bpr or sampled (softmax over sampled negatives)
    negatives: int = 100  # uniform negatives per positive for bpr / sampled
    amp: str = "auto"  # training autocast: auto (bf16 on CUDA when supported, else off), bf16, off
    compile: bool = False  # torch.compile the training step (CUDA; the first steps are slow)
    teacher: str = ""  # checkpoint directory of a trained teacher for distillation ("" = none)
    teacher_sha256: str = ""  # digest of the teacher's model.pt, recorded when training starts
    kd_weight: float = 0.5  # share of the distillation loss: (1 - w) CE + w T^2 KL(teacher || student)
    kd_temperature: float = 1.0  # softmax temperature of both sides of the distillation loss


@dataclass(frozen=True)
class EvalConfig:
    ks: tuple[int, ...] = (5, 10, 20)  # cut-offs for HR@k, NDCG@k, MRR@k
    mask_seen: bool = True  # exclude every item already in the user's history from the ranking
    batch_size: int = 512  # users scored per evaluation step
    max_scores: int = 2**24  # most scores held at once (users x (|V|+1)): bounds big catalogues


@dataclass(frozen=True)
class RunConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model_name: str = "sasrec"  # key in lsan.models.MODELS
    model: Any = None  # the model's own config dataclass (built from model_name when None)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


def to_dict(cfg: Any) -> dict[str, Any]:
    """A JSON-ready dict of a (nested) config dataclass."""
    return dataclasses.asdict(cfg)


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert a parsed value (from JSON, TOML or a --set string) to the declared field type."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        return _coerce(value, args[0], key)
    if origin is tuple:
        (item_tp, *_) = typing.get_args(tp)
        if isinstance(value, str):
            value = [v for v in value.replace("(", "").replace(")", "").split(",") if v.strip()]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return tuple(_coerce(v, item_tp, key) for v in value)
    try:
        if tp is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if tp is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(float(value)) if isinstance(value, str) else int(value)
        if tp is float:
            return float(value)
        if tp is str:
            return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: cannot read {value!r} as {tp.__name__}") from None
    return value


def override(cfg: Any, values: dict[str, Any], prefix: str = "") -> Any:
    """Return a copy of dataclass `cfg` with nested `values` applied; unknown keys are errors."""
    hints = typing.get_type_hints(type(cfg))
    names = {f.name for f in dataclasses.fields(cfg)}
    changes: dict[str, Any] = {}
    for name, value in values.items():
        key = f"{prefix}{name}"
        if name not in names:
            raise ConfigError(f"unknown setting '{key}' (known: {', '.join(sorted(names))})")
        current = getattr(cfg, name)
        if dataclasses.is_dataclass(current) and isinstance(value, dict):
            changes[name] = override(current, value, prefix=f"{key}.")
        elif dataclasses.is_dataclass(current):
            raise ConfigError(
                f"'{key}' is a section; set one of its fields, e.g. {key}.<field>=..."
            )
        else:
            changes[name] = _coerce(value, hints[name], key)
    return dataclasses.replace(cfg, **changes)


def parse_sets(pairs: list[str]) -> dict[str, Any]:
    """Turn ["train.lr=3e-4", "model.dim=64"] into {"train": {"lr": "3e-4"}, "model": {...}}."""
    tree: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"--set expects key=value, got '{pair}'")
        key, value = pair.split("=", 1)
        parts = key.strip().split(".")
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set '{key}' conflicts with another setting")
        node[parts[-1]] = value.strip()
    return tree


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a JSON or TOML config file into a nested dict."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        if p.suffix == ".toml":
            return tomllib.loads(p.read_text())
        loaded = json.loads(p.read_text())
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot parse config file {p}: {exc}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {p} must hold an object at the top level")
    return loaded


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge two nested dicts, `extra` winning."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out
