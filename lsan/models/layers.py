"""Shared building blocks: attention masks, multi-head self-attention, feed-forward, blocks.

Conventions every model follows (they are the ONNX contract too):
- Sequences are left-padded: the most recent item is at position T-1, padding (PAD = 0) first.
- Masks are additive with a finite large negative (`NEG`), never boolean, and no row is ever
  fully masked: a query may always attend to itself. Fully masked rows turn into NaN in some ONNX
  runtimes; padding queries attend to themselves and their outputs are zeroed afterwards.
- Attention is written out (matmul, softmax, matmul), so the attention weights can be returned
  for analysis. The ONNX export alone runs it as onnxruntime's fused `MultiHeadAttention`
  (`attend`; GeLU likewise as its `Gelu`): the same numbers, and neither the T x T mask nor the
  head reshapes in the graph. The artifact is an onnxruntime artifact (com.microsoft ops).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

PAD = 0
NEG = -1e9  # finite "minus infinity" for additive masks

ATTENTION_MODES = ("causal", "bidirectional", "local")


def padding_keep(items: torch.Tensor) -> torch.Tensor:
    """(B, T, 1) float: 1 at real positions, 0 at padding.

    Ids are >= 0 (validated at every edge), so min(id, 1) is the indicator: one Clip in ONNX,
    shared with the attention's key mask, where `items != PAD` took Equal and Not."""
    return items.clamp(max=1).unsqueeze(-1).to(torch.float32)


def last_positions(table: nn.Embedding, t: int) -> torch.Tensor:
    """(T, D): the embeddings of the last T of max_len positions, where a left-padded history of
    T ids sits (the most recent item always has the last position).

    A slice of the table, broadcast over the batch: in ONNX Shape, Neg and one Slice, where
    looking up arange(max_len - T, max_len) took seven nodes of index arithmetic. A copy, not
    a view: a view of a parameter made under no_grad still requires grad without a grad_fn,
    which module hooks (torch's FLOP counter) refuse; the exporter drops the copy."""
    return table.weight[-t:].clone()


def mask_padding(scores: torch.Tensor) -> torch.Tensor:
    """Scores (B, |V|+1) with the padding column 0 set to NEG: id 0 is never an answer.

    Under ONNX export the scores pass unchanged: the exported graph masks column 0 with the
    excluded items (export/graph.py), where this copy would cost two passes over the catalogue."""
    if torch.onnx.is_in_onnx_export():
        return scores
    return torch.cat([torch.full_like(scores[:, :1], NEG), scores[:, 1:]], dim=1)


@dataclass(frozen=True)
class AttentionMask:
    """Where each query may look, in the two forms the two paths of `attend` read."""

    additive: torch.Tensor  # (B, 1, T, T): 0 where a query may look, NEG elsewhere
    keys: torch.Tensor  # (B, T) int64: 1 at the positions that are not padding, 0 at padding
    mode: str  # one of ATTENTION_MODES

    @property
    def fusable(self) -> bool:
        """Whether onnxruntime's MultiHeadAttention expresses it (key padding +- causal)."""
        return self.mode in ("causal", "bidirectional")


def attention_mask(items: torch.Tensor, mode: str = "causal", window: int = 0) -> AttentionMask:
    """The mask of item ids (B, T): additive (B, 1, T, T), 0 where a query may look, else NEG.

    causal: keys at or before the query; bidirectional: every key; local: keys within `window`
    positions on both sides. Padding keys are masked for every query, except a query's own
    position, so no row is ever empty.
    """
    t = items.shape[1]
    pos = torch.arange(t, device=items.device)
    rel = pos[None, :] - pos[:, None]  # (T, T) key - query
    if mode == "causal":
        allowed = rel <= 0
    elif mode == "bidirectional":
        allowed = torch.ones_like(rel, dtype=torch.bool)
    elif mode == "local":
        allowed = rel.abs() <= max(window, 1)
    else:
        raise ValueError(f"unknown attention mode {mode!r} (known: {', '.join(ATTENTION_MODES)})")
    keys = items.clamp(max=1)  # (B, T): the Clip of padding_keep (one node for both in ONNX)
    eye = (rel == 0)[None, None]  # (1, 1, T, T)
    ok = (allowed[None, None] & keys.bool()[:, None, None, :]) | eye  # (B, 1, T, T)
    return AttentionMask(torch.where(ok, 0.0, NEG).to(torch.float32), keys, mode)


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask, heads: int,
    drop: nn.Module,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """Scaled dot-product attention of q (B, Tq, H*Dh) over k, v (B, T, H*Dh), heads as
    consecutive Dh-wide slices; Tq < T queries the last Tq positions. Returns the output
    (B, Tq, H*Dh) and the weights (B, H, Tq, T).

    Under ONNX export (a fusable mask) it is one onnxruntime `MultiHeadAttention` node, causal
    when every position queries, over the non-padding keys: the matmul-softmax-matmul chain,
    the head reshapes and the T x T mask (a dozen nodes built from the ids) leave the graph,
    about 12 us of a 0.12 ms Beauty request. Rows that differ (padding queries, whose outputs
    every model zeroes) see all keys masked there: onnxruntime adds a finite -10000 to masked
    scores, so they stay finite. The weights are then not computed (None).
    """
    b, tq, width = q.shape
    t, dh = k.shape[1], width // heads
    if torch.onnx.is_in_onnx_export() and mask.fusable:
        causal = int(mask.mode == "causal" and tq == t)  # the last query sees every key anyway
        y = torch.onnx.ops.symbolic(
            "com.microsoft::MultiHeadAttention", (q, k, v, None, mask.keys.to(torch.int32)),
            {"num_heads": heads, "unidirectional": causal}, dtype=q.dtype, shape=q.shape,
            version=1,
        )  # fmt: skip
        return y, None
    qh = q.view(b, tq, heads, dh).transpose(1, 2)  # (B, H, Tq, Dh)
    kh = k.view(b, t, heads, dh).transpose(1, 2)
    vh = v.view(b, t, heads, dh).transpose(1, 2)
    scores = qh @ kh.transpose(-2, -1) / math.sqrt(dh) + mask.additive[..., -tq:, :]
    weights = torch.softmax(scores, dim=-1)  # (B, H, Tq, T)
    y = (drop(weights) @ vh).transpose(1, 2).reshape(b, tq, width)
    return y, weights


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention with an additive mask."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, mask: AttentionMask, return_weights: bool = False,
        last: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        """last = True: queries of the last position only (keys and values of all): (B, 1, D)."""
        # one matmul against the stored weight (it stays quantizable in ONNX); the queries of
        # the other positions are the only waste of `last`
        q, k, v = self.qkv(x).split(x.shape[-1], dim=-1)
        y, weights = attend(q[:, -1:] if last else q, k, v, mask, self.heads, self.drop)
        return self.out(y), (weights if return_weights else None)


