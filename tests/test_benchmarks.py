"""The benchmark suite end to end in quick mode on tiny checkpoints, plus its pure parts."""

import json
import math

import pytest
import torch
from conftest import train_tiny
from torch.utils.flop_counter import FlopCounterMode

from benchmarks import bound, report
from benchmarks.latency import interleaved, request_feeds
from benchmarks.run import SECTIONS, main
from lsan.models import DataInfo, build_model

KINDS = {"sasrec": {"dim": 16, "layers": 1}, "lsan": {"dim": 16, "m1": 0}}


@pytest.fixture(scope="module")
def suite(small_ds, tmp_path_factory):
    ckpts = []
    for name, cfg in KINDS.items():
        path = train_tiny(name, cfg, small_ds, tmp_path_factory.mktemp("ckpt") / name, epochs=1)
        ckpts.append(str(path))
    out = tmp_path_factory.mktemp("results")
    argv = ["--checkpoints", *ckpts, "--name", "ci", "--out", str(out), "--quick",
            "--formats", "fp32,int8", "--batches", "1,8", "--repeats", "8", "--warmup", "1",
            "--budget", "0.2", "--scaling-sizes", "2000,5000", "--quiet"]  # fmt: skip
    assert main(argv, ds=small_ds) == 0
    return out, json.loads((out / "ci.json").read_text())


def test_every_section_is_written(suite):
    out, res = suite
    assert set(SECTIONS) <= set(res) and res["targets"]
    env = res["env"]
    assert "benchmarks.run" in env["command"] and "commit" in env and env["utc"]
    assert {"torch", "onnxruntime", "onnx", "numpy", "python"} <= set(env["versions"])
    assert env["machine"]["cores"] >= 1 and env["machine"]["cpu"]
    for f in ("ci.md", "ci-frontier.png", "ci-latency.png", "ci-scaling.png"):
        assert (out / f).stat().st_size > 0
    md = (out / "ci.md").read_text()
    assert "## Targets" in md and ("PASS" in md or "MISS" in md)


def test_sizes(suite):
    _, res = suite
    size = {(r["model"], r["format"]): r for r in res["size"]}
    assert set(size) == {(m, f) for m in KINDS for f in ("fp32", "int8")}
    for r in size.values():
        assert r["model_bytes"] > 0 and r["artifact_bytes"] > r["model_bytes"]
        assert 0 < r["item_weights"] < r["weights"] and r["theoretical_bytes"] > 0
    assert size["sasrec", "int8"]["model_bytes"] < size["sasrec", "fp32"]["model_bytes"]
    # the compositional tables hold far fewer item-side weights than a full table
    assert size["lsan", "fp32"]["item_weights"] < size["sasrec", "fp32"]["item_weights"]


def test_latency_and_bound(suite):
    _, res = suite
    lat = res["latency"]
    assert {r["engine"] for r in lat} == {"onnxruntime", "runtime", "torch"}
    assert {r["length"] for r in lat} == {10, 12} and {r["batch"] for r in lat} == {1, 8}
    for r in lat:
        assert 0 < r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"] and r["throughput_rps"] > 0
        assert r["threads"] == (1 if r["batch"] == 1 else res["env"]["machine"]["cores"])
    rows = res["bound"]["rows"]
    assert len(rows) == 2 * len(res["size"])  # every artifact at both history lengths
    for r in rows:
        assert r["flops"] > 0 and r["bytes"] > 0
        assert 0 < r["bound_ms"] <= r["measured_p50_ms"] and r["gap"] >= 1


def test_memory(suite):
    _, res = suite
    mem = res["memory"]
    assert mem["baseline_mib"] > 0 and len(mem["rows"]) == len(res["size"])
    for r in mem["rows"]:
        assert r["peak_rss_mib"] > mem["baseline_mib"] and r["torch_imported"] is False


def test_frontier_has_the_metrics_of_each_artifact(suite):
    _, res = suite
    for r in res["frontier"]:
        assert 0 < r["ndcg10"] < 1 and r["model_bytes"] > 0
        assert r["ndcg10"] == pytest.approx(r["ndcg10_pytorch"], rel=0.05, abs=0.005)


