"""The human side of a results file: markdown tables, the targets with PASS/MISS, the plots.

Everything here is a function of the results JSON alone, so a committed results file can be
re-rendered without re-measuring: `python -m benchmarks.report benchmarks/results/NAME.json`.
`--readme FILE` also replaces the block between `<!-- bench:start -->` and `<!-- bench:end -->`
in that file with the summary table (docs/benchmark-suite.md holds the Beauty one).
Ratios are against SASRec fp32 from the same run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from lsan.benchmarks import frontier, latency, scaling
from lsan.tables import markdown_table

EQUAL_NDCG = 0.02  # "at equal NDCG@10": at most 2% relative below (the export's default max drop)
SIZE_TARGET = 0.10  # LSAN int8 bytes / SASRec fp32 bytes
SPEEDUP_TARGET = 2.0  # SASRec fp32 p50 / LSAN int8 p50 on onnxruntime
P50_TARGET_MS = 1.0  # LSAN int8 single-request p50 on one thread
README_START, README_END = "<!-- bench:start -->", "<!-- bench:end -->"


# ---------------------------------------------------------------- lookups


def find(rows: list[dict[str, Any]], **match) -> dict[str, Any] | None:
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), None)


def device_rows(res: dict[str, Any], engine: str = "onnxruntime") -> list[dict[str, Any]]:
    """Batch-1, one-thread rows at each checkpoint's full history length."""
    rows = [r for r in res.get("latency", []) if r["engine"] == engine and r["batch"] == 1]
    longest: dict[str, int] = {}
    for r in rows:
        longest[r["label"]] = max(longest.get(r["label"], 0), r["length"])
    return [r for r in rows if r["length"] == longest[r["label"]]]


def reference_label(res: dict[str, Any]) -> str | None:
    """The SASRec checkpoint the ratios refer to (the first one given)."""
    ref = find(res.get("size", []) or res.get("frontier", []), model="sasrec", format="fp32")
    return ref["label"] if ref else None


def speedup(res: dict[str, Any], row: dict[str, Any]) -> float | None:
    ref_label = reference_label(res)
    fmt = "eager-fp32" if row["engine"] == "torch" else "fp32"
    ref = find(res.get("latency", []), label=ref_label, format=fmt, engine=row["engine"],
               batch=row["batch"], length=row["length"], threads=row["threads"])  # fmt: skip
    return ref["p50_ms"] / row["p50_ms"] if ref else None


def x(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}x"


def num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


# ---------------------------------------------------------------- targets


def target(what: str, subject: str, value: str, status: str, detail: str) -> dict[str, str]:
    return {"target": what, "subject": subject, "value": value, "status": status, "detail": detail}


def targets(res: dict[str, Any]) -> list[dict[str, str]]:
    """The issue's targets, evaluated for each LSAN (compositional) checkpoint, honestly."""
    ref = reference_label(res)
    if ref is None:
        return [target("all", "-", "-", "N/A", "no SASRec checkpoint in this run: no reference")]
    out = []
    for label in sorted({r["label"] for r in res.get("frontier", []) if r["model"] == "lsan"}):
        out += size_target(res, label, ref) + speed_targets(res, label, ref)
    return out + scaling_targets(res.get("scaling", []))


