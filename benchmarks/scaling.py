"""Catalogue scaling: bytes and single-request latency as |V| grows, at a fixed architecture.

Trained checkpoints exist for one catalogue each; to see how cost grows with |V|, the same
architectures (the benchmarked checkpoints' configs, plus the balanced-table variant of each
compositional LSAN, since m1 = 2 keeps a |V|/2-row table) are built randomly initialised for
catalogues of e.g. 10k, 100k and 1M items and exported to fp32 and int8 (dynamic), and a low-bit
table's architecture to its `lowbit` format too (its hot rows the lowest ids). Random
weights cost the same bytes and time as trained ones. Full tables grow as |V| D; balanced LSAN
tables as N |V|^(1/N) D, plus N + 1 numbers per item and the N |V| score additions. Models whose
export would need more than `max_memory` bytes are skipped, and the row says so.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lsan.artifact import DEFAULT_K, session
from lsan.benchmarks.artifacts import Checkpoint
from lsan.benchmarks.bound import bound_row
from lsan.benchmarks.latency import interleaved, request_feeds, summary
from lsan.benchmarks.size import weights
from lsan.export.graph import export_fp32
from lsan.export.lowbit import freeze
from lsan.export.quantize import convert
from lsan.models import DataInfo, build_model
from lsan.models.item_tables import LowBitTable, table_sizes

EXPORT_MEMORY_FACTOR = (
    8  # peak RSS of export + quantization / fp32 item bytes (~8.7 measured at 1M)
)


def describe(name: str, cfg: Any) -> str:
    """One label per architecture: two configurations that export different graphs (an output
    bias, time on the residual path) must not share a row's name."""
    grid = f" {cfg.bits}-bit +{cfg.hot_rows} at {cfg.hot_bits}" if getattr(cfg, "bits", 0) else ""
    parts = (
        ("time", name == "sasrec" and getattr(cfg, "use_time", False)),
        ("time residual", getattr(cfg, "time_residual", False)),
        ("bias", getattr(cfg, "item_bias", False)),
    )
    tail = grid + "".join(f" +{part}" for part, on in parts if on)
    if name == "sasrec":
        return f"sasrec D={cfg.dim} L={cfg.layers}{tail}"
    if getattr(cfg, "full_table", False):
        return f"{name} full D={cfg.dim} L={cfg.layers} h={cfg.heads}{tail}"
    layout = "balanced" if cfg.m1 == 0 else f"m1={cfg.m1}"
    return f"{name} N={cfg.tables} {layout} D={cfg.dim}{tail}"


def architectures(ckpts: list[Checkpoint]) -> list[tuple[str, str, Any, DataInfo]]:
    """(description, model name, config, DataInfo of the checkpoint) per distinct architecture."""
    out: dict[tuple, tuple[str, str, Any, DataInfo]] = {}
    for c in ckpts:
        if not getattr(c.model, "trainable", True):
            continue
        cfgs = [c.run.model]
        if c.name.startswith("lsan") and not c.run.model.full_table and c.run.model.m1 != 0:
            cfgs.append(dataclasses.replace(c.run.model, m1=0))
        for cfg in cfgs:
            out.setdefault((c.name, cfg), (describe(c.name, cfg), c.name, cfg, c.info))
    return list(out.values())


def fp32_bytes(name: str, cfg: Any, num_items: int) -> int:
    """Estimated fp32 bytes of the item side, the part that grows with the catalogue."""
    ids = num_items + 1
    if name == "sasrec" or getattr(cfg, "full_table", False):
        return 4 * ids * cfg.dim
    rows = sum(table_sizes(ids, cfg.tables, cfg.m1))
    return 4 * (rows * cfg.dim + (cfg.tables + 1) * ids * cfg.item_weights)


def random_model(name: str, cfg: Any, info: DataInfo) -> tuple[torch.nn.Module, Any]:
    """A seeded, randomly initialised model of the architecture in eval mode, and its frozen
    low-bit table (None for other tables): what the `lowbit` format needs to convert it."""
    torch.manual_seed(0)
    model = build_model(name, cfg, info).eval()
    emb = getattr(model, "item_emb", None)
    if isinstance(emb, LowBitTable):  # its hot rows: the lowest ids, Zipf-like counts
        emb.assign_hot(1.0 / torch.arange(1, info.num_items + 2, dtype=torch.float32))
    return model, freeze(model)


