"""Time-slot rules, dependency-free (numpy only) so the serving runtime shares them with training.

Slot ids: 0 = padding, 1 = unknown; "hour": UTC hour + 2 (2..25); "weekday": Monday=0..Sunday=6,
+ 2 (2..8); "none": every interaction is unknown.
"""

from __future__ import annotations

import numpy as np

PAD = 0
UNKNOWN = 1
NUM_SLOTS = {"hour": 26, "weekday": 9, "none": 2}


def time_slots(timestamps: np.ndarray | None, rule: str) -> np.ndarray:
    """Slot ids for unix timestamps (seconds) under `rule`; negative entries mean unknown."""
    if rule not in NUM_SLOTS:
        raise ValueError(f"unknown time-slot rule {rule!r} (known: {', '.join(NUM_SLOTS)})")
    if timestamps is None:
        return np.zeros(0, dtype=np.int64)
    ts = np.asarray(timestamps, dtype=np.int64)
    if rule == "hour":
        slots = (ts % 86400) // 3600 + 2
    elif rule == "weekday":
        slots = (ts // 86400 + 3) % 7 + 2  # 1970-01-01 was a Thursday
    else:
        slots = np.full(ts.shape, UNKNOWN, dtype=np.int64)
    return np.where(ts < 0, UNKNOWN, slots)
