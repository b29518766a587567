"""The device frontier: every artifact's total bytes against its test NDCG@10, measured on the file.

    python -m benchmarks.device_frontier --name frontier-beauty --data-dir ../shared/data \\
        --row sasrec-d64=runs/beauty-sasrec-d64 --row sasrec-d16=runs/beauty-sasrec-d16 \\
        --row device=runs/beauty-device --formats fp32 int8 int4 --reference sasrec-d64

Each row's checkpoint is exported once per format through the one export path (the same graph
fixes for every model, so optimised is compared with optimised); test HR/NDCG@10 come from
onnxruntime on that exact file (export's own verification), bytes are every file shipped
(`artifact_bytes`) beside model.onnx alone. Latency: batch 1, full history, 1 thread, warm
p50 over rounds that interleave the artifacts. For every artifact the table names the best
SASRec artifact that fits in the same bytes, so "compression" is judged against simply using a
smaller SASRec. Writes `<name>.json` (a list, one object per artifact with the keys the
device-frontier issue fixes, plus a `context` object), `<name>.md` and `<name>.png` in --results.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from lsan.artifact import read
from lsan.benchmarks.env import git_commit
from lsan.benchmarks.latency import request_feeds

RESULT_KEYS = ("name", "model", "item_table", "teacher", "format", "artifact_bytes",
               "model_onnx_bytes", "test_ndcg10", "test_hr10", "p50_ms", "epochs", "command",
               "commit")  # fmt: skip


def commit() -> str:
    return git_commit()["commit"] or "unknown"


def export_row(
    name: str, ckpt: Path, formats: list[str], work: Path, data_dir: str
) -> dict[str, Path]:
    """Export `ckpt` in every format (one ONNX graph, one PyTorch evaluation); folder per format."""
    from lsan.export.export import export

    base = work / name
    folders = {f: base.with_name(f"{base.name}-{f}") for f in formats}
    if all((p / "manifest.json").is_file() for p in folders.values()):
        return folders  # exported before (delete --work to redo)
    export(ckpt, base, quant="auto", formats=tuple(formats), every_format=base, force=True,
           data_dir=data_dir, log=lambda *a: print(f"[{name}]", *a, file=sys.stderr))  # fmt: skip
    return {f: p for f, p in folders.items() if (p / "manifest.json").is_file()}


def warm_p50(folders: dict[str, Path], rounds: int = 20, calls: int = 20) -> dict[str, float]:
    """Batch-1 full-history latency, rounds interleaving every artifact, median per artifact."""
    arts = {key: read(p) for key, p in folders.items()}
    times: dict[str, list[float]] = {key: [] for key in arts}
    x = {}
    for key, a in arts.items():
        x[key] = request_feeds(a.meta.info, batch=1, length=a.meta.info.max_len)
        for _ in range(5):
            a.session.run(["top_items"], x[key])
    for _ in range(rounds):
        for key, a in arts.items():
            for _ in range(calls):
                t0 = time.perf_counter()
                a.session.run(["top_items", "top_scores"], x[key])
                times[key].append(time.perf_counter() - t0)
    return {key: float(np.median(t) * 1000) for key, t in times.items()}


def describe_row(name: str, ckpt: Path, fmt: str, folder: Path) -> dict[str, Any]:
    meta = read(folder).meta
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
    return f"full D={cfg.get('dim')}"


def compare(points: list[dict[str, Any]], reference: str) -> None:
    """Add, per point: share of the reference's bytes, NDCG vs the reference, best SASRec <= bytes."""
    ref = next((p for p in points if p["name"] == reference and p["format"] == "fp32"), None)
    sasrec = [p for p in points if p["model"] == "sasrec" and p["item_table"].startswith("full")
              and p["test_ndcg10"] is not None]  # fmt: skip
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


