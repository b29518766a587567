"""Ranking metrics as pure functions of 0-based ranks (rank 0 = the target is ranked first).

Leave-one-out has one relevant item per user, so HR@k = [rank < k], NDCG@k = 1/log2(rank + 2)
when rank < k, MRR@k = 1/(rank + 1) when rank < k; each averaged over users.
"""

from __future__ import annotations

import numpy as np


def hit_rate(ranks: np.ndarray, k: int) -> float:
    return float(np.mean(ranks < k)) if len(ranks) else 0.0


def user_ndcg(ranks: np.ndarray, k: int) -> np.ndarray:
    """Each user's NDCG@k (the paired comparisons of lsan/paired.py need them one by one)."""
    r = np.asarray(ranks, dtype=np.float64)
    return np.where(r < k, 1.0 / np.log2(r + 2.0), 0.0)


def ndcg(ranks: np.ndarray, k: int) -> float:
    return float(user_ndcg(ranks, k).mean()) if len(ranks) else 0.0


def mrr(ranks: np.ndarray, k: int) -> float:
    if not len(ranks):
        return 0.0
    return float(np.where(ranks < k, 1.0 / (np.asarray(ranks, dtype=np.float64) + 1.0), 0.0).mean())


def all_metrics(ranks: np.ndarray, ks: tuple[int, ...] = (5, 10, 20)) -> dict[str, float]:
    """{"HR@5": ..., "NDCG@5": ..., "MRR@5": ..., ...} for every cut-off in ks."""
    out: dict[str, float] = {}
    for k in ks:
        out[f"HR@{k}"] = hit_rate(ranks, k)
        out[f"NDCG@{k}"] = ndcg(ranks, k)
        out[f"MRR@{k}"] = mrr(ranks, k)
    return out
