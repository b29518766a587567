"""SASRec: causal self-attention over the item sequence (Kang & McAuley, 2018), the strong variant.

Design choices (those of the SASRec+ re-evaluations, Klenitskiy & Vasilev 2023):
- full-softmax cross-entropy on the next item at every position (no sampled negatives);
- pre-LN blocks with a final layer norm, GeLU feed-forward, learned absolute positions;
- item embeddings N(0, 0.02), not scaled by sqrt(D); the output layer is tied to the input table,
  which is any item table (`model.item_table`: full by default, qr or codes, see item_tables);
- causal attention by default (AR); `attention` = bidirectional or local makes it auto-encoding
  (AE): Cloze training with a learned [MASK] vector and the mask appended at inference
  (lsan.models.objectives). `bert4rec` is this model with bidirectional attention, `local` with
  a window of `window` positions on both sides (the local attention of He et al., 2021).
Context inputs (category, time slot) are accepted for the shared API and ignored, except with
`use_time`: each position's time-slot embedding added to its input (off in the published model;
with `data.slot_rule=ahead` it gives SASRec the time until the request that LSAN reads, so the
two are compared on the same inputs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lsan.models.info import DataInfo
from lsan.models.item_tables import TableConfig, build_item_table
from lsan.models.layers import (
    TransformerBlock,
    apply_blocks,
    attention_mask,
    init_weights,
    last_positions,
    padding_keep,
)
from lsan.models.objectives import is_autoencoding, mask_token, with_mask_token
from lsan.models.scoring import TiedScores


@dataclass(frozen=True)
class SASRecConfig(TableConfig):
    dim: int = 64  # embedding and hidden size D
    layers: int = 2  # transformer blocks
    heads: int = 1  # attention heads per block
    dropout: float = 0.3  # dropout on embeddings, attention weights and residual branches
    ffn_mult: int = 1  # feed-forward hidden size = ffn_mult * D
    attention: str = "causal"  # causal (AR, next item) or bidirectional / local (AE, Cloze)
    window: int = 3  # local attention reach, in positions (attention = local only)
    mask_prob: float = 0.2  # Cloze masking probability (AE only)
    init_std: float = 0.02  # std of the normal initialisation
    use_time: bool = False  # add each position's time-slot embedding to its input


class SASRec(TiedScores, nn.Module):
    def __init__(self, cfg: SASRecConfig, info: DataInfo):
        super().__init__()
        self.cfg, self.info = cfg, info
        self.item_emb = build_item_table(cfg, info.num_items, cfg.dim)
        self.pos_emb = nn.Embedding(info.max_len, cfg.dim)
        self.slot = (
            nn.Embedding(info.num_slots, cfg.dim) if cfg.use_time else None
        )  # "slot": lsan.distill.slot_tensors
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(cfg.dim, cfg.heads, cfg.dropout, cfg.ffn_mult)
            for _ in range(cfg.layers)
        )
        self.ln = nn.LayerNorm(cfg.dim)
        self.mask_emb = nn.Parameter(torch.zeros(cfg.dim)) if is_autoencoding(self) else None
        init_weights(self, cfg.init_std)
        if not isinstance(self.item_emb, nn.Embedding):  # init_weights drew the full table
            self.item_emb.reset(cfg.init_std)
        if self.mask_emb is not None:
            nn.init.normal_(self.mask_emb, 0.0, cfg.init_std)

    def forward(
        self,
        items: torch.Tensor,
        cats: torch.Tensor | None = None,
        slots: torch.Tensor | None = None,
        return_weights: bool = False,
        last_only: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """Hidden state per position (B, T, D); with return_weights also per-layer attention.

        last_only: the last position alone, (B, 1, D) (inference: see apply_blocks).
        """
        keep = padding_keep(items)  # (B, T, 1)
        emb = (
            self.item_emb(items)
            if self.mask_emb is None
            else with_mask_token(self.item_emb, items, self.mask_emb, mask_token(self))
        )
        if self.slot is not None:
            if slots is None:
                raise ValueError("a SASRec with model.use_time reads the time slots: pass slots")
            emb = emb + self.slot(slots)
        x = self.drop(emb + last_positions(self.pos_emb, items.shape[1])) * keep  # (B, T, D)
        mask = attention_mask(items, self.cfg.attention, self.cfg.window)
        x, weights = apply_blocks(self.blocks, x, keep, mask, return_weights, last_only)
        h = self.ln(x)
        return (h, weights) if return_weights else h
