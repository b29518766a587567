"""The device frontier benchmark end to end on tiny checkpoints: keys, floors, comparisons."""

import json
import shutil
from types import SimpleNamespace

import pytest
from conftest import train_tiny

from lsan.benchmarks import device_frontier, floor
from lsan.benchmarks.device_frontier import RESULT_KEYS
from lsan.benchmarks.env import last_level_cache_bytes
from lsan.data.prepare import with_slot_rule

EVICT_MIB = max(2 * last_level_cache_bytes() >> 20, 8)  # twice the cache: nothing of a file left


@pytest.fixture(scope="module")
def frontier(small_ds, tmp_path_factory):
    root = tmp_path_factory.mktemp("frontier")
    big = train_tiny("sasrec", {"dim": 16, "layers": 1}, small_ds, root / "big")
    small = train_tiny("sasrec", {"dim": 8, "layers": 1}, small_ds, root / "small")
    codes = train_tiny("sasrec", {"dim": 16, "layers": 1, "item_table": "codes", "tables": 2,
                                  "code_size": 16, "own_rows": 20}, small_ds, root / "codes")  # fmt: skip
    lowbit = train_tiny("sasrec", {"dim": 16, "layers": 1, "bits": 2, "hot_rows": 20}, small_ds,
                        root / "lowbit")  # fmt: skip
    export_all = device_frontier.export_row

    def export_row(name, ckpt, formats, work, data_dir):  # the generated data, not a dataset dir
        from lsan.export.export import export

        base = device_frontier.row_base(work, name)
        export(ckpt, base, formats=tuple(formats), every_format=base, force=True, k=20,
               ds=small_ds, log=lambda *a: None)  # fmt: skip
        return device_frontier.written(base, formats)

    device_frontier.export_row = export_row
    load_all = device_frontier.dataset
    device_frontier.dataset = lambda name, data_dir, rule="auto": with_slot_rule(small_ds, rule)
    common = ["--name", "tiny", "--work", str(root / "art"), "--rounds", "2", "--formats", "fp32",
              "int8", "--reference", "big"]  # fmt: skip
    try:
        code = device_frontier.main(
            [*common, "--results", str(root / "results"), "--row", f"big={big}",
             "--row", f"small={small}", "--row", f"codes={codes}", "--row", f"lowbit={lowbit}"]
        )  # fmt: skip
        assert code == 0
        # a later run re-measures one row and carries the others over (--keep)
        shutil.copytree(root / "results", root / "kept")
        code = device_frontier.main(  # and times its cold calls after evicting the caches
            [*common, "--results", str(root / "kept"), "--keep", "--row", f"small={small}",
             "--evict-mib", str(EVICT_MIB)]
        )  # fmt: skip
    finally:
        device_frontier.export_row, device_frontier.dataset = export_all, load_all
    assert code == 0
    return root / "results"


