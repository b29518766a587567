import json
import warnings

import numpy as np
import pytest

from lsan.checkpoint import dataset_record
from lsan.config import ConfigError, DataConfig
from lsan.data.prepare import (
    UNKNOWN,
    CategoryWarning,
    build,
    category_warning,
    kcore,
    load_dataset,
    slot_rule_for,
    time_slots,
    with_slot_rule,
)
from lsan.data.readers import S3REC_CATEGORY_RULE, DataError, RawData, read_dataset
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


def test_gap_rule_reads_the_time_since_the_entry_before():
    day = 86400
    ts = np.array([0, 0, 30, 90, day, 3 * day, 2 * day, -1, 5 * day, 10**10, 10**10 + day])
    # first: unknown; same second/day: 2; under 2 minutes: 3; 1 day = 1440 min: 2^10 -> 13;
    # 2 days later 2^11 -> 14; backwards, into or out of an unknown time: unknown; ~316 years:
    # the last octave (25); one day after that: 13
    assert time_slots(ts, "gap").tolist() == [1, 2, 3, 3, 13, 14, 1, 1, 1, 25, 13]
    starts = np.zeros(len(ts), dtype=bool)
    starts[[0, 4]] = True  # a second user begins at entry 4
    assert time_slots(ts, "gap", starts)[4] == UNKNOWN
    assert time_slots(np.array([7]), "gap").tolist() == [UNKNOWN]
    assert time_slots(np.zeros(0, dtype=np.int64), "gap").tolist() == []
    # "ahead": each entry's slot is the time until the next one (the gap slot of the next), the
    # last unknown; with users, never across a user's end
    assert time_slots(ts, "ahead").tolist() == [2, 3, 3, 13, 14, 1, 1, 1, 25, 13, 1]
    assert time_slots(ts, "ahead", starts).tolist() == [2, 3, 3, 1, 14, 1, 1, 1, 25, 13, 1]
    assert time_slots(np.array([7]), "ahead").tolist() == [UNKNOWN]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gap_buckets_are_the_minute_octaves_at_every_edge(seed):
    """The binary search over GAP_BOUNDS gives the module docstring's octaves exactly: checked
    against the formula itself (floor(log2(minutes)), at least 0, at most 22) at each bucket's
    edges, across 40 octaves of seconds and with unknown times, users and backward steps."""
    rng = np.random.default_rng(seed)
    edges = [0, 1, 59, 60, 61, 119, 120, 121] + [
        60 * 2**k + d for k in range(1, 25) for d in (-1, 0, 1)
    ]
    gaps = np.concatenate([edges, (2.0 ** rng.uniform(0, 40, 300)).astype(np.int64),
                           rng.integers(-(10**6), 10**6, 100)])  # fmt: skip
    rng.shuffle(gaps)
    ts = np.cumsum(gaps) + 1_300_000_000
    ts[rng.random(len(ts)) < 0.05] = -1
    starts = rng.random(len(ts)) < 0.1
    gap = np.diff(ts)
    octave = np.minimum(np.floor(np.log2(np.maximum(gap / 60.0, 1.0))), 22).astype(np.int64)
    known = (ts[1:] >= 0) & (ts[:-1] >= 0) & (gap >= 0)
    between = np.where(known, np.where(gap == 0, 2, 3 + octave), UNKNOWN)
    expected = np.concatenate([[UNKNOWN], between])
    expected[starts] = UNKNOWN
    assert np.array_equal(time_slots(ts, "gap", starts), expected)
    assert set(expected.tolist()) >= set(range(1, 26))  # every slot was reached
    assert np.array_equal(time_slots(ts, "ahead", starts), np.append(expected[1:], UNKNOWN))


def test_slot_rule_is_chosen_at_load_and_checked(tmp_path):
    auto = load_dataset("synthetic", cache_dir=str(tmp_path))
    gap = load_dataset("synthetic", cache_dir=str(tmp_path), slot_rule="gap")
    assert auto.slot_rule == "hour" and gap.slot_rule == "gap" and gap.num_slots == 26
    assert np.array_equal(gap.items, auto.items) and not np.array_equal(gap.slots, auto.slots)
    assert (
        gap.stats["slot_rule"] == "gap"
        and gap.slots[gap.offsets[:-1]].tolist() == [UNKNOWN] * gap.num_users
    )
    hour = load_dataset("synthetic", cache_dir=str(tmp_path), slot_rule="hour")
    assert hour.slot_rule == "hour" and np.array_equal(hour.slots, auto.slots)
    # "auto" on a dataset of another rule gives back what build chose: hour, weekday or none
    assert np.array_equal(with_slot_rule(gap, "auto").slots, auto.slots)
    days = build(raw([1, 1, 2, 2], [1, 2, 1, 2], ts=[0, 86400, 86400, 3 * 86400]), "toy", 1)
    assert with_slot_rule(with_slot_rule(days, "gap"), "auto").slot_rule == "weekday"
    bare = build(raw([1, 1], [1, 2]), "toy", 1)
    assert with_slot_rule(with_slot_rule(bare, "gap"), "auto").slot_rule == "none"
    with pytest.raises(DataError, match="unknown time-slot rule 'minute'"):
        load_dataset("synthetic", cache_dir=str(tmp_path), slot_rule="minute")
    with pytest.raises(ConfigError, match="data.slot_rule"):
        DataConfig(slot_rule="minute")


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


