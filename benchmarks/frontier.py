"""Accuracy vs size: test NDCG@10 of each exact artifact against its bytes on disk.

One point per checkpoint x format: LSAN over its table layouts (m1, balanced) and quantization
formats, SASRec and LSAN_full as reference points. NDCG@10 is the export's own measurement of
that file with onnxruntime on the test split (full ranking, seen items excluded), so it includes
any quantization loss; it is None when the suite ran without the dataset.
"""

from __future__ import annotations

from typing import Any

from lsan.benchmarks.artifacts import Artifact


def layout(a: Artifact) -> str:
    c = a.ckpt.run.model
    if a.ckpt.name == "sasrec":
        return f"full D={c.dim} L={c.layers}"
    if a.ckpt.name.startswith("lsan"):
        if c.item_table == "full":
            return f"full D={c.dim}"
        if c.item_table in ("codes", "pq"):
            return f"{c.item_table} {c.tables}x{c.code_size} D={c.dim}"
        return f"N={c.tables} {'balanced' if c.m1 == 0 else f'm1={c.m1}'} D={c.dim}"
    return "-"


def rows(artifacts: list[Artifact]) -> list[dict[str, Any]]:
    out = []
    for a in artifacts:
        test = a.meta.test_metrics or {}
        ref = a.meta.test_metrics_pytorch or {}
        out.append({**a.key, "dataset": a.meta.dataset, "layout": layout(a),
                    "model_bytes": a.meta.model_onnx_bytes, "artifact_bytes": a.meta.artifact_bytes,
                    "ndcg10": test.get("NDCG@10"), "hr10": test.get("HR@10"),
                    "ndcg10_pytorch": ref.get("NDCG@10"),
                    "top10_overlap": a.meta.parity[a.format].top10_overlap})  # fmt: skip
    return out


def plot(points: list[dict[str, Any]], path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5))
    ax = fig.subplots()
    shown = [p for p in points if p["ndcg10"] is not None]
    markers = {"fp32": "o", "fp16": "s", "int8": "^", "int8-static": "v"}
    for label in sorted({p["label"] for p in shown}):
        pts = sorted((p for p in shown if p["label"] == label), key=lambda p: p["model_bytes"])
        color = ax.plot([p["model_bytes"] for p in pts], [p["ndcg10"] for p in pts], ":",
                        alpha=0.5)[0].get_color()  # fmt: skip
        for p in pts:
            ax.scatter(p["model_bytes"], p["ndcg10"], marker=markers.get(p["format"], "o"),
                       color=color)  # fmt: skip
            ax.annotate(f"{label} {p['format']}", (p["model_bytes"], p["ndcg10"]), fontsize=6,
                        xytext=(3, 3), textcoords="offset points")  # fmt: skip
    if not shown:
        ax.text(0.5, 0.5, "no test metrics (run without --no-eval / --quick)", ha="center",
                transform=ax.transAxes)  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("model.onnx bytes")
    ax.set_ylabel("test NDCG@10 (onnxruntime, full ranking)")
    ax.set_title("Accuracy vs size (up and to the left is better)")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
