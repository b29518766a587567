import dataclasses
import json
import typing
from pathlib import Path

import pytest

from lsan.cli import build_run
from lsan.config import (
    RULES,
    ConfigError,
    DataConfig,
    EvalConfig,
    RunConfig,
    TrainConfig,
    override,
    parse_sets,
    read_config_file,
    validate,
)
from lsan.models import model_config
from lsan.models.sasrec import SASRecConfig


def test_override_coerces_types_and_keeps_frozen_defaults():
    cfg = override(TrainConfig(), {"lr": "3e-4", "epochs": "7", "device": "cpu"})
    assert cfg.lr == pytest.approx(3e-4) and cfg.epochs == 7 and cfg.device == "cpu"
    assert TrainConfig().lr == 1e-3  # the default is untouched


def test_override_rejects_unknown_keys_and_bad_values():
    with pytest.raises(ConfigError, match="unknown setting 'train.lrr'"):
        override(RunConfig(), {"train": {"lrr": 1}})
    with pytest.raises(ConfigError, match="cannot read 'x' as int"):
        override(TrainConfig(), {"epochs": "x"})
    with pytest.raises(ConfigError, match="cannot read 2.5 as int"):
        override(TrainConfig(), {"epochs": 2.5})


def test_bool_and_tuple_fields():
    cfg = override(RunConfig(), {"eval": {"mask_seen": "false", "ks": "1,10"}})
    assert cfg.eval.mask_seen is False and cfg.eval.ks == (1, 10)


def test_parse_sets_nests_dotted_keys():
    assert parse_sets(["train.lr=0.1", "model.dim=8"]) == {
        "train": {"lr": "0.1"},
        "model": {"dim": "8"},
    }
    with pytest.raises(ConfigError, match="key=value"):
        parse_sets(["train.lr"])


def test_precedence_defaults_file_sets_flags(tmp_path):
    f = tmp_path / "run.json"
    f.write_text(
        json.dumps(
            {
                "model_name": "sasrec",
                "model": {"dim": 32, "layers": 1},
                "train": {"lr": 0.01, "epochs": 3},
                "data": {"dataset": "beauty"},
            }
        )
    )
    run = build_run("ml-100k", None, str(f), ["model.dim=16", "train.epochs=5"], device="cpu")
    assert run.data.dataset == "ml-100k"  # explicit flag beats the file
    assert run.model == SASRecConfig(dim=16, layers=1)  # --set beats the file, file beats defaults
    assert (run.train.lr, run.train.epochs, run.train.device) == (0.01, 5, "cpu")


def test_toml_config_and_errors(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text("[train]\nlr = 0.5\n")
    assert read_config_file(f) == {"train": {"lr": 0.5}}
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ConfigError, match="cannot parse"):
        read_config_file(bad)
    with pytest.raises(ConfigError, match="not found"):
        read_config_file(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="unknown model"):
        build_run("synthetic", "nomodel")


# ---------------------------------------------------------------- validation: every field

