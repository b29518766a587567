"""The device frontier: every artifact's total bytes against its test NDCG@10, measured on the file.

    python -m benchmarks.device_frontier --name frontier-beauty --data-dir ../shared/data \\
        --row sasrec-d64=runs/beauty-sasrec-d64 --row sasrec-d16=runs/beauty-sasrec-d16 \\
        --row device=runs/beauty-device --formats fp32 int8 int4 --reference sasrec-d64

Each row's checkpoint is exported once per format through the one export path (the same graph
fixes for every model, so optimised is compared with optimised); test HR/NDCG@10 come from
onnxruntime on that exact file (export's own verification), bytes are every file shipped
(`artifact_bytes`) beside model.onnx alone. Latency: batch 1, full history, 1 thread, cold
(one call per artifact in turn; with `--evict-mib N` each after reading through N MiB, so that
files which together fit the last-level cache are timed cold too) and warm (blocks of calls)
p50/p95/p99 over interleaved rounds; `p50_ms` is the warm p50. Beside it the floor computed from the graph (benchmarks.floor), the
speed against the fastest SASRec artifact that is at least as accurate (any item table, low-bit
students included) and was timed in the same run (a carried row's latency belongs to another run's host state), and memory: the peak
resident set of a fresh process that loads the artifact as the server does and answers requests
(benchmarks.memory; `rss_over_import_mib` is its rise over that process after its imports, so
what the model and its session hold at their peak). For every artifact the table names the best
SASRec artifact that fits in the same bytes, so "compression" is judged against simply using a
smaller SASRec. Writes `<name>.json` (a list, one object per artifact with the keys the
device-frontier issue fixes, plus a `context` object), `<name>.md` and `<name>.png` in --results.

--keep carries over the rows of the existing `<name>.json` that this run does not measure (a
checkpoint that no longer exists, a row too long to retrain): their figures and commit stay as
they were, `context.carried` says so, and their latencies come from their own interleaved run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lsan.artifact import DEFAULT_K, read
from lsan.benchmarks.env import environment
from lsan.benchmarks.latency import request_feeds
from lsan.paired import shown

RESULT_KEYS = ("name", "model", "item_table", "teacher", "format", "artifact_bytes",
               "model_onnx_bytes", "test_ndcg10", "test_hr10", "p50_ms", "epochs", "command",
               "commit")  # fmt: skip


def export_row(
    name: str, ckpt: Path, formats: list[str], work: Path, data_dir: str
) -> dict[str, Path]:
    """Export `ckpt` in every format (one ONNX graph, one PyTorch evaluation); folder per format.

    Always exported again: artifacts left in `work` by an earlier run carry no mark of the
    exporter that wrote them, and reusing them measured an old export as the current one."""
    from lsan.export.export import export

    base = row_base(work, name)
    export(ckpt, base, quant="auto", formats=tuple(formats), every_format=base, force=True,
           data_dir=data_dir, log=lambda *a: print(f"[{name}]", *a, file=sys.stderr))  # fmt: skip
    return written(base, formats)


def row_base(work: Path, name: str) -> Path:
    """The base folder of row `name`'s artifacts, in a folder of its own, emptied first: the
    formats are written beside the base as `<base>-<format>`, so in one shared folder a row
    named `lsan-full` took row `lsan-full-lowbit`'s artifact for its own `lowbit` format."""
    shutil.rmtree(work / name, ignore_errors=True)
    (work / name).mkdir(parents=True)
    return work / name / name


def written(base: Path, formats: list[str]) -> dict[str, Path]:
    """The artifact folder of each format exported beside `base`, with those `auto` adds for
    the checkpoint (lowbit for a low-bit table)."""
    from lsan.export.quantize import TABLE_FORMATS

    folders = {f: base.with_name(f"{base.name}-{f}") for f in (*formats, *TABLE_FORMATS)}
    return {f: p for f, p in folders.items() if (p / "manifest.json").is_file()}