def test_keep_carries_the_rows_a_run_does_not_measure(frontier):
    first = json.loads((frontier / "tiny.json").read_text())
    kept = json.loads((frontier.parent / "kept" / "tiny.json").read_text())
    assert sorted((r["name"], r["format"]) for r in kept) == sorted(
        (r["name"], r["format"]) for r in first
    )
    for r in kept:
        old = next(o for o in first if (o["name"], o["format"]) == (r["name"], r["format"]))
        if r["name"] == "small":  # measured again: its own latency and no carried mark
            assert "carried" not in r["context"] and r["p50_ms"] != old["p50_ms"]
            assert r["context"]["evict_mib"] == EVICT_MIB  # its cold calls found nothing cached
        else:  # as it was, marked with the commit that measured it
            assert r["context"]["carried"] == old["commit"] and r["p50_ms"] == old["p50_ms"]
            assert r["context"]["frontier_command"] == old["context"]["frontier_command"]
            assert r["context"]["evict_mib"] == 0
    md = (frontier.parent / "kept" / "tiny.md").read_text()
    assert "carried over" in md and f"after reading through {EVICT_MIB} MiB (--evict-mib)" in md
    assert "Warning:" not in md  # evicted: the cold column is cold
    assert "ms for a one-node graph called cold" in md  # what any evicted call pays first
    # speeds are compared only within one interleaved run: measured with measured, carried
    # with the rows of its own run
    runs = {f"{r['name']} {r['format']}": r["context"].get("carried") for r in kept}
    compared = [r for r in kept if r["context"]["fastest_sasrec_as_accurate"]]
    assert compared and any("carried" not in r["context"] for r in compared)
    for r in compared:
        assert runs[r["context"]["fastest_sasrec_as_accurate"]] == r["context"].get("carried")
    # the latency table names a carried row with its run's commit and sets no speed ratio
    # against a reference timed in another run
    md = (frontier.parent / "kept" / "tiny.md").read_text()
    lat = md[md.index("| artifact | format | cold") :].splitlines()[2:]
    lat = [line.split(" | ") for line in lat if line.startswith("| ")]
    commit = next(r["context"]["carried"] for r in kept if r["name"] == "big")[:7]
    assert {c[0] for c in lat} == {"| small"} | {
        f"| {n} ({commit})" for n in ("big", "codes", "lowbit")
    }
    assert all(c[9] == "–" for c in lat if c[0] == "| small")  # big (the reference) was carried
    assert any(c[9] != "–" for c in lat if c[0] != "| small")


def test_every_artifact_has_the_fixed_keys_and_a_floor(frontier):
    rows = json.loads((frontier / "tiny.json").read_text())
    assert len(rows) == 9  # 4 rows x 2 formats, and the low-bit row's own format
    lowbit = [r for r in rows if r["name"] == "lowbit"]
    assert sorted(r["format"] for r in lowbit) == ["fp32", "int8", "lowbit"]
    assert all(r["item_table"] == "lowbit D=16 2-bit +20 at 4-bit" for r in lowbit)
    # "a smaller D" is a full-table SASRec, never a compressed table; the speed comparator is
    # any SASRec file at least as accurate, the low-bit SASRec student included
    models = {f"{r['name']} {r['format']}": r["model"] for r in rows}
    ndcg = {f"{r['name']} {r['format']}": r["test_ndcg10"] for r in rows}
    within = [r["context"].get("best_sasrec_within_bytes") or "" for r in rows]
    assert not [w for w in within if w.startswith(("lowbit", "codes"))]
    for r in rows:
        fast = r["context"].get("fastest_sasrec_as_accurate")
        if fast:
            assert models[fast] == "sasrec" and ndcg[fast] >= r["test_ndcg10"]
    for r in rows:
        assert list(r)[: len(RESULT_KEYS)] == list(RESULT_KEYS)
        c = r["context"]
        assert 0 < c["floor_ms"] < r["p50_ms"] * 10 and c["nodes"] > 10 and c["flops"] > 0
        assert c["cold"]["p50"] <= c["cold"]["p99"] and c["warm"]["p50"] == r["p50_ms"]
        assert r["artifact_bytes"] > r["model_onnx_bytes"] > 0
        assert c["peak_rss_mib"] > c["rss_over_import_mib"] > 0
        # the machine, commit and command of the run that measured it, beside its figures
        env = c["environment"]
        assert env["machine"]["cores"] >= 1 and env["machine"]["cpu"]
        assert env["command"] == c["frontier_command"] and env["commit"] == r["commit"]
    codes = [r for r in rows if r["name"] == "codes"]
    assert all(r["item_table"] == "codes 2x16 (popularity) +20 own" for r in codes)
    md = (frontier / "tiny.md").read_text()
    assert "fastest SASRec as accurate" in md and "warm p50 / floor" in md and "peak RSS" in md
    assert "us per graph node" in md  # the host's speed during this run, beside its latencies
    assert f"Measured on {rows[0]['context']['environment']['machine']['cpu']}" in md
    assert (frontier / "tiny.png").stat().st_size > 10_000


