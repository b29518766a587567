"""Latency and throughput: onnxruntime, the serving runtime and PyTorch eager, side by side.

- The device case: one request (batch 1) on one thread, p50/p95/p99 over many repeats after a
  warm-up, for a short (10) and a full (max_len) history. Measured on the bare onnxruntime
  session with prebuilt feeds (the model's cost) and through `serving.runtime.Artifact.recommend`
  (what the server pays: raw-id mapping, padding, the session, the answer).
- The server case: throughput (requests/s) at batch 32 and 256 with every core.
- The reference: PyTorch eager running the same inference graph (scores, exclusion, top-K) on
  the checkpoint, with the same thread settings.
Every request excludes the user's history, as the server does. Each configuration stops after
`repeats` calls or `budget_s` seconds, whichever comes first (at least 3 calls), so a slow case
cannot stall the suite; `n` records how many calls the percentiles are over.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch

from lsan.artifact import feeds, session
from lsan.benchmarks.artifacts import Artifact, Checkpoint
from lsan.export.graph import InferenceGraph
from lsan.info import DataInfo
from lsan.serving.runtime import load_artifact


def request_feeds(info: DataInfo, batch: int, length: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Full (unpadded) histories of `length` random items, excluded from the answer."""
    rng = np.random.default_rng(seed)
    items = rng.integers(1, info.num_items + 1, (batch, length))
    cats = rng.integers(1, max(info.num_categories, 2), (batch, length))
    slots = rng.integers(1, max(info.num_slots, 2), (batch, length))
    return feeds(items, cats, slots, items)


def timed(fn: Callable[[], Any], warmup: int, repeats: int, budget_s: float) -> np.ndarray:
    """Seconds per call of `fn`, after `warmup` untimed calls (`interleaved` with one fn)."""
    return interleaved([fn], warmup, repeats, budget_s, block=1)[0]