def size_target(res: dict[str, Any], label: str, ref: str) -> list[dict[str, str]]:
    size, front = res.get("size", []), res.get("frontier", [])
    s, s_ref = find(size, label=label, format="int8"), find(size, label=ref, format="fp32")
    if not (s and s_ref):
        return []
    ratio = s["model_bytes"] / s_ref["model_bytes"]
    whole = s["artifact_bytes"] / s_ref["artifact_bytes"]
    nd = (find(front, label=label, format="int8") or {}).get("ndcg10")
    nd_ref = (find(front, label=ref, format="fp32") or {}).get("ndcg10")
    if ratio > SIZE_TARGET:
        status = "MISS"
    elif nd is None or nd_ref is None:
        status = "UNKNOWN"
    else:
        status = "PASS" if nd >= (1 - EQUAL_NDCG) * nd_ref else "MISS"
    detail = (
        f"model.onnx {s['model_bytes']:,} vs {s_ref['model_bytes']:,} B (whole artifact, every "
        f"file: {whole:.1%}); NDCG@10 {num(nd, 4)} vs {num(nd_ref, 4)} (equal = at most "
        f"{EQUAL_NDCG:.0%} below)"
    )
    what = f"bytes <= {SIZE_TARGET:.0%} of SASRec fp32 at equal NDCG@10"
    return [target(what, f"{label} int8", f"{ratio:.1%}", status, detail)]


def speed_targets(res: dict[str, Any], label: str, ref: str) -> list[dict[str, str]]:
    dev = device_rows(res)
    p, p_ref = find(dev, label=label, format="int8"), find(dev, label=ref, format="fp32")
    if not (p and p_ref):
        return []
    sp = p_ref["p50_ms"] / p["p50_ms"]
    dataset = (find(res.get("frontier", []), label=label) or {}).get("dataset", "?")
    rt = find(device_rows(res, "runtime"), label=label, format="int8")
    return [
        target(
            f"p50 >= {SPEEDUP_TARGET:g}x faster than SASRec fp32 ({dataset} catalogue)",
            f"{label} int8", x(sp), "PASS" if sp >= SPEEDUP_TARGET else "MISS",
            f"{p['p50_ms']:.3f} vs {p_ref['p50_ms']:.3f} ms, onnxruntime, batch 1, 1 thread, "
            f"history {p['length']}",
        ),
        target(
            f"p50 < {P50_TARGET_MS:g} ms on one thread", f"{label} int8",
            f"{p['p50_ms']:.3f} ms", "PASS" if p["p50_ms"] < P50_TARGET_MS else "MISS",
            "bare onnxruntime session; through the serving runtime (id mapping included): "
            f"{num(rt['p50_ms'] if rt else None)} ms",
        ),
    ]  # fmt: skip


