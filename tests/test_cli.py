import json

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
    argv = ["report", str(out), str(tmp_path / "missing"), "--name", "r", "--out", str(tmp_path)]
    assert main(argv) == 0
    (row,) = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert row["NDCG@10"] == saved["test"]["NDCG@10"] and row["command"].startswith("lsan train")
    assert "| ck " in (tmp_path / "r.md").read_text()


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
        assert (tmp_path / model / "artifact" / "model.onnx").is_file()


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
