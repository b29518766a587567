"""Each format against PyTorch, alone vs inside a batch, and on the test split (onnxruntime).

Recorded in the artifact's parity entry of the format: max abs score difference against PyTorch
and top-10 agreement on a fixed batch; whether a row's scores inside a batch equal its scores
alone (within lsan.artifact.BATCH_ATOL); median batch-1 latency; HR/NDCG@10/20 of this exact file
on the test split. `choose` turns the checks into the format to ship and the problems found.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from lsan.artifact import BATCH_ATOL, NEG, Check, feeds, session
from lsan.config import RunConfig
from lsan.data.batching import eval_tensors, history_pairs
from lsan.data.prepare import SeqDataset
from lsan.evaluate import rank_users
from lsan.export import ExportError
from lsan.export.graph import InferenceGraph, example_inputs
from lsan.info import DataInfo
from lsan.metrics import all_metrics

PARITY_ATOL = 1e-4  # fp32 vs PyTorch, max abs score difference


def pytorch_metrics(model: nn.Module, run: RunConfig, info: DataInfo, ds: SeqDataset) -> dict:
    """The checkpoint's own test metrics, the reference every format is compared with."""
    if ds.num_items != info.num_items:
        raise ExportError(
            f"dataset '{ds.name}' has {ds.num_items} items, the checkpoint {info.num_items}"
        )
    ecfg = dataclasses.replace(run.eval, mask_seen=True)
    ranks = rank_users(model, ds, "test", info.max_len, ecfg, torch.device("cpu"))
    return all_metrics(ranks, (10, 20))


def ort_ranks(
    sess: ort.InferenceSession, ds: SeqDataset, split: str, max_len: int, k: int, batch: int = 256
) -> np.ndarray:
    """Rank of each user's target from the artifact's top-K (K means 'not in the top-K')."""
    data = eval_tensors(ds, split, max_len)
    ranks = []
    for start in range(0, ds.num_users, batch):
        users = np.arange(start, min(start + batch, ds.num_users))
        rows, seen = history_pairs(ds, users, split)
        width = max(int(np.bincount(rows, minlength=len(users)).max()), 1)
        exclude = np.zeros((len(users), width), dtype=np.int64)
        col = np.arange(len(rows)) - np.searchsorted(rows, rows)  # position within its row
        exclude[rows, col] = seen
        b = data.rows(torch.as_tensor(users))
        top = sess.run(["top_items"], feeds(b.items, b.cats, b.slots, exclude))[0]  # (B, K)
        hit = top == ds.items[ds.offsets[users + 1] - (2 if split == "valid" else 1)][:, None]
        ranks.append(np.where(hit.any(1), hit.argmax(1), k))
    return np.concatenate(ranks)


def file_ranks(
    sess: ort.InferenceSession, ds: SeqDataset, max_len: int, k: int, batch_invariant: bool
) -> np.ndarray:
    """Test ranks from the file, in batches only when the graph is batch-invariant: a
    batch-dependent graph answers row by row, as the server serves it."""
    return ort_ranks(sess, ds, "test", max_len, k, 256 if batch_invariant else 1)


def latency_ms(sess: ort.InferenceSession, info: DataInfo, repeats: int = 50) -> float:
    """Median single-request latency at batch 1, full history length."""
    x = feeds(*example_inputs(info, batch=1, length=info.max_len))
    for _ in range(5):
        sess.run(None, x)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sess.run(["top_items", "top_scores"], x)
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1000)


def batch_difference(sess: ort.InferenceSession, info: DataInfo, rows: int = 8) -> float:
    """Largest |score| change of a row between running it alone and inside a batch of `rows`
    (the server pads every history to max_len, so the batch is at full length)."""
    x = feeds(*example_inputs(info, batch=rows, length=info.max_len, seed=2))
    (batch,) = sess.run(["scores"], x)
    alone = [
        sess.run(["scores"], {n: v[r : r + 1] for n, v in x.items()})[0][0] for r in range(rows)
    ]
    return float(np.abs(np.stack(alone) - batch).max())


