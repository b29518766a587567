"""FPMC: factorizing personalized Markov chains (Rendle et al., 2010), matrix factorisation plus a
first-order Markov chain.

Design choices:
- score(v | u, l) = <U_u, V_v> + <L_l, I_v> for user u whose item at position t is l (the paper's
  MF and factorized item-to-item transition terms; its baskets are single items here);
- written as the hidden state [U_u ; L_l] (2D) against one output table whose rows are
  [V_v ; I_v] (2D), so the full-softmax cross-entropy at every position, the sampled losses and
  the evaluation are the same as for every other model (the paper's S-BPR is `train.loss = bpr`
  with one negative);
- no dropout: the paper regularises with L2, the trainer's weight decay.
Needs user ids (`uses_users`); context inputs (category, time slot) are accepted and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lsan.models.info import DataInfo
from lsan.models.layers import PAD, init_weights, mask_padding, next_item_loss
from lsan.models.objectives import require_users


@dataclass(frozen=True)
class FPMCConfig:
    dim: int = 64  # size D of each factor (U, V, L, I); the hidden state is 2D
    init_std: float = 0.02  # std of the normal initialisation


class FPMC(nn.Module):
    uses_users = True  # the trainer and the evaluation pass users= (B,)

    def __init__(self, cfg: FPMCConfig, info: DataInfo):
        super().__init__()
        require_users("fpmc", info.num_users)
        self.cfg, self.info = cfg, info
        self.user_emb = nn.Embedding(info.num_users, cfg.dim)  # U
        self.last_emb = nn.Embedding(info.num_items + 1, cfg.dim, padding_idx=PAD)  # L
        self.item_out = nn.Embedding(info.num_items + 1, 2 * cfg.dim, padding_idx=PAD)  # [V ; I]
        init_weights(self, cfg.init_std)

    def forward(self, items, cats=None, slots=None, users=None) -> torch.Tensor:
        """Hidden state per position (B, T, 2D): [U_u ; L_{item t}], zero L part on padding."""
        if users is None:
            raise ValueError("fpmc scores need users= (B,) user ids")
        u = self.user_emb(users)[:, None].expand(-1, items.shape[1], -1)  # (B, T, D)
        return torch.cat([u, self.last_emb(items)], dim=-1)

    def item_scores(self, h: torch.Tensor) -> torch.Tensor:
        """Scores of every item for hidden states h (..., 2D) -> (..., |V|+1)."""
        return h @ self.item_out.weight.T

    def score_items(self, h: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Scores of given items: h (N, 2D), ids (N, K) -> (N, K)."""
        return (h.unsqueeze(-2) * self.item_out(ids)).sum(-1)

    def loss(self, items, cats, slots, targets, users=None) -> torch.Tensor:
        return next_item_loss(self(items, cats, slots, users), targets, self.item_scores)

    def score_all(self, items, cats=None, slots=None, users=None) -> torch.Tensor:
        """Next-item scores after the last position: (B, |V|+1), padding column = NEG."""
        # only the last item matters for the next one (first-order chain)
        scores = self.item_scores(self(items[:, -1:], users=users)[:, -1])
        return mask_padding(scores)
