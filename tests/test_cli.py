import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from lsan.cli import main

FAST = [
    "--set",
    "train.epochs=1",
    "--set",
    "model.dim=16",
    "--set",
    "model.layers=1",
    "--device",
    "cpu",
]


def test_train_then_evaluate_matches_metrics(tmp_path, capsys):
    out = tmp_path / "ck"
    assert (
        main(
            [
                "train",
                "--dataset",
                "synthetic",
                "--model",
                "sasrec",
                *FAST,
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    assert "NDCG@10" in capsys.readouterr().out
    assert main(["evaluate", str(out), "--json", "--device", "cpu"]) == 0
    shown = json.loads(capsys.readouterr().out)
    saved = json.loads((out / "metrics.json").read_text())
    assert shown["NDCG@10"] == saved["test"]["NDCG@10"] and shown["mask_seen"] is True
    assert (
        main(["evaluate", str(out), "--split", "valid", "--no-mask-seen", "--device", "cpu"]) == 0
    )
    assert "mask_seen=False" in capsys.readouterr().out
    # the same checkpoint against itself: no difference, on every user; against a popularity
    # model trained on the same data: a paired difference whose mean is the NDCG@10 gap
    pop = tmp_path / "pop"
    argv = ["train", "--dataset", "synthetic", "--model", "pop", "--out", str(pop), "--quiet"]
    assert main(argv) == 0
    capsys.readouterr()
    argv = ["evaluate", str(out), "--against", str(out), "--against", str(pop), "--json"]
    assert main([*argv, "--segments", "--device", "cpu"]) == 0
    got = json.loads(capsys.readouterr().out)
    same, vs_pop = got["against"]
    # --segments: per-segment NDCG@10 of each checkpoint and the paired differences, whose
    # user-weighted sum over a partition is the whole split's
    history = [r for r in got["segments"] if r["partition"] == "history"]
    assert sum(r["users"] for r in history) == shown["users"]
    pop_gap = sum(r["users"] * r["first_minus"][1]["delta"] for r in history)  # as listed
    assert pop_gap / shown["users"] == pytest.approx(shown["NDCG@10"] - vs_pop["NDCG@10"], abs=1e-9)
    assert all(r["first_minus"][0]["delta"] == 0.0 for r in got["segments"] if r["users"] > 1)
    assert same["first_minus_this_ndcg10"]["delta"] == 0.0
    d = vs_pop["first_minus_this_ndcg10"]
    assert d["delta"] == pytest.approx(shown["NDCG@10"] - vs_pop["NDCG@10"], abs=1e-9)
    assert d["ci95"][0] <= d["delta"] <= d["ci95"][1] and d["users"] == shown["users"]
    assert main(["evaluate", str(out), "--against", str(pop), "--segments", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert "first minus this, NDCG@10 [95% CI]" in printed
    assert "by segment of the users" in printed and "| #1 minus #2" in printed
    argv = ["report", str(out), str(tmp_path / "missing"), "--name", "r", "--out", str(tmp_path)]
    assert main(argv) == 0
    (row,) = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert row["NDCG@10"] == saved["test"]["NDCG@10"] and row["command"].startswith("lsan train")
    assert "| ck " in (tmp_path / "r.md").read_text()


def test_evaluate_against_a_checkpoint_of_another_slot_rule(tmp_path, capsys):
    """Paired over the same users, each checkpoint sees its own time slots: the "gap" one and
    the default one each score as they do alone, whichever goes first."""
    runs = {}
    for rule in ("auto", "gap"):
        runs[rule] = tmp_path / rule
        argv = ["train", "--dataset", "synthetic", "--model", "lsan_full", *FAST,
                "--set", f"data.slot_rule={rule}", "--out", str(runs[rule]), "--quiet"]  # fmt: skip
        assert main(argv) == 0
    capsys.readouterr()
    alone = {r: json.loads((runs[r] / "metrics.json").read_text())["test"]["NDCG@10"] for r in runs}
    assert json.loads((runs["gap"] / "dataset.json").read_text())["slot_rule"] == "gap"
    for first, other in (("gap", "auto"), ("auto", "gap")):
        argv = ["evaluate", str(runs[first]), "--against", str(runs[other]), "--json"]
        assert main([*argv, "--device", "cpu"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["NDCG@10"] == alone[first]
        assert shown["against"][0]["NDCG@10"] == alone[other]
    # two checkpoints joined by a comma are one ranker (a recipe's seeds): their mean metrics,
    # each user's NDCG@10 averaged over them before pairing, so pooled minus one = half the gap
    both = f"{runs['auto']},{runs['gap']}"
    assert main(["evaluate", both, "--against", str(runs["gap"]), "--json", "--device", "cpu"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["checkpoints"] == [str(runs["auto"]), str(runs["gap"])]
    assert shown["NDCG@10"] == pytest.approx((alone["auto"] + alone["gap"]) / 2, abs=1e-12)
    d = shown["against"][0]["first_minus_this_ndcg10"]["delta"]
    assert d == pytest.approx((alone["auto"] - alone["gap"]) / 2, abs=1e-12)
    assert main(["evaluate", str(runs["gap"]), "--against", both, "--device", "cpu"]) == 0
    assert "a row of comma-joined checkpoints" in capsys.readouterr().out
    for bad, why in ((",", "names no checkpoint"), (f"{runs['gap']},{tmp_path / 'nope'}", "nope")):
        assert main(["evaluate", bad, "--device", "cpu"]) == 2
        assert why in capsys.readouterr().err


def test_demo_prints_side_by_side_table(tmp_path, capsys):
    assert (
        main(
            [
                "demo",
                "--epochs",
                "1",
                "--quiet",
                "--no-bench",
                "--out",
                str(tmp_path),
                "--set",
                "model.dim=16",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "| pop " in out and "| sasrec " in out and "| lsan " in out and "artifact bytes" in out
    assert (tmp_path / "results.md").is_file() and (tmp_path / "sasrec" / "model.pt").is_file()
    for model in ("sasrec", "lsan"):
        assert (tmp_path / "artifacts" / model / "model.onnx").is_file()


def test_user_errors_are_one_line(tmp_path, capsys):
    cases = [
        ["evaluate", str(tmp_path)],
        ["train", "--dataset", "synthetic", "--set", "model.nope=1", "--out", str(tmp_path / "x")],
        [
            "train",
            "--dataset",
            "synthetic",
            "--config",
            str(tmp_path / "missing.toml"),
            "--out",
            str(tmp_path),
        ],
        [
            "train",
            "--dataset",
            "synthetic",
            "--device",
            "cuda:7",
            *FAST[:2],
            "--out",
            str(tmp_path / "y"),
        ],
    ]
    for argv in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0], (
            argv,
            err,
        )


# ---------------------------------------------------------------- unusable inputs: one line, exit 2


class Payload:
    """A pickle that would create `marker` when unpickled without weights_only."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert "Traceback" not in err[0]
    return err[0]


def _snapshot(folder: Path) -> dict[str, tuple[int, int, bytes]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(folder.iterdir())}  # fmt: skip


TRAIN = ["train", "--dataset", "synthetic", "--model", "sasrec", *FAST, "--quiet"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A 1-epoch SASRec checkpoint trained through the CLI (copied by each test that changes it)."""
    out = tmp_path_factory.mktemp("finished") / "ck"
    assert main([*TRAIN, "--out", str(out)]) == 0
    return out


@pytest.fixture
def ckpt(finished, tmp_path) -> Path:
    out = tmp_path / "ck"
    shutil.copytree(finished, out)
    return out


def _weights_of(name: str, values: dict, ckpt: Path) -> dict:
    from lsan.checkpoint import read_config
    from lsan.models import build_model, model_config

    _, info = read_config(ckpt)
    return build_model(name, model_config(name, values), info).state_dict()


@pytest.mark.parametrize(
    "case", ["malicious", "truncated", "empty", "other model", "other size", "not a dict"]
)
def test_unloadable_model_pt_is_one_line_for_evaluate_and_export(ckpt, tmp_path, capsys, case):
    weights = ckpt / "model.pt"
    marker = tmp_path / "executed"
    if case == "malicious":
        torch.save({"w": Payload(marker)}, weights)
    elif case == "truncated":
        weights.write_bytes(weights.read_bytes()[:200])
    elif case == "empty":
        weights.write_bytes(b"")
    elif case == "other model":
        torch.save(_weights_of("lsan", {"dim": 16}, ckpt), weights)
    elif case == "other size":
        torch.save(_weights_of("sasrec", {"dim": 32, "layers": 1}, ckpt), weights)
    else:
        torch.save([torch.zeros(2)], weights)
    reason = {"malicious": "not a tensor-only checkpoint: refused", "truncated": "truncated",
              "empty": "truncated", "other model": "weights of another model",
              "other size": "weights of another size", "not a dict": "not a state dict"}[case]  # fmt: skip
    assert main(["evaluate", str(ckpt), "--device", "cpu"]) == 2
    line = _one_error_line(capsys)
    assert f"{weights}: " in line and reason in line, line
    assert main(["export", str(ckpt), "--out", str(tmp_path / "art"), "--no-eval"]) == 2
    line = _one_error_line(capsys)
    assert f"{weights}: " in line and reason in line, line
    assert not marker.exists()  # the pickle's code never ran
    assert not (tmp_path / "art").exists()


def test_debug_adds_the_traceback(ckpt, capsys):
    (ckpt / "model.pt").write_bytes(b"")
    assert main(["--debug", "evaluate", str(ckpt), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("error: ")
    assert main(["evaluate", str(ckpt), "--device", "cpu", "--debug"]) == 2  # anywhere on the line
    assert "Traceback" in capsys.readouterr().err


RESUME_REFUSALS = {
    "changed dim": (["--set", "model.dim=32"], "model.dim: stored 16, requested 32"),
    "other model": (["--model", "lsan"], "model_name: stored 'sasrec', requested 'lsan'"),
    "changed lr": (["--set", "train.lr=0.5"], "train.lr: stored 0.001, requested 0.5"),
    "added teacher": (
        ["--teacher", "{teacher}"],
        "train.teacher: stored '', requested '{teacher}'",
    ),
    "malicious state": ([], "trainer_state.pt: not a tensor-only checkpoint: refused"),
    "truncated state": ([], "trainer_state.pt: truncated or not a torch checkpoint"),
    "state of another size": ([], "trainer_state.pt: weights of another size"),
    "state without progress": ([], "trainer_state.pt: lacks the trainer state"),
    "malicious model.pt": ([], "model.pt: not a tensor-only checkpoint: refused"),
    "corrupt log": ([], "train_log.jsonl:2: not a JSON line"),
}


@pytest.mark.parametrize("case", list(RESUME_REFUSALS))
def test_refused_resume_changes_nothing_on_disk(ckpt, finished, tmp_path, capsys, case):
    extra, reason = RESUME_REFUSALS[case]
    extra = [a.format(teacher=finished) for a in extra]  # a real checkpoint as the teacher
    reason = reason.format(teacher=finished)
    state = ckpt / "trainer_state.pt"
    marker = tmp_path / "executed"
    if case == "malicious state":
        torch.save({"model": Payload(marker)}, state)
    elif case == "truncated state":
        state.write_bytes(state.read_bytes()[:300])
    elif case == "state of another size":
        saved = torch.load(state, weights_only=True)
        torch.save(saved | {"model": _weights_of("sasrec", {"dim": 32, "layers": 1}, ckpt)}, state)
    elif case == "state without progress":
        torch.save({"model": torch.load(state, weights_only=True)["model"]}, state)
    elif case == "malicious model.pt":
        torch.save({"w": Payload(marker)}, ckpt / "model.pt")
    elif case == "corrupt log":
        with open(ckpt / "train_log.jsonl", "a") as fh:
            fh.write("{half a line\n")
    before = _snapshot(ckpt)
    argv = [*TRAIN, "--out", str(ckpt), "--resume", "--set", "train.epochs=2", *extra]
    assert main(argv) == 2
    line = _one_error_line(capsys)
    assert reason in line, line
    assert str(ckpt) in line
    assert _snapshot(ckpt) == before  # config.json, model.pt, the log: untouched
    assert not marker.exists()


def test_resume_may_change_the_run_length(ckpt, capsys):
    argv = [*TRAIN, "--out", str(ckpt), "--resume", "--set", "train.epochs=2",
            "--set", "train.patience=3", "--set", "train.max_minutes=5"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    assert len((ckpt / "train_log.jsonl").read_text().splitlines()) == 2
    assert json.loads((ckpt / "config.json").read_text())["run"]["train"]["epochs"] == 2
    capsys.readouterr()
    assert main(["evaluate", str(ckpt), "--device", "cpu"]) == 0


def test_evaluate_refuses_a_dataset_that_changed_shape(ckpt, capsys):
    config = json.loads((ckpt / "config.json").read_text())
    config["info"]["num_categories"] += 5  # as if the category rule had changed
    (ckpt / "config.json").write_text(json.dumps(config))
    assert main(["evaluate", str(ckpt), "--device", "cpu"]) == 2
    line = _one_error_line(capsys)
    assert f"{ckpt / 'config.json'}: " in line and "categories" in line


def test_bad_settings_are_one_line_naming_the_setting(tmp_path, capsys):
    for setting, reason in [("train.epochs=1.5", "train.epochs: cannot read '1.5' as int"),
                            ("train.threads=-3", "train.threads: must be >= 0"),
                            ("model.dim=-5", "model.dim: must be >= 1"),
                            ("model.dim=0", "model.dim: must be >= 1"),
                            ("train.batch_size=0", "train.batch_size: must be >= 1")]:  # fmt: skip
        out = tmp_path / setting
        assert main([*TRAIN, "--set", setting, "--out", str(out)]) == 2
        assert reason in _one_error_line(capsys)
        assert not out.exists()


def _u_item(n: int) -> str:
    return "".join(f"{i}|Movie {i}|01-Jan-1995||http://example.invalid/{i}|" + "|".join(
        "1" if g == i % 19 else "0" for g in range(19)) + "\n" for i in range(1, n + 1))  # fmt: skip


TOO_BIG = str(2**64 + 7)  # above int64 (and uint64)


@pytest.mark.parametrize(
    ("dataset", "files", "bad_file", "reason"),
    [
        ("ml-100k", {"ml-100k/u.data": f"1\t1\t5\t874965758\n2\t{TOO_BIG}\t3\t876893171\n",
                     "ml-100k/u.item": _u_item(3)}, "ml-100k/u.data", f"u.data:2: {TOO_BIG} does not fit"),
        ("ml-100k", {"ml-100k/u.data": "1\t1\t5\t874965758\n2\tx\t3\t876893171\n",
                     "ml-100k/u.item": _u_item(3)}, "ml-100k/u.data", "u.data:2: expected integers"),
        ("ml-1m", {"ml-1m/ratings.dat": f"1::1::5::978300760\n{TOO_BIG}::2::3::978300761\n"},
         "ml-1m/ratings.dat", f"ratings.dat:2: {TOO_BIG} does not fit"),
        ("lastfm", {"lastfm/s3rec/LastFM.txt": f"1 10 11 12\n2 10 {TOO_BIG} 13\n"},
         "lastfm/s3rec/LastFM.txt", f"LastFM.txt:2: {TOO_BIG} does not fit"),
        ("lastfm", {"lastfm/s3rec/LastFM.txt": "1 10 11 12\n",
                    "lastfm/s3rec/LastFM_item2attributes.json": f'{{"10": [{TOO_BIG}]}}'},
         "lastfm/s3rec/LastFM_item2attributes.json", "does not fit in 64 bits"),
        ("video", {"video/sasrec/Video.txt": f"1 1\n1 {TOO_BIG}\n"}, "video/sasrec/Video.txt",
         f"Video.txt:2: {TOO_BIG} does not fit"),
    ],
)  # fmt: skip
def test_bad_ids_in_data_files_are_one_line(tmp_path, capsys, dataset, files, bad_file, reason):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    argv = ["data", "stats", "--dataset", dataset, "--data-dir", str(tmp_path)]
    assert main([*argv, "--cache-dir", str(tmp_path / "cache")]) == 2
    line = _one_error_line(capsys)
    assert f"{tmp_path / bad_file}" in line and reason in line, line


def test_a_config_without_a_dataset_says_it_trains_on_generated_data(tmp_path, capsys):
    """--data-dir beside a config that names no dataset is the trap of configs/lsan-balanced.toml:
    the run is told, before it trains, that the generated data is what it trains on."""
    cfg = tmp_path / "pop.toml"
    cfg.write_text('model_name = "pop"\n')
    argv = ["train", "--config", str(cfg), "--out", str(tmp_path / "a"), "--quiet"]
    assert main([*argv, "--data-dir", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "training on the generated 'synthetic' data; --data-dir is not read" in err
    argv[4] = str(tmp_path / "b")
    assert main(argv) == 0
    assert "generated" not in capsys.readouterr().err
