"""Raw interactions -> a prepared sequential dataset, the same protocol for every source.

Steps (the seeds' protocol, see the papers in ../shared/papers):
1. k-core filtering: drop users and items with fewer than `min_count` interactions, repeated until
   nothing changes (the number of rounds is kept in the stats).
2. Chronological order per user with a *stable* sort, so equal timestamps keep raw file order. In
   ML-100K most users have ties among their last interactions, so this rule decides test targets.
3. Remap ids: users 0..U-1, items 1..|V| (both by ascending raw id), 0 = padding.
4. Context features: a primary category per item (0 = padding, 1 = unknown) and a time slot per
   interaction (0 = padding, 1 = unknown): hour of day (UTC) when timestamps carry hours; day of
   week when every timestamp is at midnight (day-granular Amazon dates); unknown when there are
   no timestamps.
5. Leave-one-out split is implicit in the layout: for a user with n items, the last is the test
   target, the second last the validation target, the rest the training sequence.
Prepared datasets are cached as .npz keyed by the raw files' sha256, the options and the category
rule (a changed rule never reuses an old cache). Loading warns (`CategoryWarning`) when a dataset
whose source has categories ends up with fewer than 3 of them or one holding more than 80% of the
items: the category context then carries little.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lsan.data.readers import REAL_DATASETS, DataError, RawData, read_dataset
from lsan.data.slots import NUM_SLOTS, RULES, UNKNOWN, time_slots
from lsan.data.slots import PAD as PAD  # re-exported: the padding id of items, categories, slots
from lsan.data.synthetic import SyntheticConfig, generate
from lsan.digest import file_digest

if TYPE_CHECKING:
    from lsan.config import DataConfig

PREP_VERSION = 2  # bump when preparation changes, to invalidate caches
# Generated datasets: the default (seconds to build) and a 1M-item catalogue for scale runs:
# 5.8M interactions of 2,000 users with uniform popularity, so that with data.min_count=1
# 1,007,984 distinct items occur (a catalogue holds only items that occur); 2-3 minutes to
# generate on one core, then cached like any other.
SYNTHETIC = {
    "synthetic": SyntheticConfig(),
    "synthetic-1m": SyntheticConfig(
        users=2000, items=1_130_000, categories=1000, mean_length=2800, popularity=0.0
    ),
}
DATASETS = (*REAL_DATASETS, *SYNTHETIC)
DEFAULT_MAX_LEN = {"ml-1m": 200}  # every other dataset: 50
MIN_CATEGORIES = 3  # fewer categories than this carry little context: warned
MAX_CATEGORY_SHARE = 0.8  # nor does one category holding more of the items than this


class CategoryWarning(UserWarning):
    """A dataset's item categories separate few items (see `category_warning`)."""


