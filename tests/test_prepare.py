import numpy as np
import pytest

from lsan.data.prepare import UNKNOWN, build, kcore, load_dataset, slot_rule_for, time_slots
from lsan.data.readers import DataError, RawData
from lsan.data.synthetic import SyntheticConfig, generate


def raw(users, items, ts=None, cats=None):
    return RawData(
        users=np.asarray(users, dtype=np.int64),
        items=np.asarray(items, dtype=np.int64),
        timestamps=None if ts is None else np.asarray(ts, dtype=np.int64),
        item_category=cats or {},
    )


def test_kcore_repeats_until_stable():
    # user 9 has one interaction; dropping it leaves item 3 with one, which then drops too.
    users = [1, 1, 1, 2, 2, 9]
    items = [1, 2, 3, 1, 2, 3]
    keep, rounds = kcore(np.array(users), np.array(items), 2)
    assert keep.tolist() == [True, True, False, True, True, False]
    assert rounds == 3


def test_stable_order_keeps_file_order_on_ties_and_remaps():
    # user 5 rated 10 at t=20, then 30 and 40 both at t=10: the tie keeps file order (30, 40).
    r = raw([5, 5, 5, 7, 7], [10, 30, 40, 30, 10], ts=[20, 10, 10, 3, 4], cats={10: "x", 30: "y"})
    ds = build(r, "toy", 1)
    assert ds.raw_user_ids.tolist() == [5, 7]
    assert ds.raw_item_ids.tolist() == [-1, 10, 30, 40]
    assert ds.raw_item_ids[ds.sequence(0)].tolist() == [30, 40, 10]
    assert ds.raw_item_ids[ds.sequence(1)].tolist() == [30, 10]
    # categories: 0 pad, 1 unknown (item 40 has none), labels sorted -> x=2, y=3
    assert ds.item_category.tolist() == [0, 2, 3, UNKNOWN]
    assert ds.category_names == ["<pad>", "<unknown>", "x", "y"]


def test_time_slots_rules():
    hourly = np.array([0, 3600 * 5 + 59, 86400 + 3600 * 23])
    assert slot_rule_for(hourly) == "hour"
    assert time_slots(hourly, "hour").tolist() == [2, 7, 25]
    days = np.array([0, 86400 * 4])  # 1970-01-01 Thursday, 1970-01-05 Monday
    assert slot_rule_for(days) == "weekday"
    assert time_slots(days, "weekday").tolist() == [2 + 3, 2 + 0]
    assert slot_rule_for(None) == "none"
    ds = build(raw([1] * 5, [1, 2, 3, 4, 5]), "toy", 1)
    assert ds.slot_rule == "none" and set(ds.slots.tolist()) == {UNKNOWN} and ds.num_slots == 2


def test_empty_after_filter_is_a_clear_error():
    with pytest.raises(DataError, match="no interactions survive"):
        build(raw([1, 2], [1, 2]), "toy", 5)


def test_synthetic_is_deterministic_and_has_context():
    a = generate(SyntheticConfig(users=50, items=60, seed=1))
    b = generate(SyntheticConfig(users=50, items=60, seed=1))
    assert np.array_equal(a.items, b.items) and np.array_equal(a.timestamps, b.timestamps)
    ds = build(a, "synthetic", 5)
    assert ds.slot_rule == "hour" and ds.num_categories > 3
    assert np.all(ds.lengths >= 5)


def test_cache_roundtrip(tmp_path):
    first = load_dataset("synthetic", cache_dir=str(tmp_path))
    files = list(tmp_path.glob("synthetic-*.npz"))
    assert len(files) == 1
    again = load_dataset("synthetic", cache_dir=str(tmp_path))
    for name in ("offsets", "items", "slots", "item_category", "raw_item_ids", "attr_values"):
        assert np.array_equal(getattr(first, name), getattr(again, name))
    assert again.stats == first.stats and again.category_names == first.category_names
    files[0].write_bytes(b"corrupt")  # a damaged cache entry is rebuilt, not trusted
    assert np.array_equal(load_dataset("synthetic", cache_dir=str(tmp_path)).items, first.items)


def test_unknown_dataset():
    with pytest.raises(DataError, match="unknown dataset 'nope'"):
        load_dataset("nope")
