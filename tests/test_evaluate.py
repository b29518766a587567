import numpy as np
import torch
from torch import nn

from lsan.config import EvalConfig
from lsan.evaluate import rank_users, target_ranks


def test_target_ranks_pessimistic_ties():
    scores = torch.tensor([[0.0, 3.0, 1.0, 3.0, 2.0]])
    assert target_ranks(scores, torch.tensor([4])).tolist() == [2]
    assert target_ranks(scores, torch.tensor([1])).tolist() == [1]  # tied with item 3


class Oracle(nn.Module):
    """Scores the true next item highest when told it; otherwise scores the last input item."""

    def __init__(self, n):
        super().__init__()
        self.n = n

    def score_all(self, items, cats, slots):
        s = torch.zeros(items.shape[0], self.n + 1)
        s[torch.arange(items.shape[0]), items[:, -1]] = 1.0
        return s


def test_mask_seen_removes_history(small_ds):
    """A model that always recommends the last history item is perfect unmasked, useless masked."""
    ds = small_ds
    # Make every user's target equal to their previous item so the "repeat" model is right.
    ds2 = type(ds)(**{**ds.__dict__, "items": ds.items.copy()})
    ends = ds.offsets[1:] - 1
    ds2.items[ends] = ds2.items[ends - 1]
    model, dev = Oracle(ds.num_items), torch.device("cpu")
    unmasked = rank_users(model, ds2, "test", 20, EvalConfig(mask_seen=False), dev)
    masked = rank_users(model, ds2, "test", 20, EvalConfig(mask_seen=True), dev)
    assert np.all(unmasked == 0)
    assert np.all(masked >= ds.num_items - ds.lengths.max())


def test_batching_does_not_change_ranks(small_ds):
    torch.manual_seed(0)
    emb = torch.randn(small_ds.num_items + 1, 8)

    class Rand(nn.Module):
        def score_all(self, items, cats, slots):
            return emb[items].sum(1) @ emb.T

    a = rank_users(Rand(), small_ds, "valid", 10, EvalConfig(batch_size=7), torch.device("cpu"))
    b = rank_users(Rand(), small_ds, "valid", 10, EvalConfig(batch_size=1000), torch.device("cpu"))
    assert np.array_equal(a, b)