def same_top(top: np.ndarray, ref_top: np.ndarray, ref_scores: np.ndarray) -> bool:
    """Whether two top lists are the same ranking: equal, or apart only in the order of items
    whose PyTorch scores tie (a low-bit table has identical rows, and the two runtimes break
    exact ties differently). Rank by rank the items must score the same under PyTorch."""
    if np.array_equal(top, ref_top):
        return True
    mine = np.take_along_axis(ref_scores, top, axis=1)
    theirs = np.take_along_axis(ref_scores, ref_top, axis=1)
    return bool(np.array_equal(mine, theirs))


def verify(
    model: nn.Module, path: Path, info: DataInfo, ds: SeqDataset | None,
    torch_metrics: dict | None, k: int,
) -> Check:  # fmt: skip
    """Parity with PyTorch on a fixed batch, batch invariance, test metrics with onnxruntime."""
    sess = session(path)
    x = example_inputs(info, batch=4, length=info.max_len, seed=1)
    with torch.no_grad():
        ref_top, _, ref_scores = InferenceGraph(model, k)(*x)
    top, scores = sess.run(["top_items", "scores"], feeds(*x))
    real = ref_scores.numpy() > NEG / 2  # compare real scores; masked entries are NEG in both
    overlap = [
        len(set(a[:10]) & set(b[:10])) / 10 for a, b in zip(top, ref_top.numpy(), strict=True)
    ]
    diff = batch_difference(sess, info)
    test, drop = None, None
    if ds is not None:
        ranks = file_ranks(sess, ds, info.max_len, k, diff <= BATCH_ATOL)
        m = all_metrics(ranks, (5, 10, 20))
        test = {key: m[key] for key in ("HR@10", "NDCG@10", "HR@20", "NDCG@20")}
        if torch_metrics:
            ref = torch_metrics["NDCG@10"]
            drop = float((ref - m["NDCG@10"]) / ref) if ref > 0 else 0.0
    return Check(
        bytes=path.stat().st_size,
        max_abs_score_diff=float(np.abs(scores[real] - ref_scores.numpy()[real]).max()),
        top10_identical=same_top(top[:, :10], ref_top[:, :10].numpy(), ref_scores.numpy()),
        top10_overlap=float(np.mean(overlap)), batch_invariant=diff <= BATCH_ATOL,
        batch_max_abs_diff=diff, latency_ms_b1=latency_ms(sess, info), test=test,
        ndcg10_rel_drop=drop,
    )  # fmt: skip


def problems_of(fmt: str, c: Check, max_drop: float) -> list[str]:
    if c.error is not None:
        return [f"{fmt}: {c.error}"]
    found = []
    if fmt == "fp32":
        if (c.max_abs_score_diff or 0.0) > PARITY_ATOL:
            found.append(f"fp32 max abs score diff {c.max_abs_score_diff:.2e} > {PARITY_ATOL}")
        if not c.top10_identical:
            found.append("fp32 top-10 differs from PyTorch")
    elif (c.ndcg10_rel_drop or 0.0) > max_drop:
        found.append(f"{fmt} NDCG@10 relative drop {c.ndcg10_rel_drop:.1%} > {max_drop:.0%}")
    return found


def choose(candidates: dict[str, Check], quant: str, max_drop: float) -> tuple[str, list[str]]:
    """The format to ship and the checks it fails (empty = all passed). `auto`: the smallest
    file that passes, the faster one on a size tie."""
    fp32 = problems_of("fp32", candidates["fp32"], max_drop) if "fp32" in candidates else []
    if quant != "auto":
        return quant, fp32 + (
            [] if quant == "fp32" else problems_of(quant, candidates[quant], max_drop)
        )
    ok = [f for f, c in candidates.items() if not problems_of(f, c, max_drop)]
    if not ok:
        return "fp32", fp32 or ["no format passed verification"]
    best = min(ok, key=lambda f: (candidates[f].bytes or 0, candidates[f].latency_ms_b1 or 0.0))
    return best, fp32