def test_every_measured_artifact_is_compared_with_the_reference_user_by_user(frontier):
    rows = json.loads((frontier / "tiny.json").read_text())
    ref = next(r for r in rows if r["name"] == "big" and r["format"] == "fp32")
    assert ref["context"]["paired_vs_reference"]["delta"] == 0.0  # itself, exactly
    for r in rows:
        d = r["context"]["paired_vs_reference"]
        assert d["users"] > 100 and 0.0 <= d["p_value"] <= 1.0
        # the mean of the per-user differences is the difference of the two files' NDCG@10
        assert d["delta"] == pytest.approx(r["test_ndcg10"] - ref["test_ndcg10"], abs=1e-9)
        assert d["ci95"][0] <= d["delta"] <= d["ci95"][1]
    assert "paired difference [95% CI]" in (frontier / "tiny.md").read_text()


def test_the_floor_counts_what_a_request_reads():
    """A lookup reads its rows, a product its whole weight; the per-node cost is measurable."""
    assert 0 < floor.per_node_seconds() < 1e-4
    work = {"nodes": 10, "bytes_read": 1 << 20, "flops": 10**6}
    ref = {"per_node_us": 1.0, "peak_gflops_1core": 100.0, "int8_factor": 4,
           "bandwidth": [{"bytes": 1 << 30, "gb_per_s": 10.0}]}  # fmt: skip
    got = floor.floor(work, ref, int8=False)
    assert got["overhead_us"] == pytest.approx(10.0)
    assert got["memory_us"] == pytest.approx((1 << 20) / 10e9 * 1e6)
    assert got["floor_ms"] == pytest.approx((10.0 + max(got["memory_us"], 10.0)) / 1000)


def test_a_reference_point_is_the_warm_host_not_its_idle_clock():
    """A host that answers 10x slower for its first 0.2 s of work (an idle core ramping its
    clock) gives the warm cost: the floor's reference points must not move with idle time."""
    import time

    class Ramping:  # busy-waits: 200 us a call for 0.2 s after creation, then 20 us
        def __init__(self):
            self.born = time.perf_counter()

        def run(self, outputs, feeds):
            now = time.perf_counter()
            end = now + (200e-6 if now - self.born < 0.2 else 20e-6)
            while time.perf_counter() < end:
                pass

    assert 20e-6 <= floor._median_call(Ramping(), {}, n=50, warm_s=0.3) < 60e-6
    # without the warm-up the same host reads its idle clock: the test tells the two apart
    assert floor._median_call(Ramping(), {}, n=50, warm_s=0.0, blocks=1) >= 200e-6


def test_the_floor_counts_a_fused_attention_as_its_two_products(tmp_path):
    """MultiHeadAttention (what the export emits) is q k^T and weights v: 4 B Tq T W FLOPs."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def inp(name, shape, kind=TensorProto.FLOAT):
        return helper.make_tensor_value_info(name, kind, shape)

    weight = numpy_helper.from_array(np.ones((8, 4), np.float32), "w")
    nodes = [
        helper.make_node(
            "MultiHeadAttention", ["q", "kv", "kv"], ["y"], domain="com.microsoft", num_heads=2
        ),  # fmt: skip
        helper.make_node("MatMul", ["y", "w"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [inp("q", [1, 3, 8]), inp("kv", [1, 5, 8]), inp("items", [1, 5], 7)],
        [inp("out", [1, 3, 4])], [weight],
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 9
    onnx.save(model, tmp_path / "m.onnx")
    feeds = {"q": np.ones((1, 3, 8), np.float32), "kv": np.ones((1, 5, 8), np.float32),
             "items": np.ones((1, 5), np.int64)}  # fmt: skip
    work = floor.graph_work(tmp_path / "m.onnx", feeds)
    assert work["flops"] == 4 * 3 * 8 * 5 + 2 * 3 * 4 * 8


def test_a_row_never_takes_another_rows_artifact_for_a_format(tmp_path):
    """Row `a` and row `a-lowbit`: `a`'s lowbit folder would be `a-lowbit`, the other row's."""
    for name in ("a", "a-lowbit"):
        base = device_frontier.row_base(tmp_path, name)
        for folder in (base, base.with_name(f"{base.name}-int8")):
            folder.mkdir()
            (folder / "manifest.json").write_text("{}")
    found = device_frontier.written(device_frontier.row_base(tmp_path, "a"), ["int8"])
    assert found == {}  # emptied before its export, and nothing of row a-lowbit
    base = device_frontier.row_base(tmp_path, "a")
    (base.with_name("a-int8")).mkdir()
    (base.with_name("a-int8") / "manifest.json").write_text("{}")
    assert device_frontier.written(base, ["int8"]) == {"int8": base.with_name("a-int8")}


def exported(frontier):
    """Two of the frontier's exported folders by name, and the --artifact flags naming them."""
    art = frontier.parent / "art"
    files = {"big-int8": art / "big" / "big-int8", "lowbit": art / "lowbit" / "lowbit-lowbit"}
    return files, [a for n, f in files.items() for a in ("--artifact", f"{n}={f}")]


