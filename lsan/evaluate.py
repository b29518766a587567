"""Full-ranking evaluation: every item in the catalogue is a candidate, never sampled negatives.

Seen-item masking (default on, as in RecBole `mode: full` and the strong SASRec references):
every item in the user's history before the target is removed from the ranking, so a target the
user already consumed counts as a miss. Ties are broken pessimistically (an item with a score
equal to the target's ranks above it), which keeps tie-heavy scorers such as popularity honest.
Users are scored in steps of at most `eval.max_scores` scores, so a 1M-item catalogue is ranked
in bounded memory, with the same ranks.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import torch
from torch import nn

from lsan.config import EvalConfig
from lsan.data.batching import eval_tensors, history_pairs
from lsan.data.prepare import SeqDataset
from lsan.metrics import all_metrics
from lsan.models import Recommender
from lsan.models.objectives import uses_users


def target_ranks(scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """0-based rank of each row's target among all columns, ties counted against the target.

    #(s >= t) - 1 is #(s > t) + #(s == t) - 1 in one pass; an int32 count is several times
    faster than the default int64 one on CPU and cannot overflow below 2**31 items.
    """
    t = scores.gather(1, target[:, None])  # (B, 1)
    return (scores >= t).sum(1, dtype=torch.int32).long() - 1


def users_per_step(cfg: EvalConfig, num_items: int) -> int:
    """Users scored at once: cfg.batch_size, fewer when (users x (|V|+1)) would pass max_scores."""
    return max(1, min(cfg.batch_size, cfg.max_scores // (num_items + 1)))


@torch.no_grad()
def rank_users(
    model: Recommender | nn.Module, ds: SeqDataset, split: str, max_len: int, cfg: EvalConfig,
    device: torch.device, users: np.ndarray | None = None,
) -> np.ndarray:  # fmt: skip
    """Rank of each user's target for `split` ("valid" or "test"); all users unless given."""
    if isinstance(model, nn.Module):
        model.eval()
    rec = cast(Recommender, model)
    data = eval_tensors(ds, split, max_len)
    users = np.arange(ds.num_users) if users is None else np.asarray(users)
    ranks = []
    step = users_per_step(cfg, ds.num_items)
    for start in range(0, len(users), step):
        rows = users[start : start + step]
        batch = data.rows(torch.as_tensor(rows)).to(device)
        kw = {"users": batch.users} if uses_users(model) and batch.users is not None else {}
        scores = rec.score_all(batch.items, batch.cats, batch.slots, **kw).float()  # (B, |V|+1)
        scores[:, 0] = -torch.inf
        if cfg.mask_seen:
            r, items = history_pairs(ds, rows, split)
            scores[
                torch.as_tensor(r, device=device), torch.as_tensor(items, device=device)
            ] = -torch.inf
        assert batch.target is not None
        ranks.append(target_ranks(scores, batch.target).cpu().numpy())
    return np.concatenate(ranks) if ranks else np.zeros(0, dtype=np.int64)


def evaluate(
    model: Recommender | nn.Module, ds: SeqDataset, split: str, max_len: int, cfg: EvalConfig,
    device: torch.device,
) -> dict[str, float]:  # fmt: skip
    """HR/NDCG/MRR at cfg.ks over all users, plus the protocol used."""
    return summarise(rank_users(model, ds, split, max_len, cfg, device), cfg)


def summarise(ranks: np.ndarray, cfg: EvalConfig) -> dict[str, float]:
    """The reported metrics of every user's rank (also of ranks gathered from many processes);
    of several checkpoints' ranks on the same users, (checkpoints, users), their means."""
    return all_metrics(np.ravel(ranks), cfg.ks) | {"users": int(np.shape(ranks)[-1])}