def gelu(x: torch.Tensor) -> torch.Tensor:
    """Exact (erf) GeLU; under ONNX export one onnxruntime `Gelu` node, which onnxruntime fuses
    with the bias Add before it into BiasGelu (the exporter's five-node erf chain is not
    recognised: 121 -> 74 nodes with the fused attention; A/B on Beauty 0.0996 -> 0.0975 ms)."""
    if torch.onnx.is_in_onnx_export():
        return torch.onnx.ops.symbolic(
            "com.microsoft::Gelu", (x,), {}, dtype=x.dtype, shape=x.shape, version=1
        )
    return F.gelu(x)


class FeedForward(nn.Module):
    """Point-wise feed-forward: Linear -> GeLU -> dropout -> Linear."""

    def __init__(self, dim: int, hidden: int, dropout: float):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(gelu(self.fc1(x))))


class TransformerBlock(nn.Module):
    """Pre-LN transformer block: x + Attn(LN(x)), then x + FFN(LN(x))."""

    def __init__(self, dim: int, heads: int, dropout: float, ffn_mult: int = 1):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads, dropout)
        self.ln2 = nn.LayerNorm(dim)
        self.ffn = FeedForward(dim, ffn_mult * dim, dropout)
        self.drop = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, mask: AttentionMask, return_weights: bool = False,
        last: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        a, w = self.attn(self.ln1(x), mask, return_weights, last)
        x = (x[:, -1:] if last else x) + self.drop(a)
        x = x + self.drop(self.ffn(self.ln2(x)))
        return x, w


def apply_blocks(
    blocks: nn.ModuleList, x: torch.Tensor, keep: torch.Tensor, mask: AttentionMask,
    return_weights: bool = False, last_only: bool = False, **extra: torch.Tensor,
) -> tuple[torch.Tensor, list[torch.Tensor]]:  # fmt: skip
    """Run the blocks, re-zeroing padding positions after each; collect attention weights.

    last_only: the final block computes the last position alone (its query against every key),
    so the result is (B, 1, D). Exact for every attention mode, since nothing after the final
    block mixes positions; it removes most of a one-layer model's inference work.
    """
    weights = []
    for i, block in enumerate(blocks):
        last = last_only and i == len(blocks) - 1
        x, w = block(x, mask, return_weights, last=last, **extra)
        x = x * (keep[:, -1:] if last else keep)
        if w is not None:
            weights.append(w)
    return x, weights


def init_weights(module: nn.Module, std: float) -> None:
    """N(0, std) for linear and embedding weights, zero biases, unit layer norms.

    A small std matters: SASRec with N(0, 1) embeddings scaled by sqrt(D) scored below popularity
    on this protocol, N(0, 0.02) fixed it (../shared/NOTES.md).
    """
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, std)
            if m.padding_idx is not None:
                with torch.no_grad():
                    m.weight[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def next_item_loss(hidden: torch.Tensor, targets: torch.Tensor, score_fn) -> torch.Tensor:
    """Full-softmax cross-entropy at every non-padding position.

    hidden (B, T, D), targets (B, T) with PAD where there is nothing to predict. Only real
    positions are scored, which on short-sequence data (Beauty: 9 items on average, padded to 50)
    saves most of the |V|-wide matmul.
    """
    keep = targets != PAD
    logits = score_fn(hidden[keep])  # (N, |V|+1)
    return F.cross_entropy(logits, targets[keep])


class CausalDepthwiseConv(nn.Module):
    """H depth-wise 1-D convolutions over time, left-padded so position t sees t-L+1 .. t only.

    Each of the D channels has its own kernel of length L per head: O(H L D) parameters.
    Returns (B, T, H, D).
    """

    def __init__(self, dim: int, heads: int, kernel: int):
        super().__init__()
        self.heads, self.kernel = heads, kernel
        self.conv = nn.Conv1d(dim, dim * heads, kernel, groups=dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, d = x.shape  # T stays symbolic (-1): no size arithmetic in ONNX
        y = self.conv(F.pad(x.transpose(1, 2), (self.kernel - 1, 0)))  # (B, D*H, T)
        return y.view(b, d, self.heads, -1).permute(0, 3, 2, 1)  # (B, T, H, D)