def test_rotation_times_exported_folders_without_evaluating_them(frontier, tmp_path, capsys):
    """benchmarks.rotation: the frontier's interleaved timing and floors for existing folders."""
    from lsan.benchmarks import rotation

    files, args = exported(frontier)
    assert rotation.main([*args, "--runs", "2", "--rounds", "2", "--name", "rot",
                          "--out", str(tmp_path)]) == 0  # fmt: skip
    rec = json.loads((tmp_path / "rot.json").read_text())
    assert rec["environment"]["command"].startswith("python -m benchmarks.rotation --artifact")
    assert rec["environment"]["commit"] and rec["environment"]["machine"]["cores"] >= 1
    assert len(rec["runs"]) == 2 and all(set(r) == set(files) for r in rec["runs"])
    for run in rec["runs"]:
        for t in run.values():
            assert 0 < t["cold"]["p50"] <= t["cold"]["p99"] and t["warm"]["p50"] > 0
    for row in rec["table"]:
        work = rec["floors"][row["artifact"]]
        assert work["nodes"] > 10 and work["floor_ms"] > 0 and row["nodes"] == work["nodes"]
        assert row["runs"] == 2 and 0 <= row["runs_cold_within_target"] <= 2
        warm = [r[row["artifact"]]["warm"]["p50"] for r in rec["runs"]]
        assert (row["warm_p50_min"], row["warm_p50_max"]) == (min(warm), max(warm))
        assert row["cold_p50_min"] <= row["cold_p50_max"] <= row["cold_p99_max"]
    out = capsys.readouterr()
    assert "| artifact" in out.out and "us per graph node" in out.out and "run 2 of 2" in out.out
    assert "cold p50 <= 0.25 ms" in out.out and " of 2 runs" in out.out
    assert "called cold" not in out.out and "cold_one_node_ms" not in rec["floors"]["_reference"]
    # two tiny files fit any last-level cache: the record and stderr say their cold is not cold
    if rec["environment"]["machine"]["last_level_cache_bytes"]:
        assert "cold column is not cold" in rec["cold_caveat"] and "warning:" in out.err


