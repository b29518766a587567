"""Typed run configuration and its one override path: defaults -> config file -> --set flags.

Every section is a frozen dataclass; a run is `RunConfig(data, model_name, model, train, eval)`.
Overrides are dotted keys (`train.lr=3e-4`, `model.dim=128`, `data.max_len=200`) coerced to the
field's declared type, so a typo or a wrong type is a clear error instead of a silent default.

Every value is validated when it is parsed, with the dotted name in the message: its type (an
int field never truncates 1.5, a bool is not a number, numbers are finite) and its range or
choices from `RULES`, keyed by "section.field" for this module's sections and by the bare field
name for the model configs (`dim`, `dropout`, ... mean the same in every model file), so each
model's config is checked by the same `override` without code in the model files.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tomllib
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lsan.data.slots import RULES as SLOT_RULES


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
    slot_rule: str = "auto"  # time context: auto (hour, or weekday for day-granular data), hour, weekday, gap (time since the previous interaction), ahead (time until the next one: the request's, for the last), none

    def __post_init__(self) -> None:
        validate(self, "data.")


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
    teacher: str = ""  # checkpoint directory of a trained teacher for distillation ("" = none; "A,B": an ensemble)
    teacher_sha256: str = (
        ""  # digest of each teacher's model.pt (","-joined), recorded when training starts
    )
    kd_weight: float = (
        0.5  # share of the distillation loss: (1 - w) CE + w T^2 KL(teacher || student)
    )
    kd_temperature: float = 1.0  # softmax temperature of both sides of the distillation loss
    teacher_init: bool = False  # start from the teacher's weights where names and shapes match
    init: str = ""  # start from this checkpoint's weights where names and shapes match ("" = none)
    ema: float = 0.0  # decay of a per-step moving average of the weights, which is what is
    # evaluated, kept and exported (0 = off, the live weights; 0.99 averages about 100 steps)
    freeze: str = ""  # parameters left as they start: ","-separated name prefixes ("" = none;
    # "item_emb" holds a low-bit student's table while its encoder fine-tunes; "pos_emb,blocks,ln" the reverse)
    train_only: str = ""  # the complement: only these prefixes train, everything else is held
    # ("item_emb.bias": an output bias fitted alone on a trained model, whatever its encoder)

    def __post_init__(self) -> None:
        validate(self, "train.")


@dataclass(frozen=True)
class EvalConfig:
    ks: tuple[int, ...] = (5, 10, 20)  # cut-offs for HR@k, NDCG@k, MRR@k
    mask_seen: bool = True  # exclude every item already in the user's history from the ranking
    batch_size: int = 512  # users scored per evaluation step
    max_scores: int = 2**24  # most scores held at once (users x (|V|+1)): bounds big catalogues

    def __post_init__(self) -> None:
        validate(self, "eval.")


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


# ---------------------------------------------------------------- validation

# A rule is (test, what a valid value is), or (test, the whole message with {name} and {value}).
# Choices the models define are repeated here because this module is upstream of lsan.models;
# tests/test_config.py checks that both lists agree.
Rule = tuple[Callable[[Any], bool], str]


def _at_least(low: int | float) -> Rule:
    return (lambda v: v >= low), f"must be >= {low}"


def _above(low: float) -> Rule:
    return (lambda v: v > low), f"must be > {low}"


def _unit(high_open: bool) -> Rule:
    if high_open:
        return (lambda v: 0 <= v < 1), "must be in [0, 1)"
    return (lambda v: 0 <= v <= 1), "must be in [0, 1]"


def _one_of(*choices: str) -> Rule:
    # {name} and {value} are filled in by validate: "model.backbone: unknown backbone 't5' (...)"
    return (lambda v: v in choices), f"unknown {{name}} {{value!r}} (known: {', '.join(choices)})"


def _prefixes(v: str) -> bool:
    return v == "" or all(p.strip() for p in v.split(","))


def _ks(v: tuple[int, ...]) -> bool:
    return len(v) > 0 and all(k >= 1 for k in v) and 10 in v


RULES: dict[str, Rule] = {
    # data
    "data.dataset": ((lambda v: v != ""), "must name a dataset"),
    "data.min_count": _at_least(1),
    "data.max_len": _at_least(0),
    "data.slot_rule": _one_of(*SLOT_RULES),
    # train
    "train.lr": _above(0),
    "train.batch_size": _at_least(1),
    "train.weight_decay": _at_least(0),
    "train.epochs": _at_least(1),
    "train.patience": _at_least(1),
    "train.eval_every": _at_least(1),
    "train.seed": ((lambda v: 0 <= v < 2**32), "must be in [0, 2**32)"),
    "train.device": (
        (lambda v: re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", v) is not None),
        "must be auto, cpu, mps, cuda or cuda:N",
    ),
    "train.threads": _at_least(0),
    "train.max_minutes": _at_least(0),
    "train.loss": _one_of("ce", "bpr", "sampled"),
    "train.negatives": _at_least(1),
    "train.amp": _one_of("auto", "bf16", "off"),
    "train.teacher_sha256": (
        (lambda v: re.fullmatch(r"|[0-9a-f]{64}(,[0-9a-f]{64})*", v) is not None),
        "must be empty or sha256s (64 lowercase hex digits each, ','-separated)",
    ),
    "train.kd_weight": _unit(high_open=False),
    "train.kd_temperature": _above(0),
    "train.ema": _unit(high_open=True),
    "train.freeze": (_prefixes, "must be empty or parameter name prefixes separated by ','"),
    "train.train_only": (_prefixes, "must be empty or parameter name prefixes separated by ','"),
    # eval
    "eval.ks": (_ks, "must be cut-offs >= 1 that include 10 (NDCG@10 selects the model)"),
    "eval.batch_size": _at_least(1),
    "eval.max_scores": _at_least(1),
    # model configs (lsan/models/*.py), by field name
    "dim": _at_least(1),
    "user_dim": _at_least(1),
    "layers": _at_least(1),
    "heads": _at_least(1),
    "ffn_mult": _at_least(1),
    "kernel": _at_least(1),
    "window": _at_least(1),
    "tables": _at_least(1),
    "code_size": _at_least(1),
    "m1": _at_least(0),
    "own_rows": _at_least(0),
    "bits": ((lambda v: v in (0, 1, 2, 4, 8)), "must be 0 (float), 1, 2, 4 or 8"),
    "hot_rows": _at_least(0),
    "hot_bits": ((lambda v: v in (1, 2, 4, 8)), "must be 1, 2, 4 or 8"),
    "n_h": _at_least(0),
    "n_v": _at_least(0),
    "dropout": _unit(high_open=True),
    "mask_prob": _unit(high_open=True),
    "sse_user": _unit(high_open=False),
    "sse_item": _unit(high_open=False),
    "init_std": _above(0),
    "attention": _one_of("causal", "bidirectional", "local"),
    "train_scores": _one_of("factorised", "matrix"),
    "item_table": _one_of("full", "qr", "codes", "pq"),
    "codes_from": _one_of("arithmetic", "popularity", "teacher"),
    "backbone": _one_of("gpt2", "llama", "bert", "albert"),
}


def _type_ok(value: Any, tp: Any) -> bool:
    """Whether a constructed field value has its declared type (bool is no number here)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return value is None or any(_type_ok(value, a) for a in typing.get_args(tp))
    if origin is tuple:
        (item_tp, *_) = typing.get_args(tp)
        return isinstance(value, tuple) and all(_type_ok(v, item_tp) for v in value)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return (
            isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        )
    if tp in (bool, str):
        return isinstance(value, tp)
    return True


