"""Prebuilt, left-padded tensors for training and evaluation (no per-sample Python at step time).

Leave-one-out layout of a user with n chronological items s[0..n-1]:
- training: inputs s[0..n-4], targets s[1..n-3] (the last max_len of them),
- validation: history s[0..n-3], target s[n-2],
- test: history s[0..n-2], target s[n-1] (the validation item is history, as in SASRec/RecBole).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lsan.data.prepare import PAD, SeqDataset

SPLITS = ("valid", "test")


@dataclass
class SeqTensors:
    """Aligned (B, T) tensors; `targets` only for training, `target` (B,) only for evaluation."""

    items: torch.Tensor
    cats: torch.Tensor
    slots: torch.Tensor
    targets: torch.Tensor | None = None
    target: torch.Tensor | None = None
    users: torch.Tensor | None = None  # (B,) user index of each row
    next_cats: torch.Tensor | None = None  # training only: categories aligned with `targets`
    next_slots: torch.Tensor | None = None  # training only: time slots aligned with `targets`

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> SeqTensors:
        values: dict[str, Any] = {f: getattr(self, f) for f in self.__dataclass_fields__}
        mapped: dict[str, Any] = {f: None if v is None else fn(v) for f, v in values.items()}
        return SeqTensors(**mapped)

    def rows(self, idx: torch.Tensor) -> SeqTensors:
        return self._map(lambda t: t[idx])

    def to(self, device: torch.device) -> SeqTensors:
        return self._map(lambda t: t.to(device, non_blocking=True))

    def __len__(self) -> int:
        return self.items.shape[0]


def windows(values: np.ndarray, starts: np.ndarray, ends: np.ndarray, length: int) -> np.ndarray:
    """Right-aligned windows values[max(start, end-length):end], left-padded with PAD: (B, length)."""
    idx = ends[:, None] - length + np.arange(length)[None, :]  # (B, length)
    valid = idx >= starts[:, None]
    return np.where(valid, values[np.clip(idx, 0, len(values) - 1)], PAD)


def _context(
    ds: SeqDataset, items: np.ndarray, starts, ends, length
) -> tuple[np.ndarray, np.ndarray]:
    cats = ds.item_category[items]  # PAD items map to category PAD
    slots = windows(ds.slots, starts, ends, length)
    return cats, slots


def train_tensors(ds: SeqDataset, max_len: int) -> SeqTensors:
    """One training row per user: the last max_len next-item steps of the training part."""
    starts, ends = ds.offsets[:-1], ds.offsets[1:] - 2  # training part is [start, end)
    items = windows(ds.items, starts, ends - 1, max_len)
    targets = windows(ds.items, starts + 1, ends, max_len)
    cats, slots = _context(ds, items, starts, ends - 1, max_len)
    next_cats, next_slots = _context(ds, targets, starts + 1, ends, max_len)
    t = lambda a: torch.as_tensor(np.ascontiguousarray(a), dtype=torch.long)
    return SeqTensors(
        t(items), t(cats), t(slots), targets=t(targets), users=torch.arange(ds.num_users),
        next_cats=t(next_cats), next_slots=t(next_slots),
    )  # fmt: skip


def eval_tensors(ds: SeqDataset, split: str, max_len: int) -> SeqTensors:
    """One evaluation row per user: the last max_len history items before the split's target."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} (known: {', '.join(SPLITS)})")
    starts = ds.offsets[:-1]
    ends = ds.offsets[1:] - (2 if split == "valid" else 1)  # the target's flat index
    items = windows(ds.items, starts, ends, max_len)
    cats, slots = _context(ds, items, starts, ends, max_len)
    t = lambda a: torch.as_tensor(np.ascontiguousarray(a), dtype=torch.long)
    return SeqTensors(
        t(items), t(cats), t(slots), target=t(ds.items[ends]), users=torch.arange(ds.num_users)
    )


def history_pairs(ds: SeqDataset, users: np.ndarray, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(row, item) pairs of every item in each user's full history before the split's target."""
    starts = ds.offsets[users]
    ends = ds.offsets[users + 1] - (2 if split == "valid" else 1)
    lengths = ends - starts
    rows = np.repeat(np.arange(len(users)), lengths)
    flat = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return rows, ds.items[np.repeat(starts, lengths) + flat]


def item_counts(ds: SeqDataset) -> np.ndarray:
    """Training interactions per item (|V|+1,), the validation and test targets excluded."""
    lengths = ds.lengths - 2
    flat = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    train_items = ds.items[np.repeat(ds.offsets[:-1], lengths) + flat]
    return np.bincount(train_items, minlength=ds.num_items + 1).astype(np.float32)
