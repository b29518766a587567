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
# "gap" buckets in seconds: a gap in [GAP_BOUNDS[i - 1], GAP_BOUNDS[i]) has slot i (the int64
# minimum first, so every gap finds i >= 1): a negative gap unknown (1), 0 is 2, under 2 minutes
# 3, 2^j to 2^(j+1) minutes 3 + j, and 2^22 minutes and more 3 + 22
GAP_BOUNDS = np.array(
    [np.iinfo(np.int64).min, 0, 1, *(60 << np.arange(1, GAP_OCTAVES))], dtype=np.int64
)


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
    if len(ts) > 1:
        slots[1:] = slots_between(ts)
    if starts is not None:
        slots[np.asarray(starts, dtype=bool)] = UNKNOWN
    return slots


def ahead_slots(ts: np.ndarray, starts: np.ndarray | None = None) -> np.ndarray:
    """The "ahead" rule: each interaction's slot is the "gap" slot of the one after it (the
    time until it); a user's last interaction, with nothing after it, is unknown."""
    slots = np.full(ts.shape, UNKNOWN, dtype=np.int64)
    if len(ts) > 1:
        slots[:-1] = slots_between(ts)
        if starts is not None:  # no slot crosses users
            slots[:-1][np.asarray(starts, dtype=bool)[1:]] = UNKNOWN
    return slots


def slots_between(ts: np.ndarray) -> np.ndarray:
    """The slot of each gap between consecutive timestamps (len(ts) - 1 of them).

    One binary search of each gap in GAP_BOUNDS: the server runs this on every "gap" or "ahead"
    request, with cold caches, where each numpy call costs microseconds (the log2 of the
    minutes it replaced took 16 calls and about 3x the time, for the same slots).
    """
    gap = np.diff(ts)
    unknown = ts < 0
    gap[unknown[1:] | unknown[:-1]] = -1  # from or to an unknown time: unknown, as backwards
    return np.searchsorted(GAP_BOUNDS, gap, side="right")