def evictor(nbytes: int) -> Callable[[], None]:
    """A call that reads through `nbytes` (nothing for 0), untimed before each cold call. The
    buffer is written once, so its pages are real, not the shared zero page; reading leaves its
    lines clean, nothing to write back later."""
    scratch = np.ones(max(nbytes, 0) // 8)

    def evict() -> None:
        if scratch.size:
            scratch.sum()

    return evict


def timings(
    arts: dict[str, Any], rounds: int = 20, calls: int = 20, evict_bytes: int = 0
) -> dict[str, dict]:
    """Batch-1 full-history latency of every artifact, interleaved, in ms.

    cold: one call per artifact in turn (each call finds the caches holding the other
    artifacts' weights, as a device serving several models or doing other work would); warm:
    blocks of `calls` calls per artifact in turn. p50/p95/p99 of each, over `rounds` rounds.
    `evict_bytes` > 0: before every cold call (untimed) a buffer that large is read through, so the
    call finds its weights in memory, not in the caches, however few and small the files are.
    """
    evict = evictor(evict_bytes)
    x = {}
    for key, a in arts.items():
        x[key] = request_feeds(a.meta.info, batch=1, length=a.meta.info.max_len)
        for _ in range(5):
            a.session.run(["top_items"], x[key])
    cold: dict[str, list[float]] = {key: [] for key in arts}
    warm: dict[str, list[float]] = {key: [] for key in arts}
    for _ in range(rounds):
        for _ in range(calls):
            for key, a in arts.items():
                evict()
                t0 = time.perf_counter()
                a.session.run(["top_items", "top_scores"], x[key])
                cold[key].append(time.perf_counter() - t0)
        for key, a in arts.items():
            for _ in range(calls):
                t0 = time.perf_counter()
                a.session.run(["top_items", "top_scores"], x[key])
                warm[key].append(time.perf_counter() - t0)

    def pcts(t: list[float]) -> dict[str, float]:
        ms = np.asarray(t) * 1000
        return {f"p{q}": float(np.percentile(ms, q)) for q in (50, 95, 99)}

    return {key: {"cold": pcts(cold[key]), "warm": pcts(warm[key])} for key in arts}


def floors(
    arts: dict[str, Any], folders: dict[str, Path], k: int, evict_bytes: int = 0
) -> dict[str, dict]:
    """Each artifact's graph work and floor (benchmarks.floor), one set of reference points
    (with `evict_bytes`, a one-node graph's cold call after the same eviction among them)."""
    from lsan.benchmarks import floor

    some = next(iter(arts.values())).meta.info
    evict = evictor(evict_bytes) if evict_bytes > 0 else None
    ref = floor.references(some.num_items + 1, k, 64 << 20, evict)
    out = {}
    for key, a in arts.items():
        x = request_feeds(a.meta.info, batch=1, length=a.meta.info.max_len)
        work = floor.graph_work(folders[key] / "model.onnx", x)
        out[key] = work | floor.floor(work, ref, a.meta.quantization.startswith("int8"))
    out["_reference"] = {k: v for k, v in ref.items() if k != "bandwidth"}
    return out


def cold_caveat(work: dict[str, dict], cache_bytes: int, evict_bytes: int = 0) -> str | None:
    """A warning when the timed files' constant bytes read by one request each, summed, fit in
    the last-level cache (`cache_bytes`, 0 = unknown) and nothing evicted it (`evict_bytes`):
    then a rotation's "cold" calls find every file's weights cached and the cold column
    measures nothing cold. None otherwise."""
    files = {k: w for k, w in work.items() if not k.startswith("_")}
    total = sum(w["bytes_read"] for w in files.values())
    if not cache_bytes or total > cache_bytes or evict_bytes >= cache_bytes:
        return None
    return (f"the {len(files)} files read {total / 1e6:.2f} MB a round together, within this CPU's "
            f"{cache_bytes / (1 << 20):.0f} MiB last-level cache: their cold calls find the "
            "weights cached, so the cold column is not cold (time more or larger files together, "
            "or evict the caches before each cold call: --evict-mib)")  # fmt: skip


def warn_if_cached(
    work: dict[str, dict], machine: dict[str, Any], evict_bytes: int = 0
) -> str | None:
    """`cold_caveat` on the run's recorded machine, printed to stderr when there is one."""
    caveat = cold_caveat(work, machine["last_level_cache_bytes"], evict_bytes)
    if caveat:
        print(f"warning: {caveat}", file=sys.stderr)
    return caveat


def memory(folders: dict[str, Path], requests: int = 20) -> dict[str, dict]:
    """Peak RSS of a fresh serving process per artifact (on a device, what the OS must grant)."""
    from lsan.benchmarks.memory import peak_rss

    out = {}
    for key, folder in folders.items():
        r = peak_rss(folder, requests)
        out[key] = {"peak_rss_mib": r["peak_rss_mib"],
                    "rss_over_import_mib": r["peak_rss_mib"] - r["after_import_mib"]}  # fmt: skip
    return out


def dataset(name: str, data_dir: str, slot_rule: str = "auto") -> Any:
    """The prepared dataset the artifacts were trained on (their test split is compared)."""
    from lsan.data.prepare import load_dataset

    return load_dataset(name, data_dir, slot_rule=slot_rule)


def paired_with_reference(
    arts: dict[str, Any], points: list[dict[str, Any]], reference: str, data_dir: str
) -> None:
    """Per artifact measured in this run, its test NDCG@10 minus the reference fp32 file's,
    user by user (lsan/paired.py): the difference, its 95% bootstrap interval, the paired
    t-test's p-value, under `paired_vs_reference`. Nothing when the reference is not measured."""
    from lsan.export.verify import file_ranks
    from lsan.paired import paired

    ref_key = f"{reference}/fp32"
    if ref_key not in arts:
        return
    by_rule: dict[str, Any] = {}  # the same users and items; the time slots by each file's rule

    def ranks(a: Any) -> np.ndarray:
        m = a.meta
        if m.time_slot_rule not in by_rule:
            by_rule[m.time_slot_rule] = dataset(m.dataset, data_dir, m.time_slot_rule)
        ds = by_rule[m.time_slot_rule]
        return file_ranks(a.session, ds, m.info.max_len, m.contract.k, m.batch_invariant)

    ref = ranks(arts[ref_key])
    for p in points:
        key = f"{p['name']}/{p['format']}"
        if key in arts:  # the reference against itself is exactly 0: not ranked a second time
            mine = ref if key == ref_key else ranks(arts[key])
            p["paired_vs_reference"] = paired(mine, ref).as_dict()


def describe_row(name: str, ckpt: Path, fmt: str, meta: Any) -> dict[str, Any]:
    metrics = json.loads((ckpt / "metrics.json").read_text())
    cfg = meta.hyperparameters
    test = meta.test_metrics or {}
    teacher = (metrics.get("teacher") or {}).get("path") or None
    return {
        "name": name, "model": meta.model, "item_table": item_table(cfg), "teacher": teacher,
        "format": fmt, "artifact_bytes": meta.artifact_bytes,
        "model_onnx_bytes": meta.model_onnx_bytes, "test_ndcg10": test.get("NDCG@10"),
        "test_hr10": test.get("HR@10"), "epochs": metrics.get("epochs"),
        "command": metrics.get("command", ""), "dim": cfg.get("dim"),
    }  # fmt: skip


def item_table(cfg: dict[str, Any]) -> str:
    kind = cfg.get("item_table", "full")
    if kind == "qr":
        return f"qr N={cfg['tables']} " + ("balanced" if cfg["m1"] == 0 else f"m1={cfg['m1']}")
    if kind in ("codes", "pq"):
        own = f" +{cfg['own_rows']} own" if cfg.get("own_rows") else ""
        return f"{kind} {cfg['tables']}x{cfg['code_size']} ({cfg['codes_from']}){own}"
    bias = " +bias" if cfg.get("item_bias") else ""  # model.item_bias: an output bias per item
    if cfg.get("bits"):  # not a plain SASRec baseline: its table was trained on a low-bit grid
        hot = f" +{cfg['hot_rows']} at {cfg['hot_bits']}-bit" if cfg.get("hot_rows") else ""
        return f"lowbit D={cfg.get('dim')} {cfg['bits']}-bit{hot}{bias}"
    return f"full D={cfg.get('dim')}{bias}"


def reference_row(points: list[dict[str, Any]], reference: str) -> dict[str, Any] | None:
    """The reference row's fp32 file (100% of the bytes), if this run or its carried rows have it."""
    return next((p for p in points if p["name"] == reference and p["format"] == "fp32"), None)


def compare(points: list[dict[str, Any]], reference: str) -> None:
    """Add, per point: share of the reference's bytes, NDCG vs the reference, best SASRec <= bytes."""
    ref = reference_row(points, reference)
    # "use a smaller D": the full-table SASRecs; every SASRec artifact, low-bit ones included,
    # for speed, so that LSAN's speed is judged against the strongest SASRec file there is
    scored = [p for p in points if p["model"] == "sasrec" and p["test_ndcg10"] is not None]
    sasrec = [p for p in scored if p["item_table"].startswith("full")]
    for p in points:
        if ref is not None:
            p["bytes_vs_reference"] = p["artifact_bytes"] / ref["model_onnx_bytes"]
            if p["test_ndcg10"] is not None and ref["test_ndcg10"]:
                p["ndcg10_vs_reference"] = p["test_ndcg10"] / ref["test_ndcg10"]
        fits = [s for s in sasrec if s["artifact_bytes"] <= p["artifact_bytes"] and s is not p]
        best = max(fits, key=lambda s: s["test_ndcg10"], default=None)
        p["best_sasrec_within_bytes"] = f"{best['name']} {best['format']}" if best else None
        if best is not None and p["test_ndcg10"] is not None and best["test_ndcg10"]:
            p["vs_best_sasrec_within_bytes"] = p["test_ndcg10"] / best["test_ndcg10"] - 1
        # speed against the fastest SASRec artifact at least as accurate (optimised vs optimised)
        # and timed in the same interleaved run: a carried row's latency is of another host state
        if p["test_ndcg10"] is not None:
            good = [s for s in scored if s["test_ndcg10"] >= p["test_ndcg10"] and s is not p
                    and s.get("carried") == p.get("carried")]  # fmt: skip
            fast = min(good, key=lambda s: s["p50_ms"], default=None)
            p["fastest_sasrec_as_accurate"] = f"{fast['name']} {fast['format']}" if fast else None
            p["speedup_vs_that_sasrec"] = fast["p50_ms"] / p["p50_ms"] if fast else None


def row_name(p: dict[str, Any]) -> str:
    """A row's name as the tables show it: a carried row with the commit of its run."""
    return p["name"] + (f" ({p['carried'][:7]})" if p.get("carried") else "")


def table(points: list[dict[str, Any]], reference: str) -> str:
    head = ("| artifact | model | item table | teacher | format | total bytes | % of "
            f"{reference} fp32 | NDCG@10 | HR@10 | vs {reference} fp32 | paired difference [95% CI]"
            " | best SASRec in these bytes | vs it | p50 ms | epochs |\n|" + "---|" * 15 + "\n")  # fmt: skip

    def pct(v, signed=False):
        return "–" if v is None else (f"{v:+.1%}" if signed else f"{v:.1%}")

    lines = []
    for p in sorted(points, key=lambda p: p["artifact_bytes"]):
        ndcg = "–" if p["test_ndcg10"] is None else f"{p['test_ndcg10']:.4f}"
        hr = "–" if p["test_hr10"] is None else f"{p['test_hr10']:.4f}"
        rel = p.get("ndcg10_vs_reference")
        lines.append(
            f"| {row_name(p)} | {p['model']} | {p['item_table']} | {'yes' if p['teacher'] else '–'} "
            f"| {p['format']} | {p['artifact_bytes']:,} | {pct(p.get('bytes_vs_reference'))} "
            f"| {ndcg} | {hr} | {pct(None if rel is None else rel - 1, True)} "
            f"| {shown(p['paired_vs_reference']) if p.get('paired_vs_reference') else '–'} "
            f"| {p['best_sasrec_within_bytes'] or '–'} "
            f"| {pct(p.get('vs_best_sasrec_within_bytes'), True)} | {p['p50_ms']:.3f} | {p['epochs']} |"
        )
    return head + "\n".join(lines) + "\n"


def latency_table(points: list[dict[str, Any]], reference: str) -> str:
    """Cold and warm percentiles, the floor from the graph, and speed against the fastest SASRec
    artifact that is at least as accurate (and against the reference's fp32 file), each
    compared only with rows timed in the same run."""
    ref = reference_row(points, reference)
    head = ("| artifact | format | cold p50 / p95 / p99 ms | warm p50 / p95 / p99 ms | nodes "
            "| MFLOP | KB read | floor ms | warm p50 / floor | vs " + reference + " fp32 "
            "| fastest SASRec as accurate | speed vs it | peak RSS MiB (over imports) |\n|"
            + "---|" * 13 + "\n")  # fmt: skip
    lines = []
    for p in sorted(points, key=lambda p: p["p50_ms"]):
        c, w = p["cold"], p["warm"]
        # the reference's latency is of one run too: no ratio across two host states
        same_run = ref is not None and ref.get("carried") == p.get("carried")
        vs_ref = f"{ref['p50_ms'] / p['p50_ms']:.2f}x" if same_run else "–"
        speed = p.get("speedup_vs_that_sasrec")
        rss = p.get("peak_rss_mib")  # rows carried from runs before it was measured have none
        mem = "–" if rss is None else f"{rss:.1f} ({p['rss_over_import_mib']:.1f})"
        lines.append(
            f"| {row_name(p)} | {p['format']} | {c['p50']:.3f} / {c['p95']:.3f} / {c['p99']:.3f} "
            f"| {w['p50']:.3f} / {w['p95']:.3f} / {w['p99']:.3f} | {p['nodes']} "
            f"| {p['flops'] / 1e6:.1f} | {p['bytes_read'] / 1e3:,.0f} | {p['floor_ms']:.3f} "
            f"| {p['p50_ms'] / p['floor_ms']:.1f}x | {vs_ref} "
            f"| {p.get('fastest_sasrec_as_accurate') or '–'} "
            f"| {'–' if speed is None else f'{speed:.2f}x'} | {mem} |"
        )
    return head + "\n".join(lines) + "\n"


def host_line(ref: dict[str, Any], k: int, machine: dict[str, Any]) -> str:
    """This run's machine and measured reference points: the host's speed while it ran (it
    drifts by tens of percent between runs on a shared machine, so compare latencies within
    one run)."""
    return (
        f"\nMeasured on {machine['cpu']} ({machine['cores']} cores). Reference points measured "
        f"in this run (the floor's): {reference_points(ref, k)}.\n"
    )


def reference_points(ref: dict[str, Any], k: int) -> str:
    """The reference points of `floors` in words (the cold one only where it was measured)."""
    cold = ref.get("cold_one_node_ms")
    return (
        f"{ref['per_node_us']:.2f} us per graph node, {ref['topk_us']:.1f} us for a top-{k} over "
        f"the catalogue, {ref['peak_gflops_1core']:.0f} GFLOP/s one core"
        + (f", {cold:.3f} ms for a one-node graph called cold" if cold is not None else "")
    )


MARKERS = {"fp32": "o", "fp16": "s", "int8": "^", "int8-static": "v", "int4": "D", "lowbit": "*",
           "lowbit8": "P"}  # fmt: skip
FAMILIES = {"sasrec": "SASRec", "lsan_full": "LSAN_full (twin block, full table)",
            "lsan": "LSAN as published (compositional tables)"}  # fmt: skip


def pareto(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points no other point beats on both axes: fewer or equal bytes and higher NDCG@10
    (a tie in NDCG keeps the smaller file), in order of bytes."""
    best, front = -1.0, []
    for p in sorted(points, key=lambda p: (p["artifact_bytes"], -p["test_ndcg10"])):
        if p["test_ndcg10"] > best:
            front.append(p)
            best = p["test_ndcg10"]
    return front


def zoom_bytes(points: list[dict[str, Any]], ref: dict[str, Any] | None) -> float:
    """How far the zoomed panel reaches: 10% of the reference's model.onnx bytes, or twice the
    smallest file within 98% of its NDCG@10 where that is further (a small catalogue's encoder
    alone can pass 10%: on ML-100K the smallest such file is 17% of it, so the zoom reaches 34%)."""
    if ref is None:
        return float("inf")
    near = [p["artifact_bytes"] for p in points if p["test_ndcg10"] >= 0.98 * ref["test_ndcg10"]]
    return max(0.10 * ref["model_onnx_bytes"], 2 * min(near, default=0))


def plot(points: list[dict[str, Any]], path: Path, title: str, reference: str = "") -> None:
    """Bytes against accuracy, one colour per model family with its Pareto front drawn; the
    right panel zooms into the device region (`zoom_bytes`) and names the front's files, where
    the left one would be a pile of labels."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    shown = [p for p in points if p["test_ndcg10"] is not None]
    ref = reference_row(shown, reference)
    fig = Figure(figsize=(13, 5.5), layout="constrained")
    whole, zoom = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.25]})
    families = sorted({p["model"] for p in shown}, key=lambda m: list(FAMILIES).index(m)
                      if m in FAMILIES else len(FAMILIES))  # fmt: skip
    colours = {m: f"C{i}" for i, m in enumerate(families)}
    budget = zoom_bytes(shown, ref)
    labels: list[Any] = []  # the zoom's names, placed apart once its limits are set
    fixed: list[Any] = []
    region = [p for p in shown if p["artifact_bytes"] <= budget]
    for ax in (whole, zoom):
        pts = shown if ax is whole else region
        for m in families:
            mine = [p for p in pts if p["model"] == m]
            for p in mine:
                ax.scatter(p["artifact_bytes"], p["test_ndcg10"], color=colours[m], alpha=0.45,
                           s=22, marker=MARKERS.get(p["format"], "o"), linewidths=0)  # fmt: skip
            front = pareto(mine)
            if front:
                ax.step([p["artifact_bytes"] for p in front], [p["test_ndcg10"] for p in front],
                        where="post", color=colours[m], lw=1.4,
                        label=f"{FAMILIES.get(m, m)}: Pareto front")  # fmt: skip
            if ax is zoom:
                for p in front:
                    name = row_name(p) + ("" if p["format"] == "lowbit" else f" {p['format']}")
                    labels.append(ax.text(p["artifact_bytes"], p["test_ndcg10"], name,
                                          fontsize=7, color=colours[m]))  # fmt: skip
        if ref is not None:  # the device target: 5% of the reference's bytes at its accuracy
            ax.axvline(0.05 * ref["model_onnx_bytes"], color="grey", ls="--", lw=0.8)
            ax.axhline(ref["test_ndcg10"], color="grey", ls="--", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("artifact bytes, every file shipped (log scale)")
        ax.grid(alpha=0.3, which="both")
    if ref is not None:
        whole.annotate(f"{reference} fp32", (ref["artifact_bytes"], ref["test_ndcg10"]),
                       fontsize=7, xytext=(-60, 6), textcoords="offset points")  # fmt: skip
        good = [p["test_ndcg10"] for p in region if p["test_ndcg10"] >= 0.8 * ref["test_ndcg10"]]
        if good:  # the decisions happen near the reference's accuracy: leave the collapsed out
            zoom.set_ylim(min(good) - 0.001, max(max(good), ref["test_ndcg10"]) + 0.001)
        fixed = [  # the names keep off these
            zoom.text(0.05 * ref["model_onnx_bytes"], zoom.get_ylim()[0], " 5% of its bytes",
                      fontsize=7, color="grey", va="bottom"),
            zoom.text(zoom.get_xlim()[1], ref["test_ndcg10"], f"{reference} fp32's NDCG@10 ",
                      fontsize=7, color="grey", va="bottom", ha="right"),  # the files are left
        ]  # fmt: skip
    if labels:  # neighbours on a front sit a few bytes and a hair of NDCG apart
        from adjustText import adjust_text

        # objects=None without a reference: adjustText 1.4 fails on an empty list
        adjust_text(labels, ax=zoom, objects=fixed or None, expand=(1.2, 1.6),
                    arrowprops={"arrowstyle": "-", "color": "grey", "lw": 0.5})  # fmt: skip
    whole.set_ylabel("test NDCG@10 (onnxruntime on the file, full ranking)")
    whole.set_title(f"{title}: every artifact")
    if ref is not None:
        share = f"{budget / ref['model_onnx_bytes']:.0%}"
        zoom.set_title(f"<= {share} of the reference's bytes, within 80% of its NDCG@10")
    else:
        zoom.set_title("every artifact, the fronts' files named (no reference row)")
    whole.xaxis.set_minor_formatter(NullFormatter())  # a decade's minor labels collide
    for fmt, marker in MARKERS.items():
        if any(p["format"] == fmt for p in shown):
            whole.scatter([], [], color="grey", marker=marker, label=fmt)
    whole.legend(fontsize=7, loc="lower right")
    fig.savefig(path, dpi=130)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.device_frontier", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--row", action="append", default=[], metavar="NAME=CKPT",
                   help="a row: its name and checkpoint directory (repeat; at least one)")  # fmt: skip
    p.add_argument("--formats", nargs="+", default=["fp32", "int8", "int4"])
    p.add_argument("--reference", default="sasrec-d64", help="row whose fp32 file is 100%%")
    p.add_argument("--name", required=True, help="results file stem, e.g. frontier-beauty")
    p.add_argument("--results", default="benchmarks/results")
    p.add_argument("--work", default="artifacts/frontier", help="where the artifacts are written")
    p.add_argument("--data-dir", default="")
    p.add_argument("--rounds", type=int, default=20, help="latency rounds (x 20 calls each)")
    p.add_argument("--k", type=int, default=DEFAULT_K, help="top-K exported (the floor's TopK)")
    p.add_argument("--evict-mib", type=int, default=0,
                   help="read through a buffer this large (MiB) before every cold call, so the "
                        "cold column is cold however few the files (0 = off)")  # fmt: skip
    p.add_argument("--keep", action="store_true",
                   help="carry over the existing results' rows that this run does not measure")  # fmt: skip
    p.add_argument("--plot-only", action="store_true",
                   help="measure nothing: redraw NAME.png from the results' NAME.json")  # fmt: skip
    return p


