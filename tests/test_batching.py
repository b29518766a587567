import numpy as np
import torch

from lsan.data.batching import eval_tensors, history_pairs, item_counts, train_tensors, windows
from lsan.data.prepare import PAD


def test_windows_right_aligned_and_padded():
    values = np.arange(10, 20)
    w = windows(values, np.array([0, 5]), np.array([3, 10]), 4)
    assert w.tolist() == [[PAD, 10, 11, 12], [16, 17, 18, 19]]


def test_splits_are_leak_free(small_ds):
    ds, T = small_ds, 50
    tr = train_tensors(ds, T)
    va = eval_tensors(ds, "valid", T)
    te = eval_tensors(ds, "test", T)
    for u in range(ds.num_users):
        seq = ds.sequence(u).tolist()
        # training never sees the last two items, as input or as target
        inputs = [i for i in tr.items[u].tolist() if i != PAD]
        targets = [i for i in tr.targets[u].tolist() if i != PAD]
        assert inputs == seq[:-3][-T:] and targets == seq[1:-2][-T:]
        assert va.target[u].item() == seq[-2] and te.target[u].item() == seq[-1]
        assert [i for i in va.items[u].tolist() if i != PAD] == seq[:-2][-T:]
        assert [i for i in te.items[u].tolist() if i != PAD] == seq[:-1][-T:]


def test_context_aligned_with_items(small_ds):
    tr = train_tensors(small_ds, 20)
    assert torch.equal(tr.cats, torch.as_tensor(small_ds.item_category)[tr.items])
    assert torch.equal(tr.slots == PAD, tr.items == PAD)


def test_history_pairs_cover_full_history(small_ds):
    users = np.array([0, 3])
    rows, items = history_pairs(small_ds, users, "test")
    for r, u in enumerate(users):
        assert items[rows == r].tolist() == small_ds.sequence(u)[:-1].tolist()


def test_item_counts_exclude_eval_targets(small_ds):
    counts = item_counts(small_ds)
    assert counts[0] == 0 and counts.sum() == len(small_ds.items) - 2 * small_ds.num_users
