"""Shared building blocks: attention masks, multi-head self-attention, feed-forward, blocks.

Conventions every model follows (they are the ONNX contract too):
- Sequences are left-padded: the most recent item is at position T-1, padding (PAD = 0) first.
- Masks are additive with a finite large negative (`NEG`), never boolean, and no row is ever
  fully masked: a query may always attend to itself. Fully masked rows turn into NaN in some ONNX
  runtimes; padding queries attend to themselves and their outputs are zeroed afterwards.
- Attention is written out (matmul, softmax, matmul) rather than calling a fused kernel, so the
  attention weights can be returned for analysis and export stays a plain graph.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

PAD = 0
NEG = -1e9  # finite "minus infinity" for additive masks

ATTENTION_MODES = ("causal", "bidirectional", "local")


def attention_mask(items: torch.Tensor, mode: str = "causal", window: int = 0) -> torch.Tensor:
    """Additive mask (B, 1, T, T) from item ids (B, T): 0 where a query may look, NEG elsewhere.

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
    key_ok = (items != PAD)[:, None, None, :]  # (B, 1, 1, T)
    eye = (rel == 0)[None, None]  # (1, 1, T, T)
    ok = (allowed[None, None] & key_ok) | eye  # (B, 1, T, T)
    return torch.where(ok, 0.0, NEG).to(torch.float32)


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
        self, x: torch.Tensor, mask: torch.Tensor, return_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)  # (B, H, T, Dh)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads) + mask  # (B, H, T, T)
        weights = torch.softmax(scores, dim=-1)
        y = self.drop(weights) @ v  # (B, H, T, Dh)
        y = y.transpose(1, 2).reshape(b, t, d)  # (B, T, D)
        return self.out(y), (weights if return_weights else None)


class FeedForward(nn.Module):
    """Point-wise feed-forward: Linear -> GeLU -> dropout -> Linear."""

    def __init__(self, dim: int, hidden: int, dropout: float):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(F.gelu(self.fc1(x))))


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
        self, x: torch.Tensor, mask: torch.Tensor, return_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        a, w = self.attn(self.ln1(x), mask, return_weights)
        x = x + self.drop(a)
        x = x + self.drop(self.ffn(self.ln2(x)))
        return x, w


def apply_blocks(
    blocks: nn.ModuleList, x: torch.Tensor, keep: torch.Tensor, mask: torch.Tensor,
    return_weights: bool = False, **extra: torch.Tensor,
) -> tuple[torch.Tensor, list[torch.Tensor]]:  # fmt: skip
    """Run the blocks, re-zeroing padding positions after each; collect attention weights."""
    weights = []
    for block in blocks:
        x, w = block(x, mask, return_weights, **extra)
        x = x * keep
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


def table_sizes(num_ids: int, tables: int, m1: int = 0) -> list[int]:
    """Rows per base table so that the product covers ids 0..num_ids-1.

    m1 > 0 (the LSAN paper's knob, N = 2 style): the first table has m1 rows and the remaining
    tables split the quotient ceil(num_ids / m1) as evenly as possible. m1 = 0: balanced, each
    table about num_ids ** (1 / tables) rows.
    """
    if tables < 1:
        raise ValueError("tables must be >= 1")
    if tables == 1:
        return [num_ids]
    if m1 > 0:
        rest = table_sizes(math.ceil(num_ids / m1), tables - 1)
        return [m1, *rest]
    side = math.ceil(num_ids ** (1.0 / tables))
    sizes = [side] * tables
    # shrink the last tables while the product still covers every id
    for i in reversed(range(tables)):
        others = math.prod(sizes[:i] + sizes[i + 1 :])
        sizes[i] = math.ceil(num_ids / others)
    return sizes