def table(points: list[dict[str, Any]], reference: str) -> str:
    head = ("| artifact | model | item table | teacher | format | total bytes | % of "
            f"{reference} fp32 | NDCG@10 | HR@10 | vs {reference} fp32 | best SASRec in these bytes"
            " | vs it | p50 ms | epochs |\n|" + "---|" * 14 + "\n")  # fmt: skip

    def pct(v, signed=False):
        return "–" if v is None else (f"{v:+.1%}" if signed else f"{v:.1%}")

    lines = []
    for p in sorted(points, key=lambda p: p["artifact_bytes"]):
        ndcg = "–" if p["test_ndcg10"] is None else f"{p['test_ndcg10']:.4f}"
        hr = "–" if p["test_hr10"] is None else f"{p['test_hr10']:.4f}"
        rel = p.get("ndcg10_vs_reference")
        lines.append(
            f"| {p['name']} | {p['model']} | {p['item_table']} | {'yes' if p['teacher'] else '–'} "
            f"| {p['format']} | {p['artifact_bytes']:,} | {pct(p.get('bytes_vs_reference'))} "
            f"| {ndcg} | {hr} | {pct(None if rel is None else rel - 1, True)} "
            f"| {p['best_sasrec_within_bytes'] or '–'} "
            f"| {pct(p.get('vs_best_sasrec_within_bytes'), True)} | {p['p50_ms']:.3f} | {p['epochs']} |"
        )
    return head + "\n".join(lines) + "\n"


def plot(points: list[dict[str, Any]], path: Path, title: str) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 5.5))
    ax = fig.subplots()
    markers = {"fp32": "o", "fp16": "s", "int8": "^", "int8-static": "v", "int4": "D"}
    shown = [p for p in points if p["test_ndcg10"] is not None]
    for name in sorted({p["name"] for p in shown}):
        pts = sorted((p for p in shown if p["name"] == name), key=lambda p: p["artifact_bytes"])
        line = ax.plot([p["artifact_bytes"] for p in pts], [p["test_ndcg10"] for p in pts], ":",
                       alpha=0.6, label=name)[0]  # fmt: skip
        for p in pts:
            ax.scatter(p["artifact_bytes"], p["test_ndcg10"], color=line.get_color(),
                       marker=markers.get(p["format"], "o"))  # fmt: skip
            ax.annotate(p["format"], (p["artifact_bytes"], p["test_ndcg10"]), fontsize=6,
                        xytext=(3, 3), textcoords="offset points")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("artifact bytes, every file shipped (log scale)")
    ax.set_ylabel("test NDCG@10 (onnxruntime on the file, full ranking)")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.device_frontier", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--row", action="append", required=True, metavar="NAME=CKPT",
                   help="a row: its name and checkpoint directory (repeat)")  # fmt: skip
    p.add_argument("--formats", nargs="+", default=["fp32", "int8", "int4"])
    p.add_argument("--reference", default="sasrec-d64", help="row whose fp32 file is 100%%")
    p.add_argument("--name", required=True, help="results file stem, e.g. frontier-beauty")
    p.add_argument("--results", default="benchmarks/results")
    p.add_argument("--work", default="artifacts/frontier", help="where the artifacts are written")
    p.add_argument("--data-dir", default="")
    p.add_argument("--rounds", type=int, default=20, help="latency rounds (x 20 calls each)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
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
    points = []
    for name, ckpt in rows:
        for fmt, folder in export_row(name, ckpt, args.formats, work, args.data_dir).items():
            folders[f"{name}/{fmt}"] = folder
            points.append(describe_row(name, ckpt, fmt, folder))
    p50 = warm_p50(folders, rounds=args.rounds)
    for p in points:
        p["p50_ms"] = p50[f"{p['name']}/{p['format']}"]
        p["commit"] = commit()
    compare(points, args.reference)
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.device_frontier " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    record = [{k: p[k] for k in RESULT_KEYS} | {"context": {k: v for k, v in p.items() if k not in RESULT_KEYS}}
              for p in points]  # fmt: skip
    for r in record:
        r["context"]["frontier_command"] = command
    (out / f"{args.name}.json").write_text(json.dumps(record, indent=2))
    md = table(points, args.reference)
    (out / f"{args.name}.md").write_text(f"# {args.name}\n\n`{command}`\n\n{md}")
    plot(points, out / f"{args.name}.png", args.name)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