def scaling_targets(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """SASRec fp32 / LSAN int8 p50 at the smallest and largest catalogue of the scaling runs."""
    done = [r for r in rows if "skipped" not in r]
    sas = sorted({r["arch"] for r in done if r["model"] == "sasrec"})
    if not sas:
        return []
    out = []
    for arch in sorted({r["arch"] for r in done if r["model"] == "lsan"}):
        ratios = []
        for v in sorted({r["num_items"] for r in done}):
            a = find(done, arch=sas[0], format="fp32", num_items=v)
            b = find(done, arch=arch, format="int8", num_items=v)
            if a and b:
                ratios.append((v, a["p50_ms"] / b["p50_ms"]))
        if len(ratios) < 2:
            continue
        (v0, r0), (v1, r1) = ratios[0], ratios[-1]
        note = "" if v1 >= 1_000_000 else f" (largest catalogue measured: {v1:,}, not 1M)"
        out.append(target(
            "far more than 2x faster at large catalogues (and growing)",
            f"{arch} int8 vs {sas[0]} fp32", f"{x(r1)} at {v1:,}",
            "PASS" if r1 >= SPEEDUP_TARGET and r1 > r0 else "MISS",
            f"speed-up {x(r0)} at {v0:,} items -> {x(r1)} at {v1:,}; random weights, "
            f"onnxruntime, batch 1, 1 thread{note}",
        ))  # fmt: skip
    return out


# ---------------------------------------------------------------- tables


def summary_table(res: dict[str, Any]) -> str:
    """One line per artifact: the suite's results table."""
    dev = device_rows(res)
    ref_size = find(res.get("size", []), label=reference_label(res), format="fp32")
    mem = res.get("memory", {}).get("rows", [])
    rows = []
    for f in res.get("frontier", []):
        key = {"label": f["label"], "format": f["format"]}
        p, m, size = find(dev, **key), find(mem, **key), find(res.get("size", []), **key)
        rows.append({
            "model": f["label"], "layout": f["layout"], "format": f["format"],
            "artifact bytes": size["artifact_bytes"] if size else "-",
            "model.onnx bytes": f["model_bytes"],
            "vs SASRec fp32": x(f["model_bytes"] / ref_size["model_bytes"] if ref_size else None, 3),
            "NDCG@10": num(f["ndcg10"], 4),
            "p50 ms (1 thread)": num(p["p50_ms"] if p else None),
            "speed-up": x(speedup(res, p) if p else None),
            "peak RSS MiB": num(m["peak_rss_mib"] if m else None, 1),
        })  # fmt: skip
    return markdown_table(rows, list(rows[0])) if rows else "(no artifacts)"


def environment_lines(res: dict[str, Any]) -> list[str]:
    env, m = res["env"], res["env"]["machine"]
    commit = (env.get("commit") or "unknown")[:12] + (
        " (uncommitted changes)" if env.get("dirty") else ""
    )
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
    return [
        f"- command: `{env['command']}`",
        f"- commit {commit}, {env['utc']} UTC, mode: {'quick' if res['quick'] else 'full'}",
        f"- CPU: {m['cpu']}, {m['cores']} cores usable, {m['mhz']:.0f} MHz, "
        f"{m['memory_bytes'] / 2**30:.1f} GiB RAM, SIMD: {' '.join(m['simd'])}",
        f"- {versions}",
        f"- threads: batch 1 on {env['threads']['device_case']} thread, batch 32/256 on "
        f"{env['threads']['throughput_case']}; load average at start {env['load_average_start']}, "
        f"at end {env.get('load_average_end')} (other processes inflate latencies)",
    ]  # fmt: skip


def size_section(res: dict[str, Any]) -> list[str]:
    ref = find(res["size"], label=reference_label(res), format="fp32")
    rows = [{"model": r["label"], "format": r["format"], "weights": r["weights"],
             "item weights": r["item_weights"], "model.onnx B": r["model_bytes"],
             "vs SASRec fp32": x(r["model_bytes"] / ref["model_bytes"] if ref else None, 3),
             "minimum B": r["theoretical_bytes"], "overhead B": r["overhead_bytes"],
             "item B (file)": r["onnx_item_bytes"], "other B (file)": r["onnx_other_bytes"],
             "stored/weights": f"{r['stored_to_weights']:.2f}",
             "artifact B (all files)": r["artifact_bytes"]} for r in res["size"]]  # fmt: skip
    return [
        "## Size", "",
        "Weights = numbers in model.pt; minimum = weights x bytes per weight of the format; "
        "item side = weights that grow with the catalogue. stored/weights > 1: the file keeps "
        "some weights twice (e.g. a tied table for lookup and, transposed, for scoring).", "",
        markdown_table(rows, list(rows[0])), "",
    ]  # fmt: skip


def memory_section(res: dict[str, Any]) -> list[str]:
    mem = res["memory"]
    rows = [{"model": r["label"], "format": r["format"], "peak RSS MiB": num(r["peak_rss_mib"], 1),
             "model share MiB": num(r["model_share_mib"], 1),
             "torch imported": "yes" if r["torch_imported"] else "no"} for r in mem["rows"]]  # fmt: skip
    return [
        "## Memory", "",
        f"Peak RSS of a fresh process (serving.runtime, 1 thread) that loads the artifact and "
        f"answers {mem['rows'][0]['requests'] if mem['rows'] else 0} requests; baseline (numpy + "
        f"onnxruntime imported, nothing loaded): {mem['baseline_mib']:.1f} MiB; model share = peak "
        "- baseline (weights, onnxruntime's session and buffers, the id maps).", "",
        markdown_table(rows, list(rows[0])) if rows else "(none)", "",
    ]  # fmt: skip


def latency_section(res: dict[str, Any], name: str) -> list[str]:
    one = [r for r in res["latency"] if r["batch"] == 1]
    many = [r for r in res["latency"] if r["batch"] > 1]
    t1 = [{"engine": r["engine"], "model": r["label"], "format": r["format"],
           "history": r["length"], "p50 ms": num(r["p50_ms"]), "p95 ms": num(r["p95_ms"]),
           "p99 ms": num(r["p99_ms"]), "n": r["n"], "speed-up": x(speedup(res, r))}
          for r in one]  # fmt: skip
    t2 = [{"engine": r["engine"], "model": r["label"], "format": r["format"], "batch": r["batch"],
           "history": r["length"], "threads": r["threads"],
           "requests/s": f"{r['throughput_rps']:,.0f}", "p50 ms": num(r["p50_ms"]),
           "speed-up": x(speedup(res, r))} for r in many]  # fmt: skip
    out = [
        "## Latency", "",
        "One request, one thread (the device case). onnxruntime = bare session on prebuilt "
        "feeds; runtime = serving.runtime `recommend` with raw ids (mapping, padding, answer); "
        "torch = PyTorch eager on the same graph. Speed-up = SASRec fp32 p50 / this p50 (same "
        "engine and history length).", "",
        markdown_table(t1, list(t1[0])) if t1 else "(none)", "",
        f"![latency]({name}-latency.png)", "",
    ]  # fmt: skip
    if t2:
        out += ["### Throughput (every core)", "", markdown_table(t2, list(t2[0])), ""]
    return out


def frontier_section(res: dict[str, Any], name: str) -> list[str]:
    rows = [{"model": r["label"], "layout": r["layout"], "format": r["format"],
             "model.onnx B": r["model_bytes"], "NDCG@10": num(r["ndcg10"], 4),
             "HR@10": num(r["hr10"], 4), "NDCG@10 PyTorch": num(r["ndcg10_pytorch"], 4),
             "top-10 overlap": num(r["top10_overlap"], 3)} for r in res["frontier"]]  # fmt: skip
    return [
        "## Accuracy vs size", "",
        "Test NDCG@10 of each exact artifact (onnxruntime, full ranking, seen items excluded); "
        "'-' when the run had no dataset. Top-10 overlap with PyTorch on a fixed batch.", "",
        markdown_table(rows, list(rows[0])) if rows else "(none)", "",
        f"![frontier]({name}-frontier.png)", "",
    ]  # fmt: skip


def scaling_section(res: dict[str, Any], name: str) -> list[str]:
    rows = res["scaling"]
    table = [{"architecture": r["arch"], "format": r.get("format", "-"), "items": r["num_items"],
              "weights": r.get("weights", "-"), "model.onnx B": r.get("bytes", r.get("skipped")),
              "p50 ms": num(r.get("p50_ms")), "bound ms": num(r.get("bound_ms"), 4)}
             for r in rows]  # fmt: skip
    growth = []
    for arch, fmt in sorted({(r["arch"], r["format"]) for r in rows if "skipped" not in r}):
        growth.append({"architecture": arch, "format": fmt,
                       "bytes ~ items^a": num(scaling.growth(rows, arch, fmt, "bytes"), 2),
                       "p50 ~ items^b": num(scaling.growth(rows, arch, fmt, "p50_ms"), 2)})  # fmt: skip
    return [
        "## Catalogue scaling", "",
        "Randomly initialised models of the benchmarked architectures, batch 1, 1 thread, full "
        "history. Exponents between the smallest and largest catalogue: 1 = linear in the catalogue size.", "",
        markdown_table(table, list(table[0])) if table else "(none)", "",
        markdown_table(growth, list(growth[0])) if growth else "", "",
        f"![scaling]({name}-scaling.png)", "",
    ]  # fmt: skip


def bound_section(res: dict[str, Any]) -> list[str]:
    b = res["bound"]
    p = b["machine"]
    bw = ", ".join(f"{c['bytes'] / 2**20:g} MiB: {c['gb_per_s']:.1f} GB/s" for c in p["bandwidth"])
    rows = [{"model": r["label"], "format": r["format"], "history": r["length"],
             "MFLOP": f"{r['flops'] / 1e6:.2f}", "KiB touched": f"{r['bytes'] / 1024:,.0f}",
             "compute us": num(r["compute_us"], 2), "memory us": num(r["memory_us"], 2),
             "bound ms": num(r["bound_ms"], 4), "measured p50 ms": num(r["measured_p50_ms"]),
             "gap": x(r["gap"], 0)} for r in b["rows"]]  # fmt: skip
    return [
        "## Lower bound", "",
        f"Peak assumed for one core: {p['ghz']:.2f} GHz x {p['fp32_flops_per_cycle']} fp32 "
        f"FLOPs/cycle = {p['peak_gflops_1core']:.0f} GFLOP/s (x{p['int8_factor']} for int8); "
        f"copy bandwidth by working set: {bw}. Bound = max(FLOPs / peak, bytes / bandwidth); "
        "gap = measured onnxruntime p50 / bound.", "",
        markdown_table(rows, list(rows[0])) if rows else "(none)", "",
    ]  # fmt: skip


def markdown(res: dict[str, Any], name: str) -> str:
    t = targets(res)
    lines = [f"# Benchmarks: {name}", "", *environment_lines(res), ""]
    if res["quick"]:
        lines += ["Quick mode: few repeats, small catalogues; p99 over a few dozen calls is "
                  "close to the maximum. Not for quoting.", ""]  # fmt: skip
    lines += [
        "## Targets",
        "",
        markdown_table(t, ["target", "subject", "value", "status", "detail"]),
        "",
    ]
    lines += ["## Summary", "", summary_table(res), ""]
    if res.get("size"):
        lines += size_section(res)
    if res.get("memory"):
        lines += memory_section(res)
    if res.get("latency"):
        lines += latency_section(res, name)
    if res.get("frontier"):
        lines += frontier_section(res, name)
    if res.get("scaling"):
        lines += scaling_section(res, name)
    if res.get("bound"):
        lines += bound_section(res)
    return "\n".join(lines)


def render(res: dict[str, Any], out: Path, name: str) -> list[Path]:
    """Write NAME.md and the PNGs next to NAME.json; returns the files written."""
    written = []
    if res.get("frontier"):
        frontier.plot(res["frontier"], out / f"{name}-frontier.png")
        written.append(out / f"{name}-frontier.png")
    if res.get("latency"):
        latency.plot(
            res["latency"], (res.get("bound") or {}).get("rows", []), out / f"{name}-latency.png"
        )
        written.append(out / f"{name}-latency.png")
    if [r for r in res.get("scaling", []) if "skipped" not in r]:
        scaling.plot(res["scaling"], out / f"{name}-scaling.png")
        written.append(out / f"{name}-scaling.png")
    (out / f"{name}.md").write_text(markdown(res, name) + "\n")
    return [out / f"{name}.md", *written]


def update_readme(readme: Path, res: dict[str, Any], source: str) -> None:
    text = readme.read_text()
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        raise SystemExit(f"error: {readme} has no {README_START} ... {README_END} block")
    block = f"{README_START}\n<!-- generated from {source} by benchmarks.report -->\n{summary_table(res)}\n"
    readme.write_text(text[:start] + block + text[end:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.report", description=__doc__.splitlines()[0]
    )
    ap.add_argument("results", help="benchmarks/results/NAME.json")
    ap.add_argument("--readme", help="file whose bench:start/end block gets the summary table")
    args = ap.parse_args(argv)
    path = Path(args.results)
    res = json.loads(path.read_text())
    for f in render(res, path.parent, path.stem):
        print(f)
    if args.readme:
        update_readme(Path(args.readme), res, str(path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
