import json

import pytest
import torch

from lsan.checkpoint import CheckpointError, load_model
from lsan.config import DataConfig, EvalConfig, RunConfig, TrainConfig
from lsan.evaluate import evaluate
from lsan.models import model_config
from lsan.train import train

TINY = {"dim": 32, "layers": 1, "heads": 1, "dropout": 0.1}


def run_cfg(model="sasrec", dataset="synthetic", **train_kw):
    tc = TrainConfig(
        **{"epochs": 20, "batch_size": 64, "patience": 100, "device": "cpu", "lr": 3e-3, **train_kw}
    )
    return RunConfig(
        data=DataConfig(dataset=dataset, max_len=20),
        model_name=model,
        model=model_config(model, TINY if model == "sasrec" else {}),
        train=tc,
    )


@pytest.fixture(scope="module")
def trained(small_ds, tmp_path_factory):
    out = tmp_path_factory.mktemp("sasrec")
    pop = train(run_cfg("pop"), tmp_path_factory.mktemp("pop"), progress=False, ds=small_ds)
    res = train(run_cfg(), out, progress=False, ds=small_ds)
    return out, res, pop


def test_sasrec_beats_popularity_on_planted_sequences(trained):
    _, res, pop = trained
    assert res["test"]["NDCG@10"] > 1.5 * pop["test"]["NDCG@10"]
    assert res["test"]["HR@10"] > pop["test"]["HR@10"] + 0.05


def test_checkpoint_roundtrip_gives_identical_scores(trained, small_ds):
    out, res, _ = trained
    assert {p.name for p in out.iterdir()} >= {
        "model.pt",
        "config.json",
        "metrics.json",
        "dataset.json",
        "train_log.jsonl",
        "trainer_state.pt",
    }
    torch.load(out / "model.pt", weights_only=True)  # tensors only
    from lsan.checkpoint import save_config, save_tensors
    from lsan.models import build_model

    a, run, info = load_model(out)
    torch.manual_seed(1)  # a model in memory, with weights unlike the checkpoint's
    m = build_model(run.model_name, run.model, info).eval()
    copy = out.with_name(out.name + "-roundtrip")
    save_config(copy, run, info)
    save_tensors(copy / "model.pt", m.state_dict())
    b, _, _ = load_model(copy)  # saved and loaded back: the same scores, not the first checkpoint's
    items = torch.randint(1, info.num_items + 1, (4, info.max_len))
    with torch.no_grad():
        assert torch.equal(m.score_all(items, items, items), b.score_all(items, items, items))
        assert not torch.allclose(
            a.score_all(items, items, items), b.score_all(items, items, items)
        )
    again = evaluate(a, small_ds, "test", info.max_len, EvalConfig(), torch.device("cpu"))
    assert again == pytest.approx(json.loads((out / "metrics.json").read_text())["test"])
    assert len((out / "train_log.jsonl").read_text().splitlines()) == res["epochs"] == 20
    assert json.loads((out / "dataset.json").read_text())["raw_item_ids"][0] == -1


def test_resume_continues_exactly(small_ds, tmp_path):
    straight = train(run_cfg(epochs=4), tmp_path / "a", progress=False, ds=small_ds)
    train(run_cfg(epochs=2), tmp_path / "b", progress=False, ds=small_ds)
    resumed = train(run_cfg(epochs=4), tmp_path / "b", resume=True, progress=False, ds=small_ds)
    assert resumed["epochs"] == 4
    assert resumed["valid"] == pytest.approx(straight["valid"], abs=1e-6)
    wa = torch.load(tmp_path / "a" / "model.pt", weights_only=True)
    wb = torch.load(tmp_path / "b" / "model.pt", weights_only=True)
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)


def test_weight_average_is_what_is_kept_and_resumes_exactly(small_ds, tmp_path):
    """train.ema: the average is evaluated and saved (not the live weights), and a resumed run
    carries it on exactly."""
    straight = train(run_cfg(epochs=3, ema=0.9), tmp_path / "a", progress=False, ds=small_ds)
    train(run_cfg(epochs=2, ema=0.9), tmp_path / "b", progress=False, ds=small_ds)
    resumed = train(run_cfg(epochs=3, ema=0.9), tmp_path / "b", resume=True, progress=False,
                    ds=small_ds)  # fmt: skip
    assert resumed["valid"] == pytest.approx(straight["valid"], abs=1e-6)
    kept = torch.load(tmp_path / "a" / "model.pt", weights_only=True)
    state = torch.load(tmp_path / "a" / "trainer_state.pt", weights_only=True)
    assert straight["best_epoch"] == 3  # lr 3e-3 on the synthetic data still improves
    averaged = {k[len("module.") :]: v for k, v in state["ema"].items() if k.startswith("module.")}
    assert all(torch.equal(kept[k], averaged[k]) for k in kept)
    assert not all(torch.equal(kept[k], state["model"][k]) for k in kept)
    wb = torch.load(tmp_path / "b" / "model.pt", weights_only=True)
    assert all(torch.allclose(kept[k], wb[k], atol=1e-6) for k in kept)


def test_early_stopping_stops(small_ds, tmp_path):
    res = train(run_cfg(epochs=50, patience=1, lr=0.5), tmp_path, progress=False, ds=small_ds)
    assert res["epochs"] < 50


def test_missing_checkpoint_is_clear(tmp_path):
    with pytest.raises(CheckpointError, match="not a checkpoint directory"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text("{broken")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_model(tmp_path)


@pytest.mark.slow
def test_sasrec_beats_popularity_on_ml100k(shared_data, tmp_path):
    data = DataConfig(dataset="ml-100k", data_dir=str(shared_data))
    pop = train(
        RunConfig(data=data, model_name="pop", model=model_config("pop")),
        tmp_path / "p",
        progress=False,
    )
    run = RunConfig(
        data=data,
        model_name="sasrec",
        model=model_config("sasrec"),
        train=TrainConfig(epochs=15, device="cpu", lr=2e-3),
    )
    res = train(run, tmp_path / "s", progress=False)
    assert pop["test"]["NDCG@10"] > 0.03  # popularity is a real floor on ML-100K
    assert res["test"]["NDCG@10"] > 1.3 * pop["test"]["NDCG@10"]