# ---------------------------------------------------------------- informative categories


def write_s3rec(root, attributes: dict[int, list[int]], users: int = 60, length: int = 6) -> None:
    """A generated LastFM-layout S3-Rec dataset: sequences over the items of `attributes`."""
    folder = root / "lastfm" / "s3rec"
    folder.mkdir(parents=True, exist_ok=True)
    items = sorted(attributes)
    rng = np.random.default_rng(0)
    lines = [" ".join(map(str, [u, *rng.choice(items, size=length, replace=False)]))
             for u in range(1, users + 1)]  # fmt: skip
    (folder / "LastFM.txt").write_text("\n".join(lines) + "\n")
    (folder / "LastFM_item2attributes.json").write_text(json.dumps(attributes))


def root_first(n_items: int = 30) -> dict[int, list[int]]:
    """Amazon-like lists: a root category on every item, a brand, then one of 5 categories."""
    return {i: [1, 1000 + i % 11, 100 + i % 5] for i in range(1, n_items + 1)}


def test_an_attribute_on_every_item_is_never_the_category(tmp_path):
    write_s3rec(tmp_path, root_first())
    raw = read_dataset("lastfm", tmp_path)
    # the old rule ("most frequent attribute") gave every item category 1
    assert {raw.item_category[i] for i in raw.item_category} == {"100", "101", "102", "103", "104"}
    assert all(raw.item_category[i] == str(100 + i % 5) for i in range(1, 31))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CategoryWarning)  # informative: no warning
        ds = load_dataset("lastfm", str(tmp_path), str(tmp_path / "cache"), min_count=1)
    assert ds.category_rule == S3REC_CATEGORY_RULE
    assert ds.stats["categories"] == 5 and ds.stats["largest_category_share"] == pytest.approx(0.2)
    record = dataset_record(ds)  # what dataset.json keeps
    assert record["category_rule"] == S3REC_CATEGORY_RULE
    assert record["stats"]["largest_category_share"] == pytest.approx(0.2)


def test_common_attributes_are_skipped_but_rare_ones_kept(tmp_path):
    # attribute 7 is on 60% of the items: it separates little and is skipped; brands (one item
    # each) are rarer than the 3 categories, which win as the most frequent informative ones
    attrs = {i: ([7] if i <= 18 else []) + [500 + i, 200 + i % 3] for i in range(1, 31)}
    write_s3rec(tmp_path, attrs)
    raw = read_dataset("lastfm", tmp_path)
    assert all(raw.item_category[i] == str(200 + i % 3) for i in attrs)


@pytest.mark.parametrize(
    ("attributes", "reason"),
    [
        ({i: [1] for i in range(1, 31)}, "1 categories, the largest holds 100%"),
        (
            {i: [1, 5 if i <= 27 else 6] for i in range(1, 31)},
            "2 categories, the largest holds 90%",
        ),
        (
            {i: [1, 10 + (i > 27) + (i > 28) + (i > 29)] for i in range(1, 31)},
            "the largest holds 90%",
        ),
    ],
)
def test_uninformative_categories_warn(tmp_path, attributes, reason):
    write_s3rec(tmp_path, attributes)
    with pytest.warns(CategoryWarning, match="uninformative item categories") as record:
        ds = load_dataset("lastfm", str(tmp_path), str(tmp_path / "cache"), min_count=1)
    assert reason in str(record[0].message) and "lastfm" in str(record[0].message)
    with pytest.warns(CategoryWarning):  # from the cache too
        load_dataset("lastfm", str(tmp_path), str(tmp_path / "cache"), min_count=1)
    assert category_warning(ds) is not None


def test_a_dataset_without_categories_does_not_warn(tmp_path):
    folder = tmp_path / "video" / "sasrec"
    folder.mkdir(parents=True)
    (folder / "Video.txt").write_text(
        "".join(f"{u} {i}\n" for u in range(1, 9) for i in range(1, 7))
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", CategoryWarning)
        ds = load_dataset("video", str(tmp_path), str(tmp_path / "cache"), min_count=1)
    assert ds.stats["categories"] == 0 and ds.stats["largest_category_share"] is None


def test_the_category_rule_keys_the_cache(tmp_path, monkeypatch):
    write_s3rec(tmp_path, root_first())
    cache = tmp_path / "cache"
    load_dataset("lastfm", str(tmp_path), str(cache), min_count=1)
    load_dataset("lastfm", str(tmp_path), str(cache), min_count=1)
    assert len(list(cache.glob("lastfm-*.npz"))) == 1
    monkeypatch.setattr("lsan.data.readers.S3REC_CATEGORY_RULE", "another rule")
    ds = load_dataset("lastfm", str(tmp_path), str(cache), min_count=1)
    assert ds.category_rule == "another rule"  # not the cached dataset of the old rule
    assert len(list(cache.glob("lastfm-*.npz"))) == 2
