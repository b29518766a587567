"""Popularity: every item scored by its number of training interactions (the sanity floor)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lsan.models.info import DataInfo
from lsan.models.layers import NEG


@dataclass(frozen=True)
class PopConfig:
    pass


class Pop(nn.Module):
    trainable = False  # closed form: the trainer calls fit_counts and skips gradient steps
    counts: torch.Tensor

    def __init__(self, cfg: PopConfig, info: DataInfo):
        super().__init__()
        self.cfg, self.info = cfg, info
        self.register_buffer("counts", torch.zeros(info.num_items + 1))

    def fit_counts(self, counts: torch.Tensor) -> None:
        self.counts.copy_(counts.to(self.counts))

    def forward(self, items, cats=None, slots=None) -> torch.Tensor:
        return torch.zeros(*items.shape, 1, device=items.device)

    def loss(self, items, cats, slots, targets) -> torch.Tensor:
        return torch.zeros((), device=items.device)

    def score_all(self, items, cats=None, slots=None) -> torch.Tensor:
        scores = self.counts[None].expand(items.shape[0], -1).clone()  # (B, |V|+1)
        scores[:, 0] = NEG
        return scores