# Bad values for every field of this module's sections, as a config file or --set gives them
# (strings are what --set passes), with what the one-line message says after the dotted name.
BAD = {
    "model_name": [("nomodel", "unknown model 'nomodel'")],
    "data.dataset": [("nope", "unknown dataset 'nope'"), (5, "cannot read 5 as str")],
    "data.data_dir": [(5, "cannot read 5 as str")],
    "data.cache_dir": [(["a"], "cannot read ['a'] as str")],
    "data.min_count": [("0", "must be >= 1"), ("2.5", "cannot read '2.5' as int")],
    "data.max_len": [("-1", "must be >= 0"), (True, "cannot read True as int")],
    "data.slot_rule": [("minute", "unknown slot_rule 'minute'"), (3, "cannot read 3 as str")],
    "train.lr": [
        ("0", "must be > 0"),
        ("nan", "cannot read 'nan' as float"),
        (False, "cannot read"),
    ],
    "train.batch_size": [("0", "must be >= 1"), (64.5, "cannot read 64.5 as int")],
    "train.weight_decay": [("-1e-5", "must be >= 0")],
    "train.epochs": [("1.5", "cannot read '1.5' as int"), ("0", "must be >= 1")],
    "train.patience": [("0", "must be >= 1")],
    "train.eval_every": [("0", "must be >= 1")],
    "train.seed": [("-1", "must be in [0, 2**32)"), (2**32, "must be in [0, 2**32)")],
    "train.device": [("gpu", "must be auto, cpu, mps, cuda or cuda:N"), ("cuda:x", "must be")],
    "train.threads": [("-3", "must be >= 0")],
    "train.max_minutes": [("-1", "must be >= 0"), ("inf", "cannot read 'inf' as float")],
    "train.loss": [("hinge", "unknown loss 'hinge' (known: ce, bpr, sampled)")],
    "train.negatives": [("0", "must be >= 1")],
    "train.amp": [("fp16", "unknown amp 'fp16' (known: auto, bf16, off)")],
    "train.compile": [("maybe", "cannot read 'maybe' as bool")],
    "train.teacher": [(3, "cannot read 3 as str")],
    "train.teacher_sha256": [("abc", "64 lowercase hex digits"), ("A" * 64, "64 lowercase hex")],
    "train.kd_weight": [("1.5", "must be in [0, 1]"), ("-0.1", "must be in [0, 1]")],
    "train.kd_temperature": [("0", "must be > 0")],
    "train.ema": [("1", "must be in [0, 1)"), ("-0.5", "must be in [0, 1)")],
    "train.teacher_init": [("maybe", "cannot read 'maybe' as bool")],
    "train.init": [(3, "cannot read 3 as str")],
    "train.freeze": [("blocks,,ln", "prefixes separated by ','"), (3, "cannot read 3 as str")],
    "train.train_only": [(",", "prefixes separated by ','")],
    "eval.ks": [("5,20", "include 10"), ("0,10", ">= 1"), ("10,2.5", "cannot read '2.5' as int")],
    "eval.mask_seen": [("maybe", "cannot read 'maybe' as bool")],
    "eval.batch_size": [("0", "must be >= 1")],
    "eval.max_scores": [("0", "must be >= 1")],
}
# Model config fields (lsan/models/*.py), by field name: checked for every model that has one.
MODEL_BAD = {
    "dim": [("0", "must be >= 1"), ("-5", "must be >= 1"), ("64.5", "cannot read '64.5' as int")],
    "user_dim": [("0", "must be >= 1")],
    "layers": [("0", "must be >= 1")],
    "heads": [("0", "must be >= 1")],
    "ffn_mult": [("0", "must be >= 1")],
    "kernel": [("0", "must be >= 1")],
    "window": [("0", "must be >= 1")],
    "tables": [("0", "must be >= 1")],
    "code_size": [("0", "must be >= 1")],
    "m1": [("-1", "must be >= 0")],
    "own_rows": [("-1", "must be >= 0")],
    "bits": [("3", "must be 0 (float), 1, 2, 4 or 8"), ("-1", "must be 0")],
    "hot_rows": [("-1", "must be >= 0")],
    "refresh_steps": [("maybe", "cannot read 'maybe' as bool")],
    "item_bias": [("maybe", "cannot read 'maybe' as bool")],
    "hot_bits": [("0", "must be 1, 2, 4 or 8"), ("16", "must be 1, 2, 4 or 8")],
    "n_h": [("-1", "must be >= 0")],
    "n_v": [("-1", "must be >= 0")],
    "dropout": [("1", "must be in [0, 1)"), ("-0.1", "must be in [0, 1)")],
    "mask_prob": [("1.0", "must be in [0, 1)")],
    "sse_user": [("1.5", "must be in [0, 1]")],
    "sse_item": [("-0.5", "must be in [0, 1]")],
    "init_std": [("0", "must be > 0")],
    "attention": [
        ("sideways", "unknown attention 'sideways' (known: causal, bidirectional, local)")
    ],
    "train_scores": [("fast", "unknown train_scores 'fast' (known: factorised, matrix)")],
    "item_table": [("hash", "unknown item_table 'hash' (known: full, qr, codes, pq)")],
    "codes_from": [
        ("random", "unknown codes_from 'random' (known: arithmetic, popularity, teacher)")
    ],
    "backbone": [("t5", "unknown backbone 't5' (known: gpt2, llama, bert, albert)")],
    "item_weights": [("maybe", "cannot read 'maybe' as bool")],
    "use_category": [("2", "cannot read '2' as bool")],
    "use_time": [("maybe", "cannot read 'maybe' as bool")],
    "time_residual": [("yes please", "cannot read 'yes please' as bool")],
    "conv": [("maybe", "cannot read 'maybe' as bool")],
}


def _model_fields() -> dict[str, list[str]]:
    """One model name per config class -> the fields of that class."""
    from lsan.models import MODELS

    out: dict[type, tuple[str, list[str]]] = {}
    for name, (_, factory) in MODELS.items():
        cfg = factory()
        out.setdefault(type(cfg), (name, [f.name for f in dataclasses.fields(cfg)]))
    return dict(out.values())


def _section_cases():
    for key, bads in BAD.items():
        for value, fragment in bads:
            yield pytest.param(key, value, fragment, id=f"{key}={value!r}")


