"""Hugging Face transformer backbones (GPT-2, Llama, BERT, ALBERT) as sequence encoders.

The seed paper's plug-in: any transformer stack from the `transformers` library, configured small
and initialised from scratch (no hub download), runs inside this project's item embedding,
objective, training and evaluation. Install the extra with `pip install -e '.[hf]'`.

- Input: item embeddings (tied with the output, N(0, init_std)) fed as `inputs_embeds`, with
  right-aligned `position_ids` (the most recent item always at max_len - 1, as in SASRec) and
  the padding mask; outputs at padding positions are zeroed.
- AE/AR as everywhere (lsan.models.objectives): `attention = causal` trains the next item,
  `bidirectional` trains Cloze with a [MASK] vector. GPT-2 and Llama are causal by construction
  (AR only), ALBERT has no decoder mode (AE only), BERT does both (`is_decoder`). Local attention
  is not offered: the libraries' masks cannot express it without patching their internals.
- `return_weights` asks the backbone for its attention maps (eager attention), for analysis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lsan.config import ConfigError
from lsan.models.info import DataInfo
from lsan.models.item_tables import FullTable
from lsan.models.layers import PAD, init_weights
from lsan.models.objectives import (
    is_autoencoding,
    mask_token,
    with_mask_token,
)
from lsan.models.scoring import TiedScores

BACKBONES = {"gpt2": ("causal",), "llama": ("causal",), "bert": ("causal", "bidirectional")}
BACKBONES["albert"] = ("bidirectional",)


@dataclass(frozen=True)
class HFConfig:
    backbone: str = "gpt2"  # gpt2, llama (AR only), bert (AE or AR), albert (AE only)
    dim: int = 64  # hidden size D
    layers: int = 2  # transformer layers
    heads: int = 2  # attention heads
    dropout: float = 0.3  # hidden and attention dropout
    attention: str = "causal"  # causal (AR, next item) or bidirectional (AE, Cloze)
    mask_prob: float = 0.2  # Cloze masking probability (AE only)
    init_std: float = 0.02  # std of the normal initialisation


def backbone(cfg: HFConfig, max_len: int) -> nn.Module:
    """A from-scratch `transformers` model of the configured family and size."""
    if cfg.backbone not in BACKBONES:
        raise ConfigError(f"unknown backbone '{cfg.backbone}' (known: {', '.join(BACKBONES)})")
    if cfg.attention not in BACKBONES[cfg.backbone]:
        raise ConfigError(
            f"backbone '{cfg.backbone}' supports attention {', '.join(BACKBONES[cfg.backbone])}"
            f", not '{cfg.attention}'"
        )
    try:
        import transformers as hf
    except ImportError:
        raise ConfigError(
            "Hugging Face backbones need the optional extra: pip install -e '.[hf]'"
        ) from None
    common: dict[str, Any] = dict(
        vocab_size=1, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        initializer_range=cfg.init_std, attn_implementation="eager",
    )  # fmt: skip
    d, h, n, p = cfg.dim, cfg.heads, cfg.layers, cfg.dropout
    if cfg.backbone == "gpt2":
        gpt2 = hf.GPT2Config(
            n_embd=d, n_head=h, n_layer=n, n_positions=max_len, n_inner=d,
            resid_pdrop=p, embd_pdrop=p, attn_pdrop=p, **common,
        )  # fmt: skip
        return hf.GPT2Model(gpt2)
    if cfg.backbone == "llama":
        llama = hf.LlamaConfig(
            hidden_size=d, num_attention_heads=h, num_key_value_heads=h, num_hidden_layers=n,
            intermediate_size=d, max_position_embeddings=max_len, attention_dropout=p, **common,
        )  # fmt: skip
        return hf.LlamaModel(llama)
    bert_like: dict[str, Any] = dict(
        hidden_size=d, num_attention_heads=h, num_hidden_layers=n, intermediate_size=d,
        max_position_embeddings=max_len, hidden_dropout_prob=p,
        attention_probs_dropout_prob=p, hidden_act="gelu", **common,
    )  # fmt: skip
    if cfg.backbone == "bert":
        bert = hf.BertConfig(is_decoder=cfg.attention == "causal", **bert_like)
        return hf.BertModel(bert, add_pooling_layer=False)
    albert = hf.AlbertConfig(embedding_size=d, **bert_like)
    return hf.AlbertModel(albert, add_pooling_layer=False)


class HFRecommender(TiedScores, nn.Module):
    def __init__(self, cfg: HFConfig, info: DataInfo):
        super().__init__()
        self.cfg, self.info = cfg, info
        self.item_emb = FullTable(info.num_items, cfg.dim)
        self.mask_emb = nn.Parameter(torch.zeros(cfg.dim)) if is_autoencoding(self) else None
        init_weights(self, cfg.init_std)  # before the backbone: it initialises itself
        if self.mask_emb is not None:
            nn.init.normal_(self.mask_emb, 0.0, cfg.init_std)
        self.backbone = backbone(cfg, info.max_len)
        # items enter as inputs_embeds: the backbone's own token table is never used; frozen, so
        # DDP (which requires every trainable parameter to get a gradient) accepts the model
        self.backbone.get_input_embeddings().requires_grad_(False)  # type: ignore[operator]

    def forward(self, items, cats=None, slots=None, return_weights: bool = False, last_only=False):
        """Hidden state per position (B, T, D); with return_weights also per-layer attention."""
        b, t = items.shape
        keep = items != PAD
        emb = self.item_emb(items) if self.mask_emb is None else with_mask_token(
            self.item_emb, items, self.mask_emb, mask_token(self)
        )  # fmt: skip
        pos = torch.arange(self.info.max_len - t, self.info.max_len, device=items.device)
        out = self.backbone(
            inputs_embeds=emb,
            attention_mask=keep.long(),
            position_ids=pos[None].expand(b, t),
            output_attentions=return_weights,
        )
        h = out.last_hidden_state * keep.unsqueeze(-1).to(emb.dtype)
        h = h[:, -1:] if last_only else h  # the backbone runs every position (no saving here)
        return (h, list(out.attentions)) if return_weights else h