def validate(cfg: Any, prefix: str = "") -> None:
    """Check every field of dataclass `cfg` for its type and its rule; ConfigError names it."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        key, value, tp = f"{prefix}{f.name}", getattr(cfg, f.name), hints[f.name]
        if dataclasses.is_dataclass(value) or tp is Any:
            continue
        if not _type_ok(value, tp):
            name = getattr(tp, "__name__", str(tp))
            raise ConfigError(f"{key}: expected {name}, got {value!r}")
        test, text = RULES.get(key) or RULES.get(f.name) or ((lambda v: True), "")
        if not test(value):
            if "{name}" in text:
                raise ConfigError(f"{key}: " + text.format(name=f.name, value=value))
            raise ConfigError(f"{key}: {text}, got {value!r}")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert a parsed value (from JSON, TOML or a --set string) to the declared field type.

    Only exact conversions: "7", 7.0 and "1e3" are ints, 1.5 and "1.5" are not; booleans are not
    numbers; strings are not read from numbers (a TOML `data_dir = 5` is an error).
    """
    given = value
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
            if isinstance(value, bool):
                raise ValueError(value)
            if isinstance(value, str):
                try:
                    return int(value.strip())
                except ValueError:
                    value = float(value)
            if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
                raise ValueError(value)
            if not isinstance(value, int | float):
                raise ValueError(value)
            return int(value)
        if tp is float:
            if isinstance(value, bool) or not isinstance(value, int | float | str):
                raise ValueError(value)
            number = float(value)
            if not math.isfinite(number):
                raise ValueError(value)
            return number
        if tp is str:
            if not isinstance(value, str):
                raise ValueError(value)
            return value
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{key}: cannot read {given!r} as {tp.__name__}") from None
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
    out = dataclasses.replace(cfg, **changes)
    validate(out, prefix)
    return out


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