def test_rotation_evicts_the_caches_before_each_cold_call_when_asked(
    frontier, tmp_path, capsys, monkeypatch
):
    """--evict-mib: a buffer (twice the last-level cache here) read through before every cold
    call, so even two tiny files are cold: no caveat. Which calls follow an eviction is
    test_every_cold_call_and_no_warm_one_follows_an_eviction's; here, that rotation asks."""
    from lsan.benchmarks import rotation
    from lsan.benchmarks.env import last_level_cache_bytes

    evictions: list[int] = []
    real = device_frontier.evictor

    def evictor(nbytes):
        evict = real(nbytes)
        return lambda: (evictions.append(nbytes), evict())

    monkeypatch.setattr(device_frontier, "evictor", evictor)

    art = frontier.parent / "art"
    mib = max(2 * last_level_cache_bytes() >> 20, 8)
    args = ["--artifact", f"big-int8={art / 'big' / 'big-int8'}", "--artifact",
            f"lowbit={art / 'lowbit' / 'lowbit-lowbit'}", "--runs", "1", "--rounds", "2",
            "--evict-mib", str(mib), "--name", "evicted", "--out", str(tmp_path)]  # fmt: skip
    assert rotation.main(args) == 0
    rec = json.loads((tmp_path / "evicted.json").read_text())
    assert rec["evict_mib"] == mib and rec["cold_caveat"] is None
    printed = capsys.readouterr()
    assert "warning:" not in printed.err
    # rounds x calls x artifacts, then the reference point: a one-node graph called cold after
    # the same eviction, what any cold call pays before its graph's own work
    assert evictions == [mib << 20] * (2 * 20 * 2 + floor.COLD_CALLS)
    cold = rec["floors"]["_reference"]["cold_one_node_ms"]
    assert 0 < cold < max(r["cold_p50_max"] for r in rec["table"])  # medians of other calls
    assert f"{cold:.3f} ms for a one-node graph called cold" in printed.out
    with pytest.raises(SystemExit) as e:
        rotation.main([*args[:4], "--evict-mib", "-1"])
    assert e.value.code == 2 and "--evict-mib 0 or more" in capsys.readouterr().err


def test_ort_format_converts_checks_and_times_each_artifact(frontier, tmp_path, capsys):
    """benchmarks.ort_format: the reduced-build file (folded: the decoded weights, more bytes,
    the same answers and about the same speed) and the unfolded one, beside model.onnx."""
    import onnxruntime as ort

    from lsan.benchmarks import ort_format

    art = frontier.parent / "art"
    files = {"int8": art / "big" / "big-int8", "lowbit": art / "lowbit" / "lowbit-lowbit"}
    args = [a for n, f in files.items() for a in ("--artifact", f"{n}={f}")]
    keep = tmp_path / "kept"
    assert ort_format.main([*args, "--rounds", "2", "--requests", "8", "--keep", str(keep),
                            "--name", "ortf", "--out", str(tmp_path)]) == 0  # fmt: skip
    rec = json.loads((tmp_path / "ortf.json").read_text())
    assert rec["environment"]["command"].startswith("python -m benchmarks.ort_format --artifact")
    rows = {(r["artifact"], r["variant"]): r for r in rec["rows"]}
    assert set(rows) == {(n, v) for n in files for v in ort_format.VARIANTS}
    for (name, variant), r in rows.items():
        onnx_bytes = (files[name] / "model.onnx").stat().st_size
        assert r["model_bytes"] == round(r["x_onnx_bytes"] * onnx_bytes) and r["warm_p50_ms"] > 0
        assert 0 < r["deflate_bytes"] < r["model_bytes"] and r["excluded_agree"]
        assert r["load_ms"] > 0 and r["rss_over_import_mib"] > 0
        assert r["max_abs_score_diff"] <= 1e-4 and r["top_k_identical"] == 1.0, (name, variant)
        if variant == "onnx":
            assert r["operators"] is None and r["x_onnx_warm"] == 1.0
        else:  # what a reduced build must include to load the file, and the file loads
            assert any("TopK" in line for line in r["operators"])
            sub = "ort" if variant == "ort" else "raw"
            ort.InferenceSession(str(keep / name / sub / "model.ort"))
    # folding decoded the 2-bit grid and the 4-bit encoder into the file
    assert rows["lowbit", "ort"]["model_bytes"] > 2 * rows["lowbit", "onnx"]["model_bytes"]
    out = capsys.readouterr().out
    assert "| artifact" in out and "ort-unoptimized" in out and "identical top-K" in out
    with pytest.raises(SystemExit) as e:
        ort_format.main([*args[:2], "--requests", "0"])
    assert e.value.code == 2


