"""A lower bound on one request's latency: its arithmetic and memory traffic at this CPU's peak.

Work of one request (batch 1, history length T, catalogue |V|, width D), from the model config:
- FLOPs: the matrix products over the T positions (projections, attention scores and mixing,
  convolution, feed-forward; 2 per multiply-add) and the scoring: 2 |V| D for a full table;
  2 sum(m_n) D + N M for LSAN's factorised scoring (M = prod m_n >= |V|+1 code-grid cells, one
  add per table and cell; 2 N M with per-item weights, a multiply too). Element-wise work
  (norms, softmax, GeLU) is left out, which keeps the bound a bound.
- Bytes: every weight the request must read once (dense layers whole; lookup-only embeddings
  only their T rows; tables used for scoring whole) plus the written score vector (4 (|V|+1)).
  fp32 and fp16 artifacts compute in fp32 (onnxruntime folds fp16 weights to fp32 at load);
  int8 artifacts read 1 byte per matrix element (vectors stay 4 bytes).
Peak: single-core FLOP/s = GHz x FLOPs per cycle, assuming the widest FMA units the SIMD flags
allow (two 512-bit FMA units with AVX-512: 64 fp32 FLOPs/cycle; some AVX-512 cores do half), and
4x that for int8 with VNNI dot products. Bandwidth: a single-thread numpy copy measured at
several working-set sizes (cache to DRAM), taking the fastest size that holds the request's
bytes. The bound is max(FLOPs / peak, bytes / bandwidth): optimistic on every count, so the gap
to the measured p50 is framework overhead (kernel launches, small-op dispatch) plus slack.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
from torch import nn

from lsan.models import DataInfo
from lsan.models.lsan import LSAN
from lsan.models.sasrec import SASRec

LOOKUP_ONLY = ("pos_emb.", "slot.", "fusion.prev_cat.", "fusion.cur_cat.", "fusion.slot.")
FLOAT_ONLY = ("items.item_weights", "items.item_bias")  # used by Mul/Add, never quantized
# formats whose big products run on 8-bit integers
INT8 = ("int8", "int8-static", "lowbit", "lowbit8")


def flops_per_cycle(simd: list[str]) -> int:
    if "avx512f" in simd:
        return 64
    if "avx2" in simd and "fma" in simd:
        return 32
    return 16 if "avx" in simd else 8


def bandwidth_curve(max_bytes: int, reps_s: float = 0.05) -> list[dict[str, float]]:
    """Copy bandwidth (bytes read + written per second) at working sets from 256 KiB up."""
    sizes, s = [], 256 * 1024
    while s <= max_bytes:
        sizes.append(s)
        s *= 8
    curve = []
    for size in sizes:
        src = np.ones(size // 8, dtype=np.float32)  # src + dst = the working set
        dst = np.empty_like(src)
        np.copyto(dst, src)  # first touch: page faults (up to ~100 ms at 16 MiB here), not copying
        best, start, reps = math.inf, time.perf_counter(), 0
        while time.perf_counter() - start < reps_s or reps < 5:
            reps += 1
            t0 = time.perf_counter()
            np.copyto(dst, src)
            best = min(best, time.perf_counter() - t0)
        curve.append({"bytes": size, "gb_per_s": size / best / 1e9})
    return curve


def bandwidth_at(curve: list[dict[str, float]], nbytes: int) -> float:
    """Bytes/s for a working set of `nbytes`: the fastest measured size that holds it."""
    fits = [c["gb_per_s"] for c in curve if c["bytes"] >= nbytes]
    return 1e9 * (max(fits) if fits else curve[-1]["gb_per_s"])


def machine_peak(env: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    simd = env["machine"]["simd"]
    ghz = env["machine"]["mhz"] / 1000
    fpc = flops_per_cycle(simd)
    int8 = 4 if ("avx512_vnni" in simd or "avx_vnni" in simd) else 2
    return {
        "ghz": ghz,
        "fp32_flops_per_cycle": fpc,
        "int8_factor": int8,
        "peak_gflops_1core": ghz * fpc,
        "peak_gflops_all_cores": ghz * fpc * env["machine"]["cores"],
        "bandwidth": bandwidth_curve(max_bytes),
    }


def request_flops(model: nn.Module, info: DataInfo, t: int) -> int:
    """FLOPs of one request with a history of `t`. Inference runs the final layer for the last
    position only: its query against every key (keys and values, and the one qkv matmul, still
    cover all t positions), its feed-forward and output projection for that one position."""
    v1 = info.num_items + 1
    if isinstance(model, SASRec):
        sc = model.cfg
        d, f = sc.dim, sc.ffn_mult
        full = (8 + 4 * f) * t * d * d + 4 * t * t * d
        last = 6 * t * d * d + (2 + 4 * f) * d * d + 4 * t * d
        return (sc.layers - 1) * full + last + 2 * d * v1
    if isinstance(model, LSAN):
        c = model.cfg
        d, h = c.dim, c.heads
        n = 1 if c.full_table else c.tables
        # query, logits + mix and inject over [e ; c]; one base vector: no query (the model
        # skips it) and the inject of e alone (the export's inference form projects c's tables)
        fusion = 2 * t * d * d + 4 * t * n * d + 4 * t * d * d if n > 1 else 2 * t * d * d

        def layer(tq: int) -> int:  # tq query positions: t, or 1 for the final layer
            flops = 6 * h * t * d * d + 4 * h * tq * t * d + 4 * tq * d * d  # qkv, attention, FFN
            if tq == 1:  # the inference form: the conv folded into the output projection,
                # which reads the attention heads and the last `kernel` inputs
                return flops + 2 * (h + (c.kernel if c.conv else 0)) * d * d
            flops += 2 * (2 * h if c.conv else h) * tq * d * d  # output projection of the heads
            return flops + (2 * t * d * h * c.kernel if c.conv else 0)

        if model.items is None:
            scoring = 2 * d * v1
        else:
            sizes = model.items.sizes
            per_cell = 2 * len(sizes) if c.item_weights else len(sizes)  # (multiply +) add
            scoring = 2 * d * sum(sizes) + per_cell * math.prod(sizes)
        return fusion + (c.layers - 1) * layer(t) + layer(1) + scoring
    return 0  # popularity: no arithmetic beyond reading the counts


def request_bytes(model: nn.Module, info: DataInfo, t: int, fmt: str) -> int:
    matrix = 0.5 if fmt == "int4" else 1 if fmt in INT8 else 4  # bytes per matrix weight
    total: float = 4 * (info.num_items + 1)  # the score vector written
    for name, w in model.state_dict().items():
        per = matrix if w.dim() >= 2 and not name.startswith(FLOAT_ONLY) else 4
        if name.startswith(LOOKUP_ONLY):
            total += min(t, w.shape[0]) * w[0].numel() * per
        else:
            total += w.numel() * per
    return int(total)


def bound_row(
    model: nn.Module, info: DataInfo, t: int, fmt: str, peak: dict[str, Any]
) -> dict[str, Any]:
    flops, nbytes = request_flops(model, info, t), request_bytes(model, info, t, fmt)
    gflops = peak["peak_gflops_1core"] * (peak["int8_factor"] if fmt in INT8 else 1)
    compute_s = flops / (gflops * 1e9)
    memory_s = nbytes / bandwidth_at(peak["bandwidth"], nbytes)
    return {"length": t, "flops": flops, "bytes": nbytes, "compute_us": compute_s * 1e6,
            "memory_us": memory_s * 1e6,
            "bound_ms": max(compute_s, memory_s) * 1000}  # fmt: skip
