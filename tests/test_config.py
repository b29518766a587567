import json

import pytest

from lsan.cli import build_run
from lsan.config import ConfigError, RunConfig, TrainConfig, override, parse_sets, read_config_file
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
    cfg = override(RunConfig(), {"eval": {"mask_seen": "false", "ks": "1,5"}})
    assert cfg.eval.mask_seen is False and cfg.eval.ks == (1, 5)


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