def measure(
    archs: list[tuple[str, str, Any, DataInfo]], sizes: list[int], work: Path, peak: dict,
    warmup: int, repeats: int, budget_s: float, max_memory: int, log=print, k: int = DEFAULT_K,
) -> list[dict[str, Any]]:  # fmt: skip
    rows = []
    for num_items in sizes:
        timed_rows, runs = [], []  # every model of this size, timed together (interleaved)
        for desc, name, cfg, template in archs:
            info = dataclasses.replace(template, num_items=num_items)
            base = {"arch": desc, "model": name, "num_items": num_items, "dim": cfg.dim}
            need = EXPORT_MEMORY_FACTOR * fp32_bytes(name, cfg, num_items)
            if need > max_memory:
                rows.append({**base, "skipped": f"export needs ~{need / 2**30:.1f} GiB"})
                log(f"  {desc:32s} |V|={num_items:>9,d} skipped (~{need / 2**30:.1f} GiB)")
                continue
            model, table = random_model(name, cfg, info)
            total, item = weights(model, info)
            fp32 = work / "scaling-fp32.onnx"
            export_fp32(model, info, fp32, min(k, num_items))  # the artifacts' top-K
            x = request_feeds(info, 1, info.max_len)
            for fmt in ("fp32", "int8") + (("lowbit",) if table is not None else ()):
                path = fp32 if fmt == "fp32" else work / f"scaling-{fmt}.onnx"
                if fmt != "fp32":
                    convert(fp32, path, fmt, [], table)
                runs.append(partial(session(path, 1).run, ["top_items", "top_scores"], x))
                bound = bound_row(model, info, info.max_len, fmt, peak)
                bound["bytes_read"] = bound.pop("bytes")  # a request's reads, not the file's
                timed_rows.append({**base, "format": fmt, "weights": total, "item_weights": item,
                                   "bytes": path.stat().st_size, **bound})  # fmt: skip
                if path != fp32:
                    path.unlink()  # the session holds the model
            fp32.unlink()
            del model
        for row, times in zip(
            timed_rows, interleaved(runs, warmup, repeats, budget_s), strict=True
        ):
            row.update(summary(times, 1))
            log(f"  {row['arch']:32s} |V|={num_items:>9,d} {row['format']:5s} "
                f"{row['bytes']:>13,d} B  p50 {row['p50_ms']:.3f} ms")  # fmt: skip
        rows += timed_rows
        del runs
    return rows


def plot(rows: list[dict[str, Any]], path) -> None:
    """Bytes and p50 against |V| (log-log), one line per architecture and format."""
    from matplotlib.figure import Figure

    done = [r for r in rows if "skipped" not in r]
    fig = Figure(figsize=(11, 4.2))
    ax_bytes, ax_time = fig.subplots(1, 2)
    for arch, fmt in sorted({(r["arch"], r["format"]) for r in done}):
        pts = sorted((r["num_items"], r["bytes"], r["p50_ms"]) for r in done
                     if r["arch"] == arch and r["format"] == fmt)  # fmt: skip
        v, b, t = (np.asarray(c) for c in zip(*pts, strict=True))
        style = "-" if fmt == "fp32" else "--"
        line = ax_bytes.plot(v, b / 2**20, style, marker="o", label=f"{arch} {fmt}")[0]
        ax_time.plot(v, t, style, marker="o", color=line.get_color(), label=f"{arch} {fmt}")
    for ax, ylabel in ((ax_bytes, "model.onnx MiB"), (ax_time, "p50 ms (batch 1, 1 thread)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("catalogue size |V|")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_bytes.legend(fontsize=6)
    fig.suptitle("Catalogue scaling (randomly initialised models, max history length)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def growth(rows: list[dict[str, Any]], arch: str, fmt: str, key: str) -> float | None:
    """Exponent a of key ~ |V|^a between the smallest and the largest measured catalogue."""
    pts = sorted((r["num_items"], r[key]) for r in rows
                 if r.get("arch") == arch and r.get("format") == fmt and "skipped" not in r)  # fmt: skip
    if len(pts) < 2 or pts[0][0] == pts[-1][0]:
        return None
    (v0, y0), (v1, y1) = pts[0], pts[-1]
    return math.log(y1 / y0) / math.log(v1 / v0)
