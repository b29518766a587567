"""Caser: convolutional sequence embedding (Tang & Wang, 2018).

Design choices (the paper's, except the training target):
- position t reads the window of its last L item embeddings (t-L+1 .. t, zero-padded on the
  left), an "image" of L x D; horizontal filters of heights 1..L (n_h each, ReLU, max-pooled over
  the window) catch union-level patterns (several recent items together), vertical filters
  (n_v, L x 1, linear) weight the L positions point-wise (point-level patterns);
- both are concatenated, dropped out and mapped to D by a fully connected layer with ReLU, then
  concatenated with the user embedding (2D) and scored against an output item table of width 2D
  plus a per-item bias;
- every position is computed at once from the unfolded windows (B, T, D, L), and trained with the
  full-softmax cross-entropy on the next item at every position, like the other models (the
  paper predicts the next T = 3 items of sampled windows with negative sampling);
- a horizontal filter of height h is a linear map of h stacked rows (h D -> n_h) applied to
  every sub-window, and the vertical filters a linear map over the L positions (L -> n_v) applied
  to every embedding dimension: the paper's convolutions as plain matmuls, 2-3x faster on CPU
  than 1-channel Conv2d; everything starts at N(0, init_std).
Needs user ids (`uses_users`); context inputs (category, time slot) are accepted and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lsan.models.info import DataInfo
from lsan.models.layers import PAD, init_weights, mask_padding, next_item_loss
from lsan.models.objectives import require_users


@dataclass(frozen=True)
class CaserConfig:
    dim: int = 64  # item and user embedding size D; the output table is 2D wide
    window: int = 5  # L, items in each position's window (paper: 5)
    n_h: int = 16  # horizontal filters per height 1..L (paper: 16)
    n_v: int = 4  # vertical filters (paper: 4)
    dropout: float = 0.5  # dropout on the concatenated convolution features (paper: 0.5)
    init_std: float = 0.02  # std of the normal initialisation of tables and linear layers


class Caser(nn.Module):
    uses_users = True  # the trainer and the evaluation pass users= (B,)

    def __init__(self, cfg: CaserConfig, info: DataInfo):
        super().__init__()
        require_users("caser", info.num_users)
        if cfg.window < 1:
            raise ValueError("caser window must be >= 1")
        self.cfg, self.info = cfg, info
        d, w = cfg.dim, cfg.window
        self.item_emb = nn.Embedding(info.num_items + 1, d, padding_idx=PAD)
        self.user_emb = nn.Embedding(info.num_users, d)
        self.horizontal = nn.ModuleList(nn.Linear(h * d, cfg.n_h) for h in range(1, w + 1))
        self.vertical = nn.Linear(w, cfg.n_v)
        self.drop = nn.Dropout(cfg.dropout)
        self.fc = nn.Linear(cfg.n_h * w + cfg.n_v * d, d)
        self.item_out = nn.Embedding(info.num_items + 1, 2 * d, padding_idx=PAD)
        self.item_bias = nn.Parameter(torch.zeros(info.num_items + 1))
        init_weights(self, cfg.init_std)

    def forward(self, items, cats=None, slots=None, users=None) -> torch.Tensor:
        """Hidden state per position (B, T, 2D): [conv features of the last L items ; user]."""
        if users is None:
            raise ValueError("caser scores need users= (B,) user ids")
        b, t = items.shape
        d, w = self.cfg.dim, self.cfg.window
        e = F.pad(self.item_emb(items), (0, 0, w - 1, 0))  # (B, T+L-1, D), zero on padding
        win = e.unfold(1, w, 1)  # (B, T, D, L): the window of each position
        pooled = []
        for h, filters in enumerate(self.horizontal, start=1):
            sub = win.unfold(3, h, 1).permute(0, 1, 3, 4, 2)  # (B, T, L-h+1, h, D)
            act = F.relu(filters(sub.reshape(b, t, w - h + 1, h * d)))  # (B, T, L-h+1, n_h)
            pooled.append(act.amax(2))  # max over the window: (B, T, n_h)
        vert = self.vertical(win).reshape(b, t, d * self.cfg.n_v)  # (B, T, D * n_v)
        z = F.relu(self.fc(self.drop(torch.cat([*pooled, vert], dim=-1))))  # (B, T, D)
        u = self.user_emb(users)[:, None].expand(-1, t, -1)  # (B, T, D)
        return torch.cat([z, u], dim=-1)

    def item_scores(self, h: torch.Tensor) -> torch.Tensor:
        """Scores of every item for hidden states h (..., 2D) -> (..., |V|+1)."""
        return h @ self.item_out.weight.T + self.item_bias

    def score_items(self, h: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Scores of given items: h (N, 2D), ids (N, K) -> (N, K)."""
        return (h.unsqueeze(-2) * self.item_out(ids)).sum(-1) + self.item_bias[ids]

    def loss(self, items, cats, slots, targets, users=None) -> torch.Tensor:
        return next_item_loss(self(items, cats, slots, users), targets, self.item_scores)

    def score_all(self, items, cats=None, slots=None, users=None) -> torch.Tensor:
        """Next-item scores after the last position: (B, |V|+1), padding column = NEG."""
        # the last position's window is all it reads, so only the last L items are convolved
        w = self.cfg.window
        scores = self.item_scores(self(items[:, -w:], users=users)[:, -1])
        return mask_padding(scores)