def mixed_radix(ids: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """Quotient-remainder codes: (..., N) with code_n = (id div prod(sizes[:n])) mod sizes[n]."""
    codes, rest = [], ids
    for m in sizes:
        codes.append(rest % m)
        rest = torch.div(rest, m, rounding_mode="floor")
    return torch.stack(codes, dim=-1)


class CompositionalEmbedding(nn.Module):
    """N small base tables; item v selects row code_n(v) of table n (quotient-remainder).

    `base(items)` returns the N selected vectors (B, T, N, D) for a fusion layer to combine.
    `scores(h)` scores every item without building the |V| x D matrix: for each table, h . E_n
    gives (.., m_n) scores of its rows; item v's score is sum_n w[v, n] * (h . E_n)[code_n(v)] +
    b[v], the dot product with the output embedding sum_n w[v, n] E_n[code_n(v)], so it is exact.
    Because v = code_1 + m_1 code_2 + m_1 m_2 code_3 + ..., the per-table scores are laid out over
    all ids by broadcasting (an outer sum) instead of a gather: no index table is stored and the
    cost is O(sum(m_n) D + N |V|) per query instead of O(|V| D). The per-item weights w (init 1)
    and bias b (init 0) cost N + 1 numbers per item, not D.
    """

    def __init__(
        self, num_items: int, dim: int, tables: int, m1: int = 0, item_weights: bool = True
    ):
        super().__init__()
        self.num_ids = num_items + 1
        self.sizes = table_sizes(self.num_ids, tables, m1)
        self.tables = nn.ParameterList(nn.Parameter(torch.zeros(m, dim)) for m in self.sizes)
        self.item_weights = nn.Parameter(torch.ones(self.num_ids, tables)) if item_weights else None
        self.item_bias = nn.Parameter(torch.zeros(self.num_ids)) if item_weights else None

    def reset(self, std: float) -> None:
        for t in self.tables:
            nn.init.normal_(t, 0.0, std)

    def base(self, items: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, N, D) selected base vectors; padding rows are zero."""
        codes = mixed_radix(items, self.sizes)  # (B, T, N)
        vecs = torch.stack(
            [F.embedding(codes[..., n], t) for n, t in enumerate(self.tables)], dim=-2
        )
        return vecs * (items != PAD)[..., None, None].to(vecs.dtype)

    def grid_scores(self, h: torch.Tensor, mask_beyond: bool = True) -> torch.Tensor:
        """(P, D) -> (P, M) scores over every code tuple (M = prod m_n >= |V|+1).

        Ids v are laid out in row-major order over the grid (m_N, ..., m_1), so table n's row
        scores broadcast along its own axis; ids beyond the catalogue score NEG. Training uses
        these M columns directly (no slicing copy); `scores` slices the first |V|+1.
        """
        p, n_tables = h.shape[0], len(self.sizes)
        grid = list(reversed(self.sizes))  # (m_N, ..., m_1)
        pad = math.prod(self.sizes) - self.num_ids
        total = None
        if self.item_bias is not None:
            total = F.pad(self.item_bias, (0, pad), value=NEG if mask_beyond else 0.0).view(
                1, *grid
            )
        weights = F.pad(self.item_weights.T, (0, pad)) if self.item_weights is not None else None
        for n, t in enumerate(self.tables):
            shape = [p] + [1] * n_tables
            shape[n_tables - n] = self.sizes[n]
            part = F.linear(h, t).view(
                shape
            )  # (P, 1.., m_n, ..1); linear keeps one copy of t in ONNX
            if weights is not None:
                part = part * weights[n].view(1, *grid)
            total = part if total is None else total + part
        assert total is not None
        if self.item_bias is None and pad and mask_beyond:
            total = total + F.pad(
                torch.zeros(self.num_ids, device=h.device), (0, pad), value=NEG
            ).view(1, *grid)
        return total.reshape(p, -1)

    def scores(self, h: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., |V|+1) factorised scores of every item."""
        lead = h.shape[:-1]
        # the slice drops ids past the catalogue, so they need no mask (and no |V| constant in ONNX)
        flat = self.grid_scores(h.reshape(-1, h.shape[-1]), mask_beyond=False)
        return flat[:, : self.num_ids].reshape(*lead, self.num_ids)

    def score_ids(self, h: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Scores of given items only: h (P, D), ids (P, K) -> (P, K) (sampled losses)."""
        codes = mixed_radix(ids, self.sizes)  # (P, K, N)
        total = (
            self.item_bias[ids]
            if self.item_bias is not None
            else torch.zeros_like(ids, dtype=h.dtype)
        )
        for n, t in enumerate(self.tables):
            part = (h.unsqueeze(-2) * F.embedding(codes[..., n], t)).sum(-1)  # (P, K)
            total = total + (
                part * self.item_weights[ids, n] if self.item_weights is not None else part
            )
        return total

    def matrix(self) -> torch.Tensor:
        """The explicit (|V|+1, D) output matrix (tests, and LSAN's optional matrix training softmax)."""
        codes = mixed_radix(torch.arange(self.num_ids, device=self.tables[0].device), self.sizes)
        rows = [t[codes[:, n]] for n, t in enumerate(self.tables)]  # N x (|V|+1, D)
        if self.item_weights is not None:
            rows = [r * self.item_weights[:, n : n + 1] for n, r in enumerate(rows)]
        return torch.stack(rows).sum(0)


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
        b, t, d = x.shape
        y = self.conv(F.pad(x.transpose(1, 2), (self.kernel - 1, 0)))  # (B, D*H, T)
        return y.view(b, d, self.heads, t).permute(0, 3, 2, 1)  # (B, T, H, D)
