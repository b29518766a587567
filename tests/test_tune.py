"""`lsan tune`: the space file, and a real 2-trial Ray Tune search with ASHA on generated data."""

import json

import pytest

from lsan.cli import main
from lsan.config import ConfigError, RunConfig
from lsan.models import model_config
from lsan.tune import apply, check, read_space

SPACE = """
max_epochs = 2
grace_period = 1
reduction_factor = 2

[params]
"model.dim" = { choice = [8, 16] }
"train.lr" = { loguniform = [1e-3, 1e-2] }
"model.heads" = 1
"""


def test_space_file_is_validated(tmp_path):
    good = tmp_path / "space.toml"
    good.write_text(SPACE)
    space = read_space(good)
    assert space.max_epochs == 2 and space.params["model.heads"] == 1
    for text, message in [
        ("[params]\n", "at least one parameter"),
        ('[params]\n"model.dim" = { normal = [1, 2] }\n', "exactly one of"),
        ('[params]\n"train.lr" = { uniform = [1] }\n', r"\[low, high\]"),
        ('scheduler = "bohb"\n[params]\n"model.dim" = 8\n', "asha or fifo"),
        ('max_epoch = 3\n[params]\n"model.dim" = 8\n', "unknown setting"),
        ("[params\n", "cannot parse"),
    ]:
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(ConfigError, match=message):
            read_space(bad)
    with pytest.raises(ConfigError, match="not found"):
        read_space(tmp_path / "missing.toml")
    base = RunConfig(model_name="sasrec", model=model_config("sasrec"))
    for text, message in [('[params]\n"model.dimm" = { choice = [8] }\n', "unknown setting"),
                          ('[params]\n"train.lr" = { loguniform = [0, 1] }\n', "positive")]:  # fmt: skip
        bad.write_text(text)
        with pytest.raises(ConfigError, match=message):
            check(base, read_space(bad))


def test_apply_coerces_dotted_params_like_set():
    base = RunConfig(model_name="sasrec", model=model_config("sasrec", {"layers": 1}))
    run = apply(base, {"model.dim": 32, "train.lr": 0.005, "model.dropout": "0.1"})
    assert run.model.dim == 32 and run.model.layers == 1 and run.model.dropout == 0.1
    assert run.train.lr == 0.005
    with pytest.raises(ConfigError, match="unknown setting"):
        apply(base, {"model.nosuch": 1})


def test_two_trial_search_finishes_and_retrains_the_best(small_ds, tmp_path, monkeypatch, capsys):
    pytest.importorskip("ray.tune")
    import ray

    space = tmp_path / "space.toml"
    space.write_text(SPACE)
    monkeypatch.setattr("lsan.cli.load_configured", lambda *a, **k: small_ds)
    out = tmp_path / "tune"
    try:
        code = main([
            "tune", "--dataset", "synthetic", "--model", "sasrec", "--space", str(space),
            "--trials", "2", "--set", "data.max_len=12", "--set", "train.epochs=2",
            "--set", "model.layers=1", "--out", str(out), "--device", "cpu", "--quiet",
        ])  # fmt: skip
    finally:
        ray.shutdown()
    assert code == 0, capsys.readouterr().err
    trials = json.loads((out / "trials.json").read_text())
    assert len(trials) == 2
    assert all(t["model.dim"] in (8, 16) and 1e-3 <= t["train.lr"] <= 1e-2 for t in trials)
    assert all(0 < t["best valid NDCG@10"] <= 1 and 1 <= t["epochs"] <= 2 for t in trials)
    best = json.loads((out / "best.json").read_text())
    scores = [t["best valid NDCG@10"] for t in trials]
    assert scores == sorted(scores, reverse=True)  # best first
    assert best["params"]["model.dim"] == trials[0]["model.dim"]
    assert best["run"]["model"]["dim"] == trials[0]["model.dim"]
    metrics = json.loads((out / "best" / "metrics.json").read_text())
    assert metrics["test"]["users"] == small_ds.num_users
    assert "best valid NDCG@10" in (out / "trials.md").read_text()