def test_frontier_refuses_a_negative_eviction(capsys):
    assert device_frontier.main(["--name", "x", "--row", "a=b", "--evict-mib", "-1"]) == 2
    assert "--evict-mib must be 0 or more" in capsys.readouterr().err


def test_the_cold_caveat_compares_the_bytes_read_with_the_cache():
    work = {"a": {"bytes_read": 600_000}, "b": {"bytes_read": 500_000}, "_reference": {}}
    assert "the 2 files read 1.10 MB" in device_frontier.cold_caveat(work, 2 << 20)
    assert device_frontier.cold_caveat(work, 1 << 20) is None  # they outgrow it: cold is cold
    assert device_frontier.cold_caveat(work, 0) is None  # an unknown cache: no claim either way
    assert device_frontier.cold_caveat(work, 2 << 20, evict_bytes=4 << 20) is None  # evicted


@pytest.mark.parametrize(
    "spec, message",
    [("nonsense", "NAME=FOLDER"), ("x=/nonexistent", "no model.onnx"), ("=/tmp", "NAME=FOLDER")],
)
def test_rotation_refuses_a_bad_artifact_in_one_line(spec, message, capsys):
    from lsan.benchmarks import rotation

    with pytest.raises(SystemExit) as e:
        rotation.main(["--artifact", spec])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_pareto_front_keeps_only_files_nothing_beats_on_bytes_and_accuracy():
    rows = [(300, 0.60), (100, 0.50), (150, 0.40), (200, 0.55), (200, 0.60), (400, 0.70),
            (90, 0.30)]  # fmt: skip
    points = [{"artifact_bytes": b, "test_ndcg10": n} for b, n in rows]
    front = device_frontier.pareto(points)
    # 150 is beaten by 100; 200/0.55 by 200/0.60; 300 only ties 200's accuracy with more bytes
    assert [(p["artifact_bytes"], p["test_ndcg10"]) for p in front] == [
        (90, 0.30), (100, 0.50), (200, 0.60), (400, 0.70),
    ]  # fmt: skip
    assert device_frontier.pareto([]) == []


def test_plot_only_redraws_the_picture_from_the_results_and_measures_nothing(frontier, capsys):
    stored = (frontier / "tiny.json").read_text()
    (frontier / "tiny.png").unlink()
    args = ["--name", "tiny", "--results", str(frontier), "--reference", "big"]
    assert device_frontier.main([*args, "--plot-only"]) == 0
    assert (frontier / "tiny.png").stat().st_size > 10_000
    assert (frontier / "tiny.json").read_text() == stored  # nothing measured or rewritten
    no_ref = ["--name", "tiny", "--results", str(frontier), "--reference", "absent"]
    assert device_frontier.main([*no_ref, "--plot-only"]) == 0  # no target lines, still a picture
    assert device_frontier.main(["--name", "none", "--results", str(frontier), "--plot-only"]) == 2
    assert "no results at" in capsys.readouterr().err
    assert device_frontier.main(args) == 2  # a measuring run needs rows
    assert "--row" in capsys.readouterr().err


def test_speed_is_judged_against_the_fastest_sasrec_file_of_any_table():
    def point(name, model, table, nbytes, ndcg, ms):
        return {"name": name, "model": model, "item_table": table, "format": "x",
                "artifact_bytes": nbytes, "model_onnx_bytes": nbytes, "test_ndcg10": ndcg,
                "p50_ms": ms}  # fmt: skip

    lsan = point("lsan", "lsan_full", "lowbit D=32", 150, 0.050, 0.10)
    points = [
        point("ref", "sasrec", "full D=64", 3000, 0.055, 0.30),
        point("small", "sasrec", "full D=8", 120, 0.030, 0.05),
        point("lowbit", "sasrec", "lowbit D=32", 160, 0.052, 0.12),
        point("slow", "sasrec", "full D=32", 1000, 0.051, 0.20),
        lsan,
    ]
    device_frontier.compare(points, "ref")
    # the low-bit SASRec is the fastest SASRec at least as accurate; "a smaller D" stays full
    assert lsan["fastest_sasrec_as_accurate"] == "lowbit x"
    assert lsan["speedup_vs_that_sasrec"] == pytest.approx(1.2)
    assert lsan["best_sasrec_within_bytes"] == "small x"


