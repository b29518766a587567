"""GRU4Rec: a recurrent network over the item sequence (Hidasi et al., 2016), the CE variant.

Design choices (those of RecBole's GRU4Rec, the usual baseline of the LSAN paper's table):
- item embedding -> dropout -> GRU (`layers`, hidden size D) -> linear projection to D; scores
  are dot products with the (tied) input item table;
- full-softmax cross-entropy on the next item at every position (the sessions-parallel mini-
  batches of the paper are not needed: the trainer feeds whole left-padded sequences);
- the GRU has no biases: a zero input (padding) on a zero state leaves the state at zero, so left
  padding is invisible, as for the attention models. GRU weights keep PyTorch's uniform
  initialisation (N(0, 0.02) would make the recurrence nearly inert at the start); the tables and
  the projection get N(0, init_std) like the other models.
Context inputs (category, time slot) are accepted for the shared API and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lsan.models.info import DataInfo
from lsan.models.item_tables import FullTable
from lsan.models.layers import init_weights
from lsan.models.scoring import TiedScores


@dataclass(frozen=True)
class GRU4RecConfig:
    dim: int = 64  # embedding and GRU hidden size D
    layers: int = 1  # stacked GRU layers (the paper and RecBole: 1)
    dropout: float = 0.3  # dropout on the input embeddings and between GRU layers (RecBole: 0.3)
    init_std: float = 0.02  # std of the normal initialisation of the tables and the projection


class GRU4Rec(TiedScores, nn.Module):
    def __init__(self, cfg: GRU4RecConfig, info: DataInfo):
        super().__init__()
        self.cfg, self.info = cfg, info
        self.item_emb = FullTable(info.num_items, cfg.dim)
        self.drop = nn.Dropout(cfg.dropout)
        self.gru = nn.GRU(
            cfg.dim, cfg.dim, cfg.layers, bias=False, batch_first=True,
            dropout=cfg.dropout if cfg.layers > 1 else 0.0,
        )  # fmt: skip
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        init_weights(self, cfg.init_std)

    def forward(self, items, cats=None, slots=None, last_only: bool = False) -> torch.Tensor:
        """Hidden state per position (B, T, D); position t has read items up to t."""
        x = self.drop(self.item_emb(items))  # (B, T, D), zero on padding
        out, _ = self.gru(x)  # (B, T, D)
        return self.proj(out[:, -1:] if last_only else out)