def _model_cases():
    for model, fields in _model_fields().items():
        for name in fields:
            for value, fragment in MODEL_BAD.get(name, []):
                yield pytest.param(model, name, value, fragment, id=f"{model}.{name}={value!r}")


def _tree(key: str, value) -> dict:
    node: dict = {}
    tree = node
    *parents, last = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return tree


def _parse(tmp_path, tree: dict, model: str | None = None) -> RunConfig:
    f = tmp_path / "run.json"
    f.write_text(json.dumps(tree))
    return build_run(None, model, str(f))


@pytest.mark.parametrize(("key", "value", "fragment"), list(_section_cases()))
def test_every_section_field_is_validated_with_its_dotted_name(tmp_path, key, value, fragment):
    with pytest.raises(ConfigError) as err:
        _parse(tmp_path, _tree(key, value))
    msg = str(err.value)
    assert fragment in msg and "\n" not in msg
    if key != "model_name":
        assert msg.startswith(f"{key}: "), msg
    if isinstance(value, str) and key not in ("model_name", "data.dataset"):
        with pytest.raises(ConfigError, match=f"^{key}: "):  # the same through --set
            build_run(None, None, None, [f"{key}={value}"])


@pytest.mark.parametrize(("model", "name", "value", "fragment"), list(_model_cases()))
def test_every_model_field_is_validated_with_its_dotted_name(model, name, value, fragment):
    with pytest.raises(ConfigError) as err:
        build_run("synthetic", model, None, [f"model.{name}={value}"])
    assert str(err.value).startswith(f"model.{name}: ") and fragment in str(err.value)


def test_the_tables_cover_every_field_of_every_section():
    sections = {"data": DataConfig, "train": TrainConfig, "eval": EvalConfig}
    own = {f"{s}.{f.name}" for s, cls in sections.items() for f in dataclasses.fields(cls)}
    assert own | {"model_name"} == set(BAD)
    model_fields = {name for fields in _model_fields().values() for name in fields}
    assert model_fields == set(MODEL_BAD), "a model field without a bad-value case (or a stale one)"
    numeric = {
        name
        for model, fields in _model_fields().items()
        for name in fields
        if typing.get_type_hints(type(model_config(model)))[name] in (int, float, str)
    }
    assert numeric <= set(RULES), "every number or choice in a model config needs a rule"


def test_choices_agree_with_the_modules_that_define_them():
    from lsan.distributed import AMP
    from lsan.models.hf import BACKBONES
    from lsan.models.item_tables import CODE_SOURCES, ITEM_TABLES, TRAIN_SCORES
    from lsan.models.layers import ATTENTION_MODES
    from lsan.models.objectives import LOSSES

    for key, choices in [("train.loss", LOSSES), ("train.amp", AMP),
                         ("attention", ATTENTION_MODES), ("item_table", ITEM_TABLES),
                         ("codes_from", CODE_SOURCES), ("train_scores", TRAIN_SCORES),
                         ("backbone", tuple(BACKBONES))]:  # fmt: skip
        assert RULES[key][1].endswith(f"(known: {', '.join(choices)})"), key
        assert all(RULES[key][0](c) for c in choices)


def test_boundary_values_are_accepted():
    run = build_run("synthetic", "caser", None, [
        "train.threads=0", "train.max_minutes=0", "data.max_len=0", "train.kd_weight=1",
        "train.kd_weight=0", "model.dropout=0", "model.n_v=0", "train.epochs=1e3",
        "train.teacher_sha256=" + "0" * 64, "train.device=cuda:1", "eval.ks=10",
    ])  # fmt: skip
    assert run.train.epochs == 1000 and run.eval.ks == (10,) and run.model.n_v == 0
    for name in _model_fields():  # every default is valid
        validate(model_config(name), "model.")


def test_direct_construction_is_validated_too():
    with pytest.raises(ConfigError, match=r"^train\.epochs: expected int, got 1\.5"):
        TrainConfig(epochs=1.5)
    with pytest.raises(ConfigError, match=r"^eval\.batch_size: must be >= 1"):
        EvalConfig(batch_size=0)
    with pytest.raises(ConfigError, match=r"^data\.min_count: expected int, got True"):
        DataConfig(min_count=True)
    assert TrainConfig(lr=1).lr == 1  # an int is a valid float


@pytest.mark.parametrize(
    "path",
    [p for p in sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.toml"))
     if not p.name.startswith("tune-")],  # tune-*.toml are search spaces (lsan tune --space)
    ids=lambda p: p.name,
)  # fmt: skip
def test_every_shipped_config_builds_a_valid_run(path):
    from lsan.models import DataInfo, build_model

    run = build_run(config_file=str(path))
    assert run.model is not None
    build_model(run.model_name, run.model, DataInfo(300, 8, 8, 12))  # tables and layers agree