def test_scaling(suite):
    _, res = suite
    rows = [r for r in res["scaling"] if "skipped" not in r]
    assert {r["num_items"] for r in rows} == {2000, 5000}
    assert {r["arch"].split()[0] for r in rows} == {"sasrec", "lsan"}
    for r in rows:
        assert r["bytes"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"] and r["bound_ms"] > 0
        # the file's bytes (the bound's own count of a request's reads is bytes_read)
        assert r["bytes"] != r["bytes_read"] > 0

    def item_bytes(arch, v):
        return next(r["item_weights"] for r in rows if r["arch"].startswith(arch)
                    and r["num_items"] == v and r["format"] == "fp32")  # fmt: skip

    # a full table grows linearly with |V|; the balanced tables' D-wide part does not
    assert item_bytes("sasrec", 5000) / item_bytes("sasrec", 2000) == pytest.approx(2.5, rel=0.01)
    assert item_bytes("lsan", 5000) / item_bytes("lsan", 2000) < 2.5


def test_report_rerenders_from_json(suite, tmp_path):
    out, res = suite
    (tmp_path / "again.json").write_text(json.dumps(res))
    assert report.main([str(tmp_path / "again.json")]) == 0
    assert (tmp_path / "again.md").read_text().startswith("# Benchmarks: again")
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.README_START}\nold\n{report.README_END}\nrest\n")
    report.main([str(tmp_path / "again.json"), "--readme", str(readme)])
    text = readme.read_text()
    assert "old" not in text and "| model" in text and text.endswith(f"{report.README_END}\nrest\n")


@pytest.mark.parametrize("name,cfg", [("sasrec", {"dim": 16, "layers": 2}),
                                      ("lsan", {"dim": 16, "m1": 0}), ("lsan", {"dim": 16, "m1": 2, "item_weights": True}),
                                      ("lsan_full", {"dim": 16})])  # fmt: skip
def test_flop_formula_matches_pytorch_counter(name, cfg):
    """The config formula counts what torch's FlopCounter counts in the exported form (LSAN's
    inference form), plus LSAN's element-wise fusion mix and grid scoring (which the counter
    ignores)."""
    info = DataInfo(num_items=500, num_categories=6, num_slots=9, max_len=20)
    model = build_model(name, cfg, info).eval()
    exported = model.inference_form() if name.startswith("lsan") else model
    x = [torch.from_numpy(v) for v in list(request_feeds(info, 1, 20).values())[:3]]
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        exported.score_all(*x)
    counted = counter.get_total_flops()
    formula = bound.request_flops(model, info, 20)
    extra = 0
    if name.startswith("lsan"):
        n = 1 if model.cfg.full_table else model.cfg.tables
        extra = 2 * 20 * n * 16 if n > 1 else 0  # the softmax-weighted mix of the base vectors
        if model.items is not None:
            per_cell = 2 * n if model.cfg.item_weights else n
            extra += per_cell * math.prod(model.items.sizes)
    assert formula == counted + extra


@pytest.mark.parametrize(("name", "key"), [("sasrec", "use_time"), ("lsan_full", "time_residual")])
def test_a_time_slot_table_counts_only_the_rows_a_request_reads(name, key):
    """The slot table added to the input is a lookup: a request of t positions reads at most t
    of its rows (fp32: 4 bytes a number), not the whole table."""
    info = DataInfo(num_items=500, num_categories=6, num_slots=30, max_len=20)
    base = build_model(name, {"dim": 16}, info)
    timed = build_model(name, {"dim": 16, key: True}, info)
    extra = bound.request_bytes(timed, info, 20, "fp32") - bound.request_bytes(
        base, info, 20, "fp32"
    )
    assert extra == 20 * 16 * 4


def test_bad_flags_are_one_error_line(tmp_path, capsys):
    assert main(["--checkpoints", str(tmp_path), "--name", "x", "--skip", "speed"]) == 2
    assert "unknown section speed" in capsys.readouterr().err
    assert main(["--checkpoints", str(tmp_path / "none"), "--name", "x", "--quick"]) == 2
    assert "not a checkpoint" in capsys.readouterr().err


def test_train_speed_times_every_run(tmp_path, capsys):
    from benchmarks.train_speed import main as speed_main

    out = tmp_path / "speed.json"
    assert speed_main(["--dataset", "synthetic", "--runs", "sasrec", "lsan:model.train_scores=matrix",
                       "--set", "model.dim=8", "--steps", "2", "--batch-size", "32",
                       "--out", str(out)]) == 0  # fmt: skip
    record = json.loads(out.read_text())
    assert [r["run"] for r in record["rows"]] == ["sasrec", "lsan:model.train_scores=matrix"]
    assert all(r["ms/step (median)"] > 0 for r in record["rows"])
    assert record["environment"]["command"].startswith("python -m benchmarks.train_speed")
    assert "vs sasrec" in capsys.readouterr().out


def test_the_bandwidth_curve_times_copies_not_page_faults():
    """The first copy into fresh memory pays its page faults (a 16 MiB one ran at 0.2 GB/s
    here, 150x slower than a warm copy, and made a floor of 32 ms): it is never the sample."""
    curve = bound.bandwidth_curve(16 << 20, reps_s=0.01)
    assert [c["bytes"] for c in curve] == [256 << 10, 2 << 20, 16 << 20]
    assert min(c["gb_per_s"] for c in curve) > max(c["gb_per_s"] for c in curve) / 20