def interleaved(
    fns: list[Callable[[], Any]], warmup: int, repeats: int, budget_s: float, block: int = 5
) -> list[np.ndarray]:
    """Seconds per call of each fn, timed in turns of `block` calls each, so that a host whose
    speed drifts (other jobs, clocks) shifts every fn alike; `warmup` untimed calls of each
    first; up to `repeats` calls each, or fewer (at least 3) once `budget_s` per fn is spent."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    times: list[list[float]] = [[] for _ in fns]
    start = time.perf_counter()
    while len(times[0]) < repeats and (
        len(times[0]) < 3 or time.perf_counter() - start < budget_s * len(fns)
    ):
        for fn, t in zip(fns, times, strict=True):
            for _ in range(block):
                t0 = time.perf_counter()
                fn()
                t.append(time.perf_counter() - t0)
    return [np.asarray(t) for t in times]


def summary(times: np.ndarray, batch: int) -> dict[str, Any]:
    p50, p95, p99 = np.percentile(times, [50, 95, 99]) * 1000
    return {"n": len(times), "p50_ms": float(p50), "p95_ms": float(p95), "p99_ms": float(p99),
            "mean_ms": float(times.mean() * 1000),
            "throughput_rps": float(batch / times.mean())}  # fmt: skip


def cases(info: DataInfo, batches: tuple[int, ...], all_threads: int) -> list[tuple[int, int, int]]:
    """(batch, length, threads): batch 1 on one thread, bigger batches on every core."""
    lengths = sorted({min(10, info.max_len), info.max_len})
    return [(b, t, 1 if b == 1 else all_threads) for b in batches for t in lengths]


def onnxruntime_rows(
    a: Artifact, batches: tuple[int, ...], all_threads: int, warmup: int, repeats: int,
    budget_s: float,
) -> list[dict[str, Any]]:  # fmt: skip
    rows, sessions = [], {}
    model_file = a.path / "model.onnx"
    for batch, length, threads in cases(a.ckpt.info, batches, all_threads):
        if threads not in sessions:
            sessions[threads] = session(model_file, threads)
        sess, x = sessions[threads], request_feeds(a.ckpt.info, batch, length)
        fn = partial(sess.run, ["top_items", "top_scores"], x)
        times = timed(fn, warmup, repeats if batch == 1 else max(3, repeats // 5), budget_s)
        rows.append({**a.key, "engine": "onnxruntime", "batch": batch, "length": length,
                     "threads": threads, **summary(times, batch)})  # fmt: skip
    return rows


def runtime_rows(a: Artifact, warmup: int, repeats: int, budget_s: float) -> list[dict[str, Any]]:
    """Batch-1, one-thread requests through the serving runtime, raw ids in and out."""
    art = load_artifact(a.path, threads=1)
    ids = art.catalogue
    rng = np.random.default_rng(0)
    rows = []
    for length in sorted({min(10, art.max_len), art.max_len}):
        picks = rng.choice(ids, size=min(length, len(ids)), replace=False)
        hist: list[list[tuple[int, float | None]]] = [
            [(int(i), 1.7e9 + 3600.0 * n) for n, i in enumerate(picks)]
        ]
        times = timed(partial(art.recommend, hist, k=10), warmup, repeats, budget_s)
        rows.append({**a.key, "engine": "runtime", "batch": 1, "length": length, "threads": 1,
                     **summary(times, 1)})  # fmt: skip
    return rows


def torch_rows(
    ckpt: Checkpoint, batches: tuple[int, ...], all_threads: int, k: int, warmup: int,
    repeats: int, budget_s: float,
) -> list[dict[str, Any]]:  # fmt: skip
    """PyTorch eager on the same graph as the artifact (the reference, not the device path)."""
    graph = InferenceGraph(ckpt.model, min(k, ckpt.info.num_items)).eval()
    before = torch.get_num_threads()
    rows = []
    try:
        for batch, length, threads in cases(ckpt.info, batches, all_threads):
            torch.set_num_threads(threads)
            x = [torch.from_numpy(v) for v in request_feeds(ckpt.info, batch, length).values()]

            def fn(x=x):
                with torch.inference_mode():
                    return graph(*x)[:2]

            times = timed(fn, warmup, repeats if batch == 1 else max(3, repeats // 5), budget_s)
            rows.append({"label": ckpt.label, "model": ckpt.name, "format": "eager-fp32",
                         "engine": "torch", "batch": batch, "length": length, "threads": threads,
                         **summary(times, batch)})  # fmt: skip
    finally:
        torch.set_num_threads(before)
    return rows


def plot(rows: list[dict[str, Any]], bounds: list[dict[str, Any]], path) -> None:
    """p50 (bar) and p95 (tick) of one full-length request on one thread, and the lower bound."""
    from matplotlib.figure import Figure

    longest: dict[str, int] = {}
    for r in rows:
        longest[r["label"]] = max(longest.get(r["label"], 0), r["length"])
    sel = [r for r in rows if r["batch"] == 1 and r["length"] == longest[r["label"]]]
    sel.sort(key=lambda r: (r["engine"], r["label"], r["format"]))
    bound = {(b["label"], b["format"]): b["bound_ms"] for b in bounds}
    fig = Figure(figsize=(8, 0.35 * len(sel) + 1.5))
    ax = fig.subplots()
    names = [f"{r['label']} {r['format']} ({r['engine']})" for r in sel]
    y = np.arange(len(sel))
    ax.barh(y, [r["p50_ms"] for r in sel], color="tab:blue", label="p50")
    ax.scatter([r["p95_ms"] for r in sel], y, marker="|", color="black", s=80, label="p95")
    marks = [(i, bound[(r["label"], r["format"])]) for i, r in enumerate(sel)
             if r["engine"] == "onnxruntime" and (r["label"], r["format"]) in bound]  # fmt: skip
    if marks:
        ax.scatter([m for _, m in marks], [i for i, _ in marks], marker="x", color="tab:red",
                   label="lower bound")  # fmt: skip
    ax.set_yticks(y, names, fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("ms per request (batch 1, 1 thread, full history)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