def test_every_cold_call_and_no_warm_one_follows_an_eviction(monkeypatch):
    """The order of the interleaved run, with sessions that only record (not a timing test)."""
    events: list[str] = []
    info = SimpleNamespace(num_items=30, num_categories=3, num_slots=4, max_len=6)

    class Session:
        def __init__(self, key: str) -> None:
            self.key = key

        def run(self, outputs, feeds):
            events.append(self.key)

    arts = {k: SimpleNamespace(meta=SimpleNamespace(info=info), session=Session(k)) for k in "ab"}
    made: list[int] = []

    def evictor(nbytes):
        made.append(nbytes)
        return lambda: events.append("evict")

    monkeypatch.setattr(device_frontier, "evictor", evictor)
    times = device_frontier.timings(arts, rounds=2, calls=3, evict_bytes=1 << 20)
    assert made == [1 << 20] and set(times) == {"a", "b"}
    runs = [e for e in events if e != "evict"]
    assert runs == ["a"] * 5 + ["b"] * 5 + (["a", "b"] * 3 + ["a"] * 3 + ["b"] * 3) * 2
    timed = events[events.index("evict") :]  # after the untimed warm-up calls
    cold_block = ["evict", "a", "evict", "b"] * 3 + ["a"] * 3 + ["b"] * 3
    assert timed == cold_block * 2
    assert all(len(t) == 3 for t in times["a"].values())  # p50, p95, p99 of cold and warm alike


def test_split_cuts_each_file_at_h_into_encoder_and_scoring(frontier, tmp_path, capsys):
    """benchmarks.split: the two halves of each graph, timed beside the whole; the scoring half
    reproduces the whole graph's top-K (checked inside, or the run is an argument error)."""
    import onnx

    from lsan.artifact import read
    from lsan.benchmarks import split
    from lsan.benchmarks.latency import request_feeds

    files, args = exported(frontier)
    assert split.main([*args, "--runs", "2", "--repeats", "5", "--name", "cut",
                       "--out", str(tmp_path)]) == 0  # fmt: skip
    rec = json.loads((tmp_path / "cut.json").read_text())
    assert rec["environment"]["command"].startswith("python -m benchmarks.split --artifact")
    assert len(rec["runs"]) == 2 and [r["artifact"] for r in rec["table"]] == list(files)
    for row in rec["table"]:
        n = row["nodes"]
        assert 0 < n["encoder"] < n["whole"] and 0 < n["scoring"] < n["whole"]
        for part in ("whole", "encoder", "scoring"):
            assert 0 < row[f"{part}_p50_min"] <= row[f"{part}_p50_max"]
        assert 0 < row["scoring_share_min"] <= row["scoring_share_max"]
    assert "scoring share" in capsys.readouterr().out
    # the halves' inputs: the history for the encoder, h and the exclusions for the scoring
    model = onnx.load(files["lowbit"] / "model.onnx")
    h = split.hidden_name(model)
    cut = split.halves(files["lowbit"] / "model.onnx",
                       request_feeds(read(files["lowbit"]).meta.info, 1, 8))  # fmt: skip
    names = {k: [i.name for i in s[0].get_inputs()] for k, s in cut["sessions"].items()}
    assert names["encoder"] == ["items", "cats", "slots"] and names["scoring"] == [h, "exclude"]
    # a graph with no layer norm has no h to cut at (main makes it one error line)
    del model.graph.node[:]
    onnx.save(model, tmp_path / "bare.onnx")
    with pytest.raises(ValueError, match="no LayerNormalization"):
        split.halves(tmp_path / "bare.onnx", {})