def test_scaling_measures_a_low_bit_table_in_its_own_format_too(tmp_path):
    """A low-bit architecture grows to larger catalogues in fp32, int8 and its lowbit format,
    whose file stays the smallest and whose answers are timed like the others."""
    from lsan.benchmarks import scaling
    from lsan.models import DataInfo, model_config

    cfg = model_config("sasrec", {"dim": 16, "layers": 1, "bits": 2, "hot_rows": 50})
    arch = [(scaling.describe("sasrec", cfg), "sasrec", cfg, DataInfo(100, 3, 2, 10))]
    peak = {"peak_gflops_1core": 50.0, "int8_factor": 4,
            "bandwidth": [{"bytes": 1 << 30, "gb_per_s": 10.0}]}  # fmt: skip
    rows = scaling.measure(arch, [2000, 8000], tmp_path, peak, warmup=2, repeats=5,
                           budget_s=0.2, max_memory=1 << 30, log=lambda *a: None)  # fmt: skip
    assert arch[0][0] == "sasrec D=16 L=1 2-bit +50 at 4"
    share = []
    for v in (2000, 8000):
        by = {r["format"]: r for r in rows if r["num_items"] == v}
        assert set(by) == {"fp32", "int8", "lowbit"}
        assert by["lowbit"]["bytes"] < by["int8"]["bytes"] < by["fp32"]["bytes"]
        assert by["lowbit"]["p50_ms"] > 0 and by["lowbit"]["bound_ms"] > 0
        share.append(by["lowbit"]["bytes"] / by["int8"]["bytes"])
    # the table's ~2.6 bits a value against 8 take over as the catalogue grows
    assert share[1] < share[0] and share[1] < 0.5


def test_scaling_labels_tell_a_bias_and_time_apart():
    """A student and its bias stage (or SASRec with and without time slots) export different
    graphs: the scaling table names each, never two rows alike."""
    from lsan.benchmarks import scaling
    from lsan.models import model_config

    grid = {"dim": 32, "bits": 2, "hot_rows": 2500}
    labels = [
        scaling.describe(name, model_config(name, {**grid, **extra}))
        for name, extra in [
            ("sasrec", {}), ("sasrec", {"item_bias": True}), ("sasrec", {"use_time": True}),
            ("lsan_full", {"heads": 1}), ("lsan_full", {"heads": 1, "item_bias": True}),
            ("lsan_full", {"heads": 1, "time_residual": True, "item_bias": True}),
        ]
    ]  # fmt: skip
    assert len(set(labels)) == len(labels)
    assert labels[1] == "sasrec D=32 L=2 2-bit +2500 at 4 +bias"
    assert labels[5] == "lsan_full full D=32 L=1 h=1 2-bit +2500 at 4 +time residual +bias"


def test_interleaved_timing_takes_turns_and_keeps_to_its_counts():
    """Every fn is timed in turns of `block` calls (a host that slows down mid-run slows all of
    them alike), after its warm-up calls, up to `repeats` calls each."""
    calls: list[str] = []
    fns = [lambda name=name: calls.append(name) for name in "abc"]
    times = interleaved(fns, warmup=2, repeats=6, budget_s=60, block=3)
    assert [len(t) for t in times] == [6, 6, 6] and all((t >= 0).all() for t in times)
    assert "".join(calls) == "aabbcc" + "aaabbbccc" * 2
    slow = interleaved(fns, warmup=0, repeats=10**9, budget_s=0, block=1)
    assert [len(t) for t in slow] == [3, 3, 3]  # the budget spent: the 3-call minimum


def test_topk_benchmark_compares_the_two_exports(small_ds, tmp_path, capsys):
    """Above BLOCKED_FROM ids the two-stage export answers exactly as one TopK; both timed."""
    from benchmarks import topk

    ckpt = train_tiny("sasrec", KINDS["sasrec"], small_ds, tmp_path / "ck", epochs=1)
    argv = ["--checkpoints", str(ckpt), "--sizes", "40000", "--repeats", "5", "--warmup", "1",
            "--name", "t", "--out", str(tmp_path)]  # fmt: skip
    assert topk.main(argv) == 0
    record = json.loads((tmp_path / "t.json").read_text())
    (row,) = record["rows"]
    assert row["items"] == 40_000 and row["block"] == 181 and row["same answers"] is True
    assert row["one TopK p50 ms"] > 0 and row["two stages p50 ms"] > 0 and row["calls"] >= 5
    assert record["environment"]["command"] == "python -m benchmarks.topk " + " ".join(argv)
    with pytest.raises(SystemExit) as err:
        topk.main(["--checkpoints", str(tmp_path), "--sizes", "40000"])
    assert err.value.code == 2 and "not a checkpoint folder" in capsys.readouterr().err
