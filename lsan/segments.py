"""Where two rankers differ: NDCG@10 and the paired difference per segment of the users.

A gap of 0.001 over a whole test split can be the sum of opposite gaps in its parts (on Beauty,
stop 52: LSAN's student ahead of SASRec's when the target comes the same day as the last item,
behind when it follows days later). Each user falls in one segment of each partition below,
all read from the data and the split, none from the models:

- `history`: items before the split's target: 1-3, 4-7, 8-15, 16 or more;
- `target`: the target among the most popular items that together take half of the training
  interactions (`head`), or not (`tail`);
- `gap`: the time from the last history item to the target: under a day, 1-7 days, 8-60,
  over 60, or unknown (a timestamp missing or running backwards); only with timestamps;
- `category`: the target's category the same as the last history item's, another, or unknown
  (either unknown); only where the data has categories.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lsan.data.batching import item_counts
from lsan.data.prepare import SeqDataset
from lsan.paired import paired, user_scores

DAY = 86400
HISTORY = ((1, 3), (4, 7), (8, 15), (16, None))
GAP_DAYS = (("under 1 day", 0, 0), ("1-7 days", 1, 7), ("8-60 days", 8, 60),
            ("over 60 days", 61, None))  # fmt: skip
UNKNOWN_CATEGORY = 1  # category ids: 0 padding, 1 unknown (lsan.data.prepare)


def _bucket(values: np.ndarray, lo: int, hi: int | None) -> np.ndarray:
    return (values >= lo) & (values <= hi if hi is not None else True)


def head_items(ds: SeqDataset) -> np.ndarray:
    """(|V|+1,) bool: the fewest most popular items that take half of the training interactions
    (ties by id)."""
    counts = item_counts(ds)
    order = np.argsort(-counts, kind="stable")
    covered = np.cumsum(counts[order]) / max(counts.sum(), 1.0)
    head = np.zeros(len(counts), dtype=bool)
    head[order[: int(np.searchsorted(covered, 0.5)) + 1]] = True
    return head


def segments(ds: SeqDataset, split: str) -> dict[str, dict[str, np.ndarray]]:
    """{partition: {segment: boolean mask over the users, in user order}} for `split`; empty
    segments are left out."""
    target_at = ds.offsets[1:] - (2 if split == "valid" else 1)
    last_at = target_at - 1  # every user has at least one history item before either target
    history = target_at - ds.offsets[:-1]
    out: dict[str, dict[str, np.ndarray]] = {
        "history": {
            f"{lo}+" if hi is None else f"{lo}-{hi}": _bucket(history, lo, hi) for lo, hi in HISTORY
        },  # fmt: skip
    }
    head = head_items(ds)
    targets = ds.items[target_at]
    out["target"] = {"head (half the training interactions)": head[targets],
                     "tail": ~head[targets]}  # fmt: skip
    t_last, t_target = ds.timestamps[last_at], ds.timestamps[target_at]
    if bool(np.any(ds.timestamps >= 0)):
        known = (t_last >= 0) & (t_target >= t_last)
        days = np.where(known, (t_target - t_last) // DAY, -1)
        out["gap"] = {name: known & _bucket(days, lo, hi) for name, lo, hi in GAP_DAYS}
        out["gap"]["unknown"] = ~known
    if ds.num_categories > 2:
        c_last, c_target = ds.item_category[ds.items[last_at]], ds.item_category[targets]
        unknown = (c_last == UNKNOWN_CATEGORY) | (c_target == UNKNOWN_CATEGORY)
        out["category"] = {"same as the last item's": ~unknown & (c_last == c_target),
                           "another": ~unknown & (c_last != c_target), "unknown": unknown}  # fmt: skip
    return {p: {s: m for s, m in parts.items() if m.any()} for p, parts in out.items()}


def segment_rows(
    parts: dict[str, dict[str, np.ndarray]], ranks: list[np.ndarray], k: int = 10
) -> list[dict[str, Any]]:
    """One row per segment: its users and share, each ranker's NDCG@k on it (`ndcg`, in the
    order of `ranks`) and the first's minus each other's, paired over the segment's users
    (`first_minus`, one per ranker after the first; none for a segment of one user). A ranker
    may be several checkpoints, ranks (checkpoints, users): their mean (lsan.paired)."""
    rows = []
    for partition, parts_of in parts.items():
        for segment, mask in parts_of.items():
            rows.append({
                "partition": partition, "segment": segment, "users": int(mask.sum()),
                "share": float(mask.mean()),
                "ndcg": [float(user_scores(r[..., mask], k).mean()) for r in ranks],
                "first_minus": [paired(ranks[0][..., mask], r[..., mask], k).as_dict()
                                for r in ranks[1:]] if mask.sum() >= 2 else [],
            })  # fmt: skip
    return rows
