"""SSE-PT: a personalized transformer with stochastic shared embeddings (Wu et al., 2020).

Design choices:
- SASRec's pre-LN transformer (lsan.models.layers blocks, learned absolute positions, final
  layer norm; causal by default, AE with `attention` as every attention model) whose input at each position is [item embedding ; user embedding], so the
  blocks are dim + user_dim wide;
- Stochastic Shared Embeddings, the paper's regulariser, in training mode only: with probability
  `sse_user` the user id of a sequence is replaced by a uniformly random user, and with
  probability `sse_item` each real input item by a uniformly random item; evaluation is
  deterministic. The defaults are the SSE-PT README's MovieLens-1M setting (keep the user with
  probability 0.08, each item with 0.9), with its dropout 0.2 and 2 blocks;
- the paper scores item v by <h, [v ; u]>; the user part <h_user, u> adds the same constant to
  every item of a row, so it can change neither the ranking nor the softmax or pairwise losses,
  and only the item part of h is scored against the (tied) item table;
- full-softmax cross-entropy on the next item at every position, as SASRec here.
Needs user ids (`uses_users`); context inputs (category, time slot) are accepted and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lsan.models.info import DataInfo
from lsan.models.layers import (
    PAD,
    TransformerBlock,
    apply_blocks,
    attention_mask,
    init_weights,
    last_positions,
    mask_padding,
    next_item_loss,
    padding_keep,
)
from lsan.models.objectives import (
    inference_inputs,
    is_autoencoding,
    mask_token,
    require_users,
    with_mask_token,
)


@dataclass(frozen=True)
class SSEPTConfig:
    dim: int = 64  # item embedding size; the scored part of the hidden state
    user_dim: int = 64  # user embedding size; blocks are dim + user_dim wide (paper: 50 + 50)
    layers: int = 2  # transformer blocks (paper: 2)
    heads: int = 1  # attention heads per block (paper: 1)
    dropout: float = 0.2  # dropout on embeddings, attention weights and residual branches
    ffn_mult: int = 1  # feed-forward hidden size = ffn_mult * (dim + user_dim)
    sse_user: float = 0.92  # training: probability of replacing a row's user by a random one
    sse_item: float = 0.1  # training: probability of replacing each input item by a random one
    attention: str = "causal"  # causal (AR, next item) or bidirectional / local (AE, Cloze)
    window: int = 3  # local attention reach (attention = local only)
    mask_prob: float = 0.2  # Cloze masking probability (AE only)
    init_std: float = 0.02  # std of the normal initialisation


class SSEPT(nn.Module):
    uses_users = True  # the trainer and the evaluation pass users= (B,)

    def __init__(self, cfg: SSEPTConfig, info: DataInfo):
        super().__init__()
        require_users("ssept", info.num_users)
        self.cfg, self.info = cfg, info
        width = cfg.dim + cfg.user_dim
        self.item_emb = nn.Embedding(info.num_items + 1, cfg.dim, padding_idx=PAD)
        self.user_emb = nn.Embedding(info.num_users, cfg.user_dim)
        self.pos_emb = nn.Embedding(info.max_len, width)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(width, cfg.heads, cfg.dropout, cfg.ffn_mult) for _ in range(cfg.layers)
        )
        self.ln = nn.LayerNorm(width)
        self.mask_emb = nn.Parameter(torch.zeros(cfg.dim)) if is_autoencoding(self) else None
        init_weights(self, cfg.init_std)
        if self.mask_emb is not None:
            nn.init.normal_(self.mask_emb, 0.0, cfg.init_std)

    def shared_embeddings(
        self, items: torch.Tensor, users: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """SSE: random users and items in place of some true ones (uses the global torch RNG)."""
        swap_user = torch.rand(users.shape, device=users.device) < self.cfg.sse_user
        users = torch.where(swap_user, torch.randint_like(users, self.info.num_users), users)
        real = (items != PAD) & (items != mask_token(self))  # [MASK] stays a mask
        swap_item = (torch.rand(items.shape, device=items.device) < self.cfg.sse_item) & real
        random_items = torch.randint_like(items, 1, self.info.num_items + 1)
        return torch.where(swap_item, random_items, items), users

    def forward(self, items, cats=None, slots=None, users=None) -> torch.Tensor:
        """Hidden state per position (B, T, dim + user_dim); SSE applies in training mode."""
        if users is None:
            raise ValueError("ssept scores need users= (B,) user ids")
        if self.training:
            items, users = self.shared_embeddings(items, users)
        t = items.shape[1]
        keep = padding_keep(items)  # (B, T, 1)
        u = self.user_emb(users)[:, None].expand(-1, t, -1)  # (B, T, user_dim)
        emb = self.item_emb(items) if self.mask_emb is None else with_mask_token(
            self.item_emb, items, self.mask_emb, mask_token(self)
        )  # fmt: skip
        x = torch.cat([emb, u], dim=-1)  # (B, T, dim + user_dim)
        x = self.drop(x + last_positions(self.pos_emb, t)) * keep
        mask = attention_mask(items, self.cfg.attention, self.cfg.window)
        x, _ = apply_blocks(self.blocks, x, keep, mask)
        return self.ln(x)

    def item_scores(self, h: torch.Tensor) -> torch.Tensor:
        """Scores of every item from the item part of h (..., dim + user_dim) -> (..., |V|+1)."""
        return h[..., : self.cfg.dim] @ self.item_emb.weight.T

    def score_items(self, h: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Scores of given items: h (N, dim + user_dim), ids (N, K) -> (N, K)."""
        return (h[..., None, : self.cfg.dim] * self.item_emb(ids)).sum(-1)

    def loss(self, items, cats, slots, targets, users=None) -> torch.Tensor:
        return next_item_loss(self(items, cats, slots, users), targets, self.item_scores)

    def score_all(self, items, cats=None, slots=None, users=None) -> torch.Tensor:
        """Next-item scores after the last position: (B, |V|+1), padding column = NEG."""
        if cats is None or slots is None:
            cats = slots = torch.zeros_like(items)
        items, cats, slots = inference_inputs(self, items, cats, slots)
        scores = self.item_scores(self(items, cats, slots, users)[:, -1])
        return mask_padding(scores)