def stored_points(path: Path) -> list[dict[str, Any]]:
    """A results file's rows as points (flat, like a measured one), without the comparisons
    (`compare` computes them again); a row carried by that run keeps its `carried` commit."""
    derived = ("bytes_vs_reference", "ndcg10_vs_reference", "best_sasrec_within_bytes",
               "vs_best_sasrec_within_bytes", "fastest_sasrec_as_accurate",
               "speedup_vs_that_sasrec")  # fmt: skip
    points = []
    for r in json.loads(path.read_text()):
        ctx = {k: v for k, v in r.get("context", {}).items() if k not in derived}
        points.append({k: v for k, v in r.items() if k != "context"} | ctx)
    return points


def carried(path: Path, measured: set[str]) -> list[dict[str, Any]]:
    """The rows of an earlier results file whose names this run does not measure, as points
    (flat, like a measured one) marked `carried`; comparisons are computed again."""
    if not path.is_file():
        return []
    return [p | {"carried": p.get("carried") or p["commit"]} for p in stored_points(path)
            if p["name"] not in measured]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out = Path(args.results)
    if args.plot_only:
        stored = out / f"{args.name}.json"
        if not stored.is_file():
            print(f"--plot-only: no results at {stored}", file=sys.stderr)
            return 2
        plot(stored_points(stored), out / f"{args.name}.png", args.name, args.reference)
        print(f"redrew {out / f'{args.name}.png'} from {stored}")
        return 0
    if not args.row:
        print("at least one --row NAME=CKPT is needed (or --plot-only)", file=sys.stderr)
        return 2
    if args.evict_mib < 0:
        print("--evict-mib must be 0 or more", file=sys.stderr)
        return 2
    evict_bytes = args.evict_mib << 20
    command = "python -m benchmarks.device_frontier " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    host = environment(command)  # the machine, versions and load of this run's measurements
    rows = []
    for spec in args.row:
        name, sep, ckpt = spec.partition("=")
        if not sep or not Path(ckpt, "metrics.json").is_file():
            print(f"--row {spec!r}: expected NAME=CKPT with a finished checkpoint", file=sys.stderr)
            return 2
        rows.append((name, Path(ckpt)))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    folders: dict[str, Path] = {}
    arts: dict[str, Any] = {}  # each artifact read and verified once
    points = []
    for name, ckpt in rows:
        for fmt, folder in export_row(name, ckpt, args.formats, work, args.data_dir).items():
            key = f"{name}/{fmt}"
            folders[key], arts[key] = folder, read(folder)
            points.append(describe_row(name, ckpt, fmt, arts[key].meta))
    times = timings(arts, rounds=args.rounds, evict_bytes=evict_bytes)
    graph_work = floors(arts, folders, args.k, evict_bytes)
    held = memory(folders)
    measured_at = host["commit"] or "unknown"  # environment() read it already
    for p in points:
        key = f"{p['name']}/{p['format']}"
        p |= {"cold": times[key]["cold"], "warm": times[key]["warm"], **graph_work[key],
              **held[key]}  # fmt: skip
        p["p50_ms"] = times[key]["warm"]["p50"]
        p["evict_mib"] = args.evict_mib  # a carried row keeps the one of the run that timed it
        p["commit"] = measured_at
        p["environment"] = host  # a carried row keeps the one of the run that measured it
    paired_with_reference(arts, points, args.reference, args.data_dir)
    if args.keep:
        points += carried(out / f"{args.name}.json", {name for name, _ in rows})
    compare(points, args.reference)
    out.mkdir(parents=True, exist_ok=True)
    record = [{k: p[k] for k in RESULT_KEYS} | {"context": {k: v for k, v in p.items() if k not in RESULT_KEYS}}
              for p in points]  # fmt: skip
    for r in record:
        r["context"].setdefault("frontier_command", command)  # a carried row keeps its own
        r["context"].setdefault("floor_reference", graph_work["_reference"])
    (out / f"{args.name}.json").write_text(json.dumps(record, indent=2))
    md = table(points, args.reference) + "\n" + latency_table(points, args.reference)
    md += host_line(graph_work["_reference"], args.k, host["machine"])
    if args.evict_mib:
        md += f"\nEvery cold call came after reading through {args.evict_mib} MiB (--evict-mib).\n"
    caveat = warn_if_cached(graph_work, host["machine"], evict_bytes)
    if caveat:
        md += f"\nWarning: {caveat}.\n"
    if any(p.get("carried") for p in points):
        md += (
            "\nRows named with a commit in brackets are carried over from that commit's run "
            "(--keep): their latencies were interleaved with that run's artifacts, not these.\n"
        )
    (out / f"{args.name}.md").write_text(f"# {args.name}\n\n`{command}`\n\n{md}")
    plot(points, out / f"{args.name}.png", args.name, args.reference)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
