"""lsan/segments.py: each user in one segment of each partition, read from the data as a plain
per-user loop reads it, and per-segment figures that add back up to the whole split's."""

from dataclasses import replace

import numpy as np
import pytest

from lsan.data.batching import item_counts
from lsan.metrics import ndcg
from lsan.segments import head_items, segment_rows, segments


def reference(ds, split: str, user: int) -> dict[str, str]:
    """The segment of each partition for one user, spelled out."""
    seq = ds.sequence(user)
    ts = ds.timestamps[ds.offsets[user] : ds.offsets[user + 1]]
    t = len(seq) - (2 if split == "valid" else 1)  # the target's position
    n = t  # items before it
    history = "4-7" if 4 <= n <= 7 else "8-15" if 8 <= n <= 15 else "16+" if n >= 16 else "1-3"
    out = {"history": history}
    gap = ts[t] - ts[t - 1]
    if ts[t - 1] < 0 or gap < 0:
        out["gap"] = "unknown"
    else:
        days = gap // 86400
        out["gap"] = ("under 1 day" if days == 0 else "1-7 days" if days <= 7
                      else "8-60 days" if days <= 60 else "over 60 days")  # fmt: skip
    a, b = ds.item_category[seq[t - 1]], ds.item_category[seq[t]]
    out["category"] = ("unknown" if 1 in (a, b)
                       else "same as the last item's" if a == b else "another")  # fmt: skip
    return out


@pytest.mark.parametrize("split", ["test", "valid"])
def test_every_user_is_in_one_segment_of_each_partition_as_a_loop_reads_it(small_ds, split):
    ds = small_ds
    # a few timestamps unknown and one running backwards, a few categories unknown: every
    # segment of the partitions is reached
    ts = ds.timestamps.copy()
    ts[ds.offsets[1:4] - 2] = -1
    ts[ds.offsets[5] - 1] = ts[ds.offsets[5] - 2] - 5
    cats = ds.item_category.copy()
    cats[ds.items[np.r_[ds.offsets[1:4] - 1, ds.offsets[1:4] - 2]]] = 1  # both targets of 3 users
    ds = replace(ds, timestamps=ts, item_category=cats)
    parts = segments(ds, split)
    assert set(parts) == {"history", "target", "gap", "category"}
    for partition, masks in parts.items():
        stacked = np.stack(list(masks.values()))
        assert (stacked.sum(0) == 1).all(), partition  # disjoint and covering
    for user in range(ds.num_users):
        for partition, want in reference(ds, split, user).items():
            got = [s for s, m in parts[partition].items() if m[user]]
            assert got == [want], (partition, user)
    assert parts["gap"]["unknown"].sum() >= 2 and parts["category"]["unknown"].any()
    # head: the fewest most popular items that together take half of the training interactions
    counts = item_counts(ds)
    head_set = head_items(ds)
    taken = counts[head_set].sum()
    assert taken >= counts.sum() / 2 > taken - counts[head_set].min()
    head_targets = parts["target"]["head (half the training interactions)"]
    targets = ds.items[ds.offsets[1:] - (2 if split == "valid" else 1)]
    head = np.unique(targets[head_targets])
    assert counts[head].min() >= counts[np.unique(targets[~head_targets])].max()


def test_a_dataset_without_timestamps_or_categories_has_no_such_partition(small_ds):
    ds = replace(small_ds, timestamps=np.full_like(small_ds.timestamps, -1),
                 category_names=small_ds.category_names[:2])  # fmt: skip
    assert set(segments(ds, "test")) == {"history", "target"}


def test_segment_figures_add_up_to_the_split_and_pair_the_same_users(small_ds):
    rng = np.random.default_rng(0)
    users = small_ds.num_users
    a, b = rng.integers(0, 40, users), rng.integers(0, 40, users)
    rows = segment_rows(segments(small_ds, "test"), [a, b, a])
    for partition in ("history", "target", "gap", "category"):
        mine = [r for r in rows if r["partition"] == partition]
        assert sum(r["users"] for r in mine) == users
        for i, ranks in enumerate((a, b)):
            whole = sum(r["share"] * r["ndcg"][i] for r in mine)
            assert whole == pytest.approx(ndcg(ranks, 10), abs=1e-12)
        for r in mine:
            vs_b, vs_a = r["first_minus"]
            assert vs_b["delta"] == pytest.approx(r["ndcg"][0] - r["ndcg"][1], abs=1e-12)
            assert vs_b["users"] == r["users"] and vs_a["delta"] == 0.0


def test_a_ranker_of_several_checkpoints_is_their_mean_in_every_segment(small_ds):
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 40, (2, small_ds.num_users))
    rows = segment_rows(segments(small_ds, "test"), [np.stack([a, b]), a, b])
    for r in rows:
        assert r["ndcg"][0] == pytest.approx((r["ndcg"][1] + r["ndcg"][2]) / 2, abs=1e-12)
        if r["users"] >= 2:  # pooled minus a = (b - a) / 2, user by user
            vs_a, vs_b = r["first_minus"]
            assert vs_a["delta"] == pytest.approx((r["ndcg"][2] - r["ndcg"][1]) / 2, abs=1e-12)
            assert vs_b["delta"] == pytest.approx(-vs_a["delta"], abs=1e-12)