@dataclass
class SeqDataset:
    """A prepared dataset: per-user chronological sequences in CSR layout plus context features."""

    name: str
    offsets: np.ndarray  # (U+1,) int64: user u's interactions are [offsets[u], offsets[u+1])
    items: np.ndarray  # (N,) int64 item ids 1..|V|
    slots: np.ndarray  # (N,) int64 time-slot ids
    timestamps: np.ndarray  # (N,) int64 unix seconds (-1 when the source has none)
    item_category: np.ndarray  # (|V|+1,) int64 primary category id per item (0 for padding)
    attr_offsets: np.ndarray  # (|V|+2,) int64 CSR over items 0..|V| into attr_values
    attr_values: np.ndarray  # (A,) int64 raw attribute ids, as listed by the source
    raw_user_ids: np.ndarray  # (U,) int64
    raw_item_ids: np.ndarray  # (|V|+1,) int64, index 0 = -1 (padding)
    category_names: list[str]  # name of each category id (0 "<pad>", 1 "<unknown>")
    slot_rule: str  # "hour" (UTC hour + 2), "weekday" (Monday=0, + 2) or "none"
    category_rule: str  # how the primary category was chosen
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def num_users(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_items(self) -> int:
        return len(self.raw_item_ids) - 1

    @property
    def num_categories(self) -> int:
        return len(self.category_names)

    @property
    def num_slots(self) -> int:
        return NUM_SLOTS[self.slot_rule]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def sequence(self, user: int) -> np.ndarray:
        return self.items[self.offsets[user] : self.offsets[user + 1]]


def slot_rule_for(timestamps: np.ndarray | None) -> str:
    if timestamps is None or len(timestamps) == 0:
        return "none"
    return "weekday" if bool(np.all(timestamps % 86400 == 0)) else "hour"


def kcore(users: np.ndarray, items: np.ndarray, k: int) -> tuple[np.ndarray, int]:
    """Boolean keep-mask of the k-core (users and items with >= k interactions) and the rounds."""
    keep = np.ones(len(users), dtype=bool)
    rounds = 0
    while True:
        rounds += 1
        _, u_inv, u_cnt = np.unique(users[keep], return_inverse=True, return_counts=True)
        _, i_inv, i_cnt = np.unique(items[keep], return_inverse=True, return_counts=True)
        ok = (u_cnt[u_inv] >= k) & (i_cnt[i_inv] >= k)
        if ok.all():
            return keep, rounds
        idx = np.flatnonzero(keep)
        keep[idx[~ok]] = False


def build(raw: RawData, name: str, min_count: int) -> SeqDataset:
    """Apply the protocol (filter, order, remap, context features) to raw interactions."""
    n_raw = len(raw.users)
    keep, rounds = kcore(raw.users, raw.items, min_count)
    users, items = raw.users[keep], raw.items[keep]
    ts = raw.timestamps[keep] if raw.timestamps is not None else None
    if len(users) == 0:
        raise DataError(f"{name}: no interactions survive {min_count}-core filtering")
    order = np.lexsort((ts, users)) if ts is not None else np.argsort(users, kind="stable")
    users, items = users[order], items[order]
    ts = ts[order] if ts is not None else None

    raw_users, user_idx = np.unique(users, return_inverse=True)
    raw_items, item_idx = np.unique(items, return_inverse=True)
    offsets = np.concatenate([[0], np.cumsum(np.bincount(user_idx, minlength=len(raw_users)))])

    labels = sorted({raw.item_category[i] for i in raw_items.tolist() if i in raw.item_category})
    cat_id = {lab: j + 2 for j, lab in enumerate(labels)}
    item_category = np.zeros(len(raw_items) + 1, dtype=np.int64)
    item_category[1:] = [
        cat_id.get(raw.item_category.get(i, ""), UNKNOWN) for i in raw_items.tolist()
    ]
    attr_lists: list[list[int]] = [[]] + [
        raw.item_attributes.get(i, []) for i in raw_items.tolist()
    ]
    attr_offsets = np.concatenate([[0], np.cumsum([len(a) for a in attr_lists])]).astype(np.int64)
    attr_values = np.asarray([a for lst in attr_lists for a in lst], dtype=np.int64)

    rule = slot_rule_for(ts)
    slots = time_slots(ts, rule) if ts is not None else np.full(len(items), UNKNOWN, dtype=np.int64)
    ds = SeqDataset(
        name=name,
        offsets=offsets.astype(np.int64),
        items=(item_idx + 1).astype(np.int64),
        slots=slots.astype(np.int64),
        timestamps=ts if ts is not None else np.full(len(items), -1, dtype=np.int64),
        item_category=item_category,
        attr_offsets=attr_offsets,
        attr_values=attr_values,
        raw_user_ids=raw_users.astype(np.int64),
        raw_item_ids=np.concatenate([[-1], raw_items]).astype(np.int64),
        category_names=["<pad>", "<unknown>", *labels],
        slot_rule=rule,
        category_rule=raw.category_rule,
    )
    ds.stats = dataset_stats(ds) | {
        "raw_interactions": int(n_raw),
        "min_count": min_count,
        "filter_rounds": rounds,
        "removed_interactions": int(n_raw - len(items)),
        "ties_rule": "stable sort by timestamp; ties keep raw file order",
    }
    return ds


def dataset_stats(ds: SeqDataset) -> dict[str, Any]:
    """The seeds' dataset table row."""
    n = len(ds.items)
    return {
        "dataset": ds.name,
        "users": ds.num_users,
        "items": ds.num_items,
        "interactions": n,
        "avg_length": round(n / max(ds.num_users, 1), 2),
        "density": n / max(ds.num_users * ds.num_items, 1),
        "categories": ds.num_categories - 2,
        "largest_category_share": largest_category_share(ds),
        "time_slots": ds.num_slots - 2,
        "slot_rule": ds.slot_rule,
        "category_rule": ds.category_rule,
    }


def largest_category_share(ds: SeqDataset) -> float | None:
    """Share of the items in the most common category ("unknown" counts as one); None if none."""
    if ds.num_categories <= 2 or ds.num_items == 0:
        return None
    counts = np.bincount(ds.item_category[1:], minlength=ds.num_categories)
    return round(float(counts.max() / ds.num_items), 4)


def category_warning(ds: SeqDataset) -> str | None:
    """Why `ds`'s categories carry little information, or None (also when its source has none)."""
    share = largest_category_share(ds)
    count = ds.num_categories - 2
    if share is None or (count >= MIN_CATEGORIES and share <= MAX_CATEGORY_SHARE):
        return None
    return (
        f"{ds.name}: uninformative item categories: {count} categories, the largest holds "
        f"{share:.0%} of the items (wanted >= {MIN_CATEGORIES} and <= {MAX_CATEGORY_SHARE:.0%}; "
        f"rule: {ds.category_rule})"
    )


# ---------------------------------------------------------------- locations and cache


def data_root(data_dir: str = "") -> Path:
    return Path(data_dir or os.environ.get("LSAN_DATA_DIR", "") or "data").expanduser()


def cache_root(cache_dir: str = "") -> Path:
    default = Path.home() / ".cache" / "lsan"
    return Path(cache_dir or os.environ.get("LSAN_CACHE_DIR", "") or default).expanduser()


_ARRAYS = (
    "offsets", "items", "slots", "timestamps", "item_category",
    "attr_offsets", "attr_values", "raw_user_ids", "raw_item_ids",
)  # fmt: skip


def _save(ds: SeqDataset, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # one temporary file per process: concurrent writers (torchrun ranks) never share it
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
    meta = {
        k: getattr(ds, k) for k in ("name", "category_names", "slot_rule", "category_rule", "stats")
    }
    np.savez(tmp, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
             **{k: getattr(ds, k) for k in _ARRAYS})  # fmt: skip
    os.replace(tmp, path)


def _load(path: Path) -> SeqDataset:
    with np.load(path) as z:
        meta = json.loads(z["meta"].tobytes().decode())
        return SeqDataset(**{k: z[k] for k in _ARRAYS}, **meta)


def load_dataset(
    name: str,
    data_dir: str = "",
    cache_dir: str = "",
    min_count: int = 5,
    use_cache: bool = True,
    slot_rule: str = "auto",
) -> SeqDataset:
    """Prepared dataset `name`, from the cache when the raw files and options are unchanged;
    its time slots by `slot_rule` ("auto": hour or weekday, whichever the timestamps resolve)."""
    if name not in DATASETS:
        raise DataError(f"unknown dataset '{name}' (known: {', '.join(DATASETS)})")
    if slot_rule not in RULES:
        raise DataError(f"unknown time-slot rule {slot_rule!r} (known: {', '.join(RULES)})")
    if name in SYNTHETIC:
        gen = SYNTHETIC[name]
        key_src = f"{PREP_VERSION}|{name}|{gen}|{min_count}"
        raw = None
    else:
        raw = read_dataset(name, data_root(data_dir))
        hashes = [f"{p.name}:{file_digest(p)}" for p in raw.files]
        key_src = f"{PREP_VERSION}|{name}|{min_count}|{raw.category_rule}|{'|'.join(hashes)}"
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    path = cache_root(cache_dir) / f"{name}-{key}.npz"
    ds = None
    if use_cache and path.is_file():
        try:
            ds = _load(path)
        except (OSError, ValueError, KeyError):
            path.unlink(missing_ok=True)  # a corrupt cache entry is rebuilt, never trusted
    if ds is None:
        ds = build(raw if raw is not None else generate(gen), name, min_count)
        if use_cache:
            with contextlib.suppress(OSError):  # an unwritable cache only costs time
                _save(ds, path)
    message = category_warning(ds)
    if message is not None:
        warnings.warn(message, CategoryWarning, stacklevel=2)
    return with_slot_rule(ds, slot_rule)


def load_configured(data: DataConfig, data_dir: str = "", cache_dir: str = "") -> SeqDataset:
    """The dataset a run's `data` config names (`data_dir` / `cache_dir` override its own)."""
    return load_dataset(data.dataset, data_dir or data.data_dir, cache_dir or data.cache_dir,
                        data.min_count, slot_rule=data.slot_rule)  # fmt: skip


def with_slot_rule(ds: SeqDataset, rule: str) -> SeqDataset:
    """`ds` with its time slots by `rule` ("auto": as `build` chose them); cheap, so uncached."""
    if rule == "auto":
        rule = slot_rule_for(ds.timestamps) if bool(np.any(ds.timestamps >= 0)) else "none"
    if rule == ds.slot_rule:
        return ds
    starts = np.zeros(len(ds.items), dtype=bool)
    starts[ds.offsets[:-1][ds.lengths > 0]] = True
    slots = time_slots(ds.timestamps, rule, starts)
    stats = ds.stats | {"time_slots": NUM_SLOTS[rule] - 2, "slot_rule": rule}
    return replace(ds, slots=slots, slot_rule=rule, stats=stats)


def default_max_len(name: str) -> int:
    return DEFAULT_MAX_LEN.get(name, 50)
