"""Time-slot rules, dependency-free (numpy only) so the serving runtime shares them with training.

Slot ids: 0 = padding, 1 = unknown; "hour": UTC hour + 2 (2..25); "weekday": Monday=0..Sunday=6,
+ 2 (2..8); "gap": the time since the user's previous interaction (2: none, the same second or,
with day-granular timestamps such as Amazon's, the same day; 3 + j: 2^j to 2^(j+1) minutes, j = 0
also under a minute, j = 22 also 8 years and more; unknown for the first interaction and for a
gap from or to an unknown timestamp or running backwards); "ahead": the same buckets for the
time until the interaction that follows (for the last one of a history, until the request: the
model is told how soon it is asked; unknown where nothing follows); "none": every interaction
is unknown.

"hour" and "weekday" read one timestamp; "gap" reads a user's whole ordered sequence, so
`time_slots` takes the sequence (`starts` marks where each user's begins in a flat array).
Why "gap": day-granular data (Amazon, Yelp) makes "hour" constant and leaves "weekday" little to
say, while the gap says "bought the same day" or "came back after a year" (TiSASRec's intervals).
"""

from __future__ import annotations

import numpy as np

PAD = 0
UNKNOWN = 1
GAP_OCTAVES = 23  # minute octaves of "gap": from 2^0 to 2^22 minutes and beyond
NUM_SLOTS = {"hour": 26, "weekday": 9, "gap": 3 + GAP_OCTAVES, "ahead": 3 + GAP_OCTAVES, "none": 2}
RULES = ("auto", *NUM_SLOTS)  # data.slot_rule: "auto" picks hour or weekday from the data


def time_slots(
    timestamps: np.ndarray | None, rule: str, starts: np.ndarray | None = None
) -> np.ndarray:
    """Slot ids for unix timestamps (seconds) under `rule`; negative entries mean unknown.

    For "gap" the timestamps are one user's, oldest first, or, with `starts` (a boolean mask,
    True where a user's sequence begins), several users' one after another.
    """
    if rule not in NUM_SLOTS:
        raise ValueError(f"unknown time-slot rule {rule!r} (known: {', '.join(NUM_SLOTS)})")
    if timestamps is None:
        return np.zeros(0, dtype=np.int64)
    ts = np.asarray(timestamps, dtype=np.int64)
    if rule == "hour":
        slots = (ts % 86400) // 3600 + 2
    elif rule == "weekday":
        slots = (ts // 86400 + 3) % 7 + 2  # 1970-01-01 was a Thursday
    elif rule == "gap":
        return gap_slots(ts, starts)
    elif rule == "ahead":
        return ahead_slots(ts, starts)
    else:
        slots = np.full(ts.shape, UNKNOWN, dtype=np.int64)
    return np.where(ts < 0, UNKNOWN, slots)


def gap_slots(ts: np.ndarray, starts: np.ndarray | None = None) -> np.ndarray:
    """The "gap" rule's slots of ordered int64 timestamps (see the module docstring)."""
    slots = np.full(ts.shape, UNKNOWN, dtype=np.int64)
    if len(ts) < 2:
        return slots
    gap = np.diff(ts)
    octave = np.minimum(np.floor(np.log2(np.maximum(gap / 60.0, 1.0))), GAP_OCTAVES - 1)
    later = np.where(gap == 0, 2, 3 + octave.astype(np.int64))
    known = (ts[1:] >= 0) & (ts[:-1] >= 0) & (gap >= 0)
    slots[1:] = np.where(known, later, UNKNOWN)
    if starts is not None:
        slots[np.asarray(starts, dtype=bool)] = UNKNOWN
    return slots


def ahead_slots(ts: np.ndarray, starts: np.ndarray | None = None) -> np.ndarray:
    """The "ahead" rule: each interaction's slot is the "gap" slot of the one after it (the
    time until it); a user's last interaction, with nothing after it, is unknown."""
    behind = gap_slots(ts, starts)  # unknown where a user begins, so no slot crosses users
    slots = np.full(ts.shape, UNKNOWN, dtype=np.int64)
    slots[:-1] = behind[1:]
    return slots
