"""Item tables: how a model stores its items, behind one interface every model can take.

A table maps item ids (0 = padding, 1..|V|) to vectors and scores hidden states against every
item. It is the whole of a small model's bytes, so compression lives here, apart from the
encoder: `model.item_table` switches it for `sasrec` and `lsan` alike, so the gain of compression
and the gain of LSAN's architecture are measured apart.

The interface (every table):
- `base(items)`: (B, T) -> (B, T, N, D), the N vectors an item is composed of (N = 1 for a full
  table); LSAN fuses them with context attention;
- `forward(items)`: (B, T) -> (B, T, D), their sum (what a plain model embeds with);
- `scores(h)`: (..., D) -> (..., |V|+1), the score of every id, index 0 included;
- `score_ids(h, ids)`: h (P, D), ids (P, K) -> (P, K), the scores of given ids (sampled losses);
- `matrix()`: the explicit (|V|+1, D) output matrix (distillation, code assignment, tests);

Tables:
- `full`: one |V|+1 x D matrix (an `nn.Embedding`, so checkpoints of the plain models still load).
- `qr`: the LSAN paper's quotient-remainder composition: N base tables indexed by mixed-radix
  codes of the id (m1 / balanced sizes). Nothing per item is stored but the optional output
  weights and bias; scoring lays the tables out over the id grid by broadcasting.
- `codes`: N codebooks and an integer table `codes` (|V|+1, N) that says which codeword of each
  book an item uses: the assignment is data (popularity, a teacher's k-means, or arithmetic),
  saved in the checkpoint as a buffer and in the ONNX graph as a uint8 / int16 initializer.
  An item's vector is the sum of its codewords (additive / residual quantization). Scoring
  computes h . codebook_n once per book (P, m_n) and gathers each item's entries: the cost is
  O(sum(m_n) D + N |V|), with no |V| x D matrix.
- `pq`: the same code table over product-quantized books: book n holds D/N-wide codewords for
  dimensions [n D/N, (n+1) D/N), and an item's vector is their concatenation. At the same bytes
  per item (N codes) the books are N times smaller and a teacher's vectors are reconstructed far
  better than by residual codes (sub-space k-means); scoring is one batched (N, P, D/N) x
  (N, D/N, m) matmul plus the same gather. An own-rows book stays full width (added).

Per-item output weights w (N per item, init 1) and bias b (init 0) are optional on the
compositional tables: score(v) = sum_n w[v, n] (h . E_n[code_n(v)]) + b[v]. They let items that
share codewords still rank apart; they cost N + 1 numbers per item, counted like anything else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lsan.models import rowquant
from lsan.models.layers import NEG, PAD, padding_keep

ITEM_TABLES = ("full", "qr", "codes", "pq")
BIAS_BITS = 4  # a low-bit table's output bias: 6 KB for Beauty's 12,102 ids
CODE_SOURCES = ("arithmetic", "popularity", "teacher")
TRAIN_SCORES = ("factorised", "matrix")


@dataclass(frozen=True)
class TableConfig:
    """The item-table fields shared by every model config that takes `model.item_table`."""

    item_table: str = "full"  # full, qr (the LSAN paper's quotient-remainder), codes or pq
    tables: int = 2  # qr: N base tables; codes / pq: N codebooks (plus the own-rows book)
    m1: int = 0  # qr: rows of the first table (the paper's knob); 0 = balanced tables
    code_size: int = 256  # codes: rows per codebook (<= 256 stores each code in one byte)
    own_rows: int = 0  # codes: the H most popular items get a row of their own (hybrid)
    codes_from: str = "popularity"  # codes: arithmetic, popularity or teacher (k-means)
    item_weights: bool = False  # per-item output weights + bias (N + 1 numbers per item)
    train_scores: str = "matrix"  # training softmax: matrix (one matmul) or factorised
    bits: int = 0  # full: train and ship each row at this many bits (1, 2, 4, 8); 0 = float
    hot_rows: int = 0  # full with bits: the H most popular items get hot_bits instead
    hot_bits: int = 4  # bits of the hot rows
    refresh_steps: bool = True  # choose each row's step again every epoch (False: keep the first)
    item_bias: bool = False  # full: a per-item output bias (a low-bit table's at BIAS_BITS)

    @property
    def full_table(self) -> bool:
        return self.item_table == "full"


class FullTable(nn.Embedding):
    """One row per id: the plain |V|+1 x D table (tied input and output).

    With `item_bias` every item also gets an output bias (scores h . e_v + b_v, starting at 0).
    A tied table already scores a bias through the final LayerNorm's shift (beta . e_v), but
    only one that the rows' own directions allow; a bias of its own, fitted alone after a
    Beauty model was trained, added 0.0005-0.0012 test NDCG@10 (stop 44, docs/)."""

    def __init__(self, num_items: int, dim: int, item_bias: bool = False):
        super().__init__(num_items + 1, dim, padding_idx=PAD)
        self.bias = nn.Parameter(torch.zeros(num_items + 1)) if item_bias else None

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        return F.embedding(items, self.matrix(), PAD)

    def base(self, items: torch.Tensor) -> torch.Tensor:
        return self(items).unsqueeze(-2)

    def scores(self, h: torch.Tensor) -> torch.Tensor:
        out = h @ self.matrix().T
        return out if self.bias is None else out + self.output_bias()

    def score_ids(self, h: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        out = (h.unsqueeze(-2) * self(ids)).sum(-1)
        return out if self.bias is None else out + self.output_bias()[ids]

    def output_bias(self) -> torch.Tensor:
        """The per-item output bias (|V|+1,) as scores add it (only with `item_bias`)."""
        assert self.bias is not None
        return self.bias

    def matrix(self) -> torch.Tensor:
        return self.weight

    def reset(self, std: float) -> None:
        nn.init.normal_(self.weight, 0.0, std)
        with torch.no_grad():
            self.weight[PAD].zero_()
            if self.bias is not None:
                self.bias.zero_()


class LowBitTable(FullTable):
    """A full table trained through its row-wise low-bit grid (lsan/models/rowquant.py).

    Every read (embedding, scores: FullTable reads through `matrix()`) sees the quantized rows,
    gradients reach the float
    weights straight through, so what the export packs is exactly what was trained and
    evaluated. Buffers (saved with the weights): `row_bits`, each row's width (the `hot_rows`
    most popular items get `hot_bits`, set from training counts by `assign_hot`), and
    `row_exps`, each row's step exponent, chosen again from the weights whenever the table
    enters training mode (once per epoch), or, with `refresh_steps=False`, only when the
    weights are set from outside (`refresh()`: a start from a float checkpoint): the model then
    fine-tunes on one fixed grid. A grid chosen anew moves rows the model had adapted to
    (re-choosing the steps of a trained Beauty table cost 0.0009 test NDCG@10, 0.0532 -> 0.0523),
    yet fine-tuning either way ended equal on Beauty (0.0533 fixed, 0.0532 refreshed).
    `freeze_to_grid()` replaces the weights by their quantized values once (the export traces those).
    An output bias (`item_bias`) lives on a grid of its own: BIAS_BITS a value and one step
    (`bias_exp`), chosen again at every training read (one vector, about a millisecond), so a
    bias that starts at zero is never clipped to its first tiny step for a whole epoch.
    """

    def __init__(
        self, num_items: int, dim: int, bits: int, hot_rows: int = 0, hot_bits: int = 4,
        refresh_steps: bool = True, item_bias: bool = False,
    ):  # fmt: skip
        super().__init__(num_items, dim, item_bias)
        self.row_bits: torch.Tensor  # buffers, declared for type checkers
        self.row_exps: torch.Tensor
        self.bias_exp: torch.Tensor
        if item_bias:  # only then: checkpoints without a bias load as they were saved
            self.register_buffer("bias_exp", torch.full((1,), -128, dtype=torch.int8))
        for name, b in (("model.bits", bits), ("model.hot_bits", hot_bits)):
            if b not in rowquant.WIDTHS:
                raise ValueError(f"{name} must be one of {rowquant.WIDTHS}, got {b}")
        self.bits, self.hot_rows, self.hot_bits, self.frozen = bits, hot_rows, hot_bits, False
        self.refresh_steps = refresh_steps
        self.register_buffer("row_bits", torch.full((num_items + 1,), bits, dtype=torch.uint8))
        self.register_buffer("row_exps", torch.zeros(num_items + 1, dtype=torch.int8))
        self.refresh()

    def reset(self, std: float) -> None:
        super().reset(std)
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Choose every row's step again for the current weights and widths."""
        if not self.frozen:
            self.row_exps.copy_(rowquant.choose_exponents(self.weight, self.row_bits))

    def train(self, mode: bool = True) -> LowBitTable:
        if mode and self.refresh_steps:
            self.refresh()
        return super().train(mode)

    def assign_hot(self, counts: Any) -> int:
        """Give the `hot_rows` most frequent items (by training counts) `hot_bits`; how many."""
        counts = torch.as_tensor(counts, dtype=torch.float32).clone()
        counts[PAD] = -1.0
        hot = min(self.hot_rows, self.num_embeddings - 1)
        top = torch.argsort(counts, descending=True, stable=True)[:hot]
        self.row_bits.fill_(self.bits)
        self.row_bits[top.to(self.row_bits.device)] = self.hot_bits
        self.refresh()
        return int(top.numel())

    def matrix(self) -> torch.Tensor:
        """The rows on their grid (every read of the table goes through here)."""
        if self.frozen:
            return self.weight
        return rowquant.fake_quantize(self.weight, self.row_bits, self.row_exps)

    def output_bias(self) -> torch.Tensor:
        """The output bias on its BIAS_BITS grid (its step chosen again while training)."""
        assert self.bias is not None
        if self.frozen:
            return self.bias
        if self.training:
            self.bias_exp.copy_(
                rowquant.choose_exponents(self.bias.unsqueeze(0), self._bias_bits())
            )
        return self._bias_on_grid()

    def _bias_bits(self) -> torch.Tensor:
        return torch.full((1,), BIAS_BITS, dtype=torch.uint8, device=self.weight.device)

    def _bias_on_grid(self) -> torch.Tensor:
        """The bias on its grid at step `bias_exp` (straight-through while it trains)."""
        assert self.bias is not None
        row = self.bias.unsqueeze(0)
        return rowquant.fake_quantize(row, self._bias_bits(), self.bias_exp).squeeze(0)

    @torch.no_grad()
    def bias_codes(self) -> torch.Tensor:
        """The output bias's BIAS_BITS codes (|V|+1,) uint8 at its step `bias_exp`."""
        assert self.bias is not None
        return rowquant.quantize_rows(self.bias.unsqueeze(0), self._bias_bits(), self.bias_exp)[0]

    @torch.no_grad()
    def freeze_to_grid(self) -> torch.Tensor:
        """Weights (and bias) := their quantized values, read as they are from now on; returns
        the codes."""
        codes = rowquant.quantize_rows(self.weight, self.row_bits, self.row_exps)
        if not self.frozen:
            self.weight.copy_(rowquant.dequantize_rows(codes, self.row_exps, self.row_bits))
            if self.bias is not None:  # no gradients here: exactly the grid's values
                self.bias.copy_(self._bias_on_grid())
            self.frozen = True
        return codes


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


def radix_columns(ids: torch.Tensor, sizes: list[int], wrap: bool = False) -> list[torch.Tensor]:
    """Quotient-remainder codes of ids >= 0, one tensor per table: code_n = (id div
    prod(sizes[:n])) mod sizes[n]. Integer division (trunc = floor for ids >= 0) and no stack:
    in ONNX one Mod and one Div per table, not a float floor and a stack-split (9 nodes fewer
    for N = 2). Without `wrap` the last table takes the quotient as it is: in range for every id
    below prod(sizes), and an id beyond fails the lookup instead of wrapping onto another item."""
    codes, rest = [], ids
    for n, m in enumerate(sizes):
        last = n == len(sizes) - 1
        codes.append(rest if last and not wrap else rest % m)
        if not last:
            rest = _int_div(rest, m)
    return codes


def _int_div(x: torch.Tensor, m: int) -> torch.Tensor:
    """x div m for x >= 0; under ONNX export one integer Div (the exporter writes a floor
    division as Cast, Div, Floor, Cast and a truncating one as seven nodes)."""
    if torch.onnx.is_in_onnx_export():
        return torch.onnx.ops.symbolic(
            "::Div", (x, torch.tensor(m, dtype=x.dtype)), {}, dtype=x.dtype, shape=x.shape,
            version=14,
        )  # fmt: skip
    return torch.div(x, m, rounding_mode="floor")


def mixed_radix(ids: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """Quotient-remainder codes (..., N), every column modulo its size (ids past prod(sizes)
    wrap: popularity ranks use that); radix_columns' values for ids in range."""
    return torch.stack(radix_columns(ids, sizes, wrap=True), dim=-1)


class _Composed(nn.Module):
    """What the compositional tables share: N codebooks and the optional per-item w and b."""

    sizes: list[int]

    def __init__(
        self, num_items: int, dim: int, sizes: list[int], item_weights: bool,
        widths: list[int] | None = None,
    ):  # fmt: skip
        super().__init__()
        self.num_ids = num_items + 1
        self.dim = dim
        self.sizes = list(sizes)
        # book n covers dims [offsets[n], offsets[n] + widths[n]); full-width books add up
        self.widths = list(widths) if widths is not None else [dim] * len(self.sizes)
        self.offsets, at = [], 0
        for w in self.widths:
            self.offsets.append(0 if w == dim else at)
            at += 0 if w == dim else w
        self.tables = nn.ParameterList(
            nn.Parameter(torch.zeros(m, w)) for m, w in zip(self.sizes, self.widths, strict=True)
        )
        n = len(self.sizes)
        self.item_weights = nn.Parameter(torch.ones(self.num_ids, n)) if item_weights else None
        self.item_bias = nn.Parameter(torch.zeros(self.num_ids)) if item_weights else None

    def reset(self, std: float) -> None:
        for t in self.tables:
            nn.init.normal_(t, 0.0, std)

    def codes_of(self, ids: torch.Tensor) -> torch.Tensor:  # (...) -> (..., N) long
        raise NotImplementedError

    def place(self, v: torch.Tensor, n: int) -> torch.Tensor:
        """Book n's (..., w_n) vectors at their dims of the full (..., D) width (zero elsewhere)."""
        w, off = self.widths[n], self.offsets[n]
        return v if w == self.dim else F.pad(v, (off, self.dim - off - w))

    def part(self, h: torch.Tensor, n: int) -> torch.Tensor:
        """The dims of h (..., D) that book n scores."""
        w, off = self.widths[n], self.offsets[n]
        return h if w == self.dim else h[..., off : off + w]

    def code_columns(self, ids: torch.Tensor) -> list[torch.Tensor]:
        """The codes of ids, one (...) tensor per table (what a lookup reads)."""
        return list(self.codes_of(ids).unbind(-1))

    def base(self, items: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, N, D) selected codewords; padding rows are zero."""
        codes = self.code_columns(items)
        vecs = torch.stack(
            [self.place(F.embedding(codes[n], t), n) for n, t in enumerate(self.tables)],
            dim=-2,
        )
        return vecs * padding_keep(items)[..., None]  # the encoder's own keep mask in ONNX

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        return self.base(items).sum(-2)

    def score_ids(self, h: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        codes = self.codes_of(ids)  # (P, K, N)
        total = self.item_bias[ids] if self.item_bias is not None else None
        for n, t in enumerate(self.tables):
            part = (self.part(h, n).unsqueeze(-2) * F.embedding(codes[..., n], t)).sum(-1)
            if self.item_weights is not None:
                part = part * self.item_weights[ids, n]
            total = part if total is None else total + part
        assert total is not None
        return total

    def matrix(self) -> torch.Tensor:
        codes = self.codes_of(torch.arange(self.num_ids, device=self.tables[0].device))
        rows = [self.place(t[codes[:, n]], n) for n, t in enumerate(self.tables)]  # N x (|V|+1, D)
        if self.item_weights is not None:
            rows = [r * self.item_weights[:, n : n + 1] for n, r in enumerate(rows)]
        return torch.stack(rows).sum(0)


class QRTable(_Composed):
    """The LSAN paper's quotient-remainder composition: item v uses row code_n(v) of table n.

    Because v = code_1 + m_1 code_2 + m_1 m_2 code_3 + ..., `scores` lays each table's row scores
    over all ids by broadcasting (an outer sum) instead of a gather: no index table is stored.
    """

    def __init__(self, num_items: int, dim: int, tables: int, m1: int = 0, item_weights=True):
        super().__init__(num_items, dim, table_sizes(num_items + 1, tables, m1), item_weights)

    def codes_of(self, ids: torch.Tensor) -> torch.Tensor:
        return mixed_radix(ids, self.sizes)

    def code_columns(self, ids: torch.Tensor) -> list[torch.Tensor]:
        return radix_columns(ids, self.sizes)

    def grid_scores(self, h: torch.Tensor, mask_beyond: bool = True) -> torch.Tensor:
        """(P, D) -> (P, M) scores over every code tuple (M = prod m_n >= |V|+1).

        Ids v are laid out in row-major order over the grid (m_N, ..., m_1). The arithmetic runs
        on the same grid with its axes sorted by size, largest last: broadcasting along a tiny
        inner axis (m1 = 2) is onnxruntime's slow path, a large last axis its fast one; one
        transpose then puts the ids in order. Per-item constants are stored in id order and
        transposed once (folded when a session loads). Ids beyond the catalogue score NEG.
        Training uses these M columns directly (no slicing copy); `scores` slices |V|+1.
        """
        p, n_tables = h.shape[0], len(self.sizes)
        id_grid = list(reversed(self.sizes))  # (m_N, ..., m_1): row-major = id order
        order = sorted(range(n_tables), key=lambda n: (self.sizes[n], -n))  # tables, largest last
        axes = [n_tables - 1 - n for n in order]  # their axes in id_grid
        shape = [self.sizes[n] for n in order]

        def laid_out(per_id: torch.Tensor) -> torch.Tensor:  # (M,) in id order -> compute grid
            return per_id.view(id_grid).permute(axes).reshape(1, *shape)

        pad = math.prod(self.sizes) - self.num_ids
        total = None
        if self.item_bias is not None:
            beyond = NEG if mask_beyond else 0.0
            total = laid_out(F.pad(self.item_bias, (0, pad), value=beyond))
        weights = F.pad(self.item_weights.T, (0, pad)) if self.item_weights is not None else None
        for i, n in enumerate(order):
            view = [p] + [1] * n_tables
            view[1 + i] = self.sizes[n]
            part = F.linear(h, self.tables[n]).view(view)  # one copy of the table in ONNX
            if weights is not None:
                part = part * laid_out(weights[n])
            total = part if total is None else total + part
        assert total is not None
        if self.item_bias is None and pad and mask_beyond:
            beyond_mask = F.pad(torch.zeros(self.num_ids, device=h.device), (0, pad), value=NEG)
            total = total + laid_out(beyond_mask)
        back = [0] + [1 + axes.index(a) for a in range(n_tables)]  # compute grid -> id order
        return total.permute(back).reshape(p, -1)

    def scores(self, h: torch.Tensor) -> torch.Tensor:
        lead = h.shape[:-1]
        # the slice drops ids past the catalogue, so they need no mask (and no |V| constant in ONNX)
        flat = self.grid_scores(h.reshape(-1, h.shape[-1]), mask_beyond=False)
        return flat[:, : self.num_ids].reshape(*lead, self.num_ids)


def code_dtype(sizes: list[int]) -> torch.dtype:
    """The smallest integer type that holds every code: uint8 up to 256 rows, else int16/int32."""
    top = max(sizes)
    return torch.uint8 if top <= 256 else torch.int16 if top <= 32768 else torch.int32


class CodeTable(_Composed):
    """N codebooks of sizes m_n; `codes` (|V|+1, N) names the codeword of each book per item.

    The codes start as the quotient-remainder arithmetic of the id (a valid, unique assignment)
    and are replaced by `lsan.models.codes.assign` (popularity, teacher k-means) before training;
    they travel in the state dict, so a checkpoint and its artifact carry their assignment.
    """

    codes: torch.Tensor

    def __init__(
        self, num_items: int, dim: int, sizes: list[int], item_weights: bool = False,
        widths: list[int] | None = None,
    ):  # fmt: skip
        super().__init__(num_items, dim, sizes, item_weights, widths)
        ids = torch.arange(self.num_ids)
        start = mixed_radix(ids, table_sizes(self.num_ids, len(sizes), 0))
        start = torch.minimum(start, torch.tensor(self.sizes) - 1)  # valid even if sizes are small
        self.register_buffer("codes", start.to(code_dtype(self.sizes)))

    def set_codes(self, codes: torch.Tensor) -> None:
        """Install an assignment (|V|+1, N); row 0 (padding) is forced to codeword 0."""
        if codes.shape != self.codes.shape:
            raise ValueError(f"codes must be {tuple(self.codes.shape)}, got {tuple(codes.shape)}")
        limits = torch.tensor(self.sizes)
        if (codes < 0).any() or (codes >= limits).any():
            raise ValueError(f"codes out of range for codebooks of sizes {self.sizes}")
        codes = codes.clone()
        codes[PAD] = 0
        self.codes.copy_(codes.to(self.codes.dtype))

    def codes_of(self, ids: torch.Tensor) -> torch.Tensor:
        return self.codes.long()[ids]

    def codes_t(self) -> torch.Tensor:
        """(N, |V|+1) long: in ONNX one folded constant, stored uint8 by export (see scores)."""
        return self.codes.long().T

    def base(self, items: torch.Tensor) -> torch.Tensor:
        codes = self.codes_t()[:, items]  # (N, B, T)
        vecs = [self.place(F.embedding(codes[n], t), n) for n, t in enumerate(self.tables)]
        return torch.stack(vecs, dim=-2) * padding_keep(items)[..., None]

    def scores(self, h: torch.Tensor) -> torch.Tensor:
        """Per book h . E_n, gathered by the codes laid out (N, |V|+1), summed over the books.

        Equal books (the usual case) run as one matmul against the stacked books and one
        GatherElements whose index is the code table itself, expanded at run time, so the ONNX
        file holds the codes once, as the same (N, |V|+1) constant `base` reads (export stores
        it uint8 and merges identical constants); the large axis is last, onnxruntime's fast
        layout. Product-quantized books (`pq`) score their own dims in one batched matmul
        (N, P, D/N) x (N, D/N, m). Unequal books (a hybrid own-rows book) are scored book by book
        and padded to the largest, so the same single GatherElements reads them (indexing a
        book's scores by its code row instead exports as GatherND or Gather along axis 1, which
        onnxruntime runs ~4x slower over |V| entries).
        """
        lead, d = h.shape[:-1], h.shape[-1]
        flat = h.reshape(-1, d)
        codes = self.codes_t()
        n_books = len(self.sizes)
        if len(set(self.sizes)) == 1 and len(set(self.widths)) == 1:
            if self.widths[0] == d:
                s = F.linear(flat, torch.cat(list(self.tables))).view(-1, n_books, self.sizes[0])
            else:  # (N, P, w) @ (N, w, m) -> (P, N, m)
                per_book = flat.view(-1, n_books, self.widths[0]).transpose(0, 1)
                s = (per_book @ torch.stack(list(self.tables)).transpose(1, 2)).transpose(0, 1)
        else:  # each book's scores padded to the largest book: one gather serves them all
            top = max(self.sizes)
            s = torch.stack(
                [F.pad(F.linear(self.part(flat, n), t), (0, top - m))
                 for n, (t, m) in enumerate(zip(self.tables, self.sizes, strict=True))], dim=1,
            )  # fmt: skip
        parts = s.gather(2, codes.unsqueeze(0).expand(s.shape[0], -1, -1))  # (P, N, |V|+1)
        if self.item_weights is not None:
            parts = parts * self.item_weights.T
        total = parts.sum(1)
        total = total + self.item_bias if self.item_bias is not None else total
        return total.reshape(*lead, self.num_ids)


def build_item_table(cfg: TableConfig, num_items: int, dim: int) -> Any:
    """The item table `cfg.item_table` (see ITEM_TABLES) for ids 0..num_items.

    qr: `tables` base tables sized by m1 (0 = balanced). codes: `tables` codebooks of
    `code_size` rows (pq: each D / tables wide, over its own dims), plus, with `own_rows` = H > 0, one more book of H + 1 rows in which the H
    most popular items get a row of their own and every other item row 0 (a hybrid table).
    """
    if cfg.codes_from not in CODE_SOURCES:
        raise ValueError(
            f"unknown model.codes_from {cfg.codes_from!r} (known: {', '.join(CODE_SOURCES)})"
        )
    if cfg.train_scores not in TRAIN_SCORES:
        raise ValueError(
            f"model.train_scores must be factorised or matrix, got {cfg.train_scores!r}"
        )
    if cfg.bits and cfg.item_table != "full":
        raise ValueError(f"model.bits needs model.item_table=full, not {cfg.item_table!r}")
    if cfg.item_bias and cfg.item_table != "full":
        raise ValueError(
            f"model.item_bias needs model.item_table=full (a {cfg.item_table!r} table has its "
            "own: model.item_weights)"
        )
    if cfg.hot_rows and not cfg.bits:
        raise ValueError("model.hot_rows needs model.bits > 0 (a low-bit table)")
    if cfg.item_table == "full":
        if cfg.bits:
            return LowBitTable(
                num_items, dim, cfg.bits, cfg.hot_rows, cfg.hot_bits, cfg.refresh_steps,
                cfg.item_bias,
            )  # fmt: skip
        return FullTable(num_items, dim, cfg.item_bias)
    if cfg.item_table == "qr":
        return QRTable(num_items, dim, cfg.tables, cfg.m1, cfg.item_weights)
    if cfg.item_table in ("codes", "pq"):
        if cfg.code_size < 2:
            raise ValueError(f"model.code_size must be at least 2, got {cfg.code_size}")
        own = [cfg.own_rows + 1] if cfg.own_rows > 0 else []
        widths = None
        if cfg.item_table == "pq":
            if dim % cfg.tables:
                raise ValueError(
                    f"model.item_table=pq splits D={dim} into model.tables={cfg.tables} equal "
                    "parts: D must be a multiple of tables"
                )
            widths = [dim // cfg.tables] * cfg.tables + [dim] * len(own)
        sizes = [cfg.code_size] * cfg.tables + own
        return CodeTable(num_items, dim, sizes, cfg.item_weights, widths)
    raise ValueError(
        f"unknown model.item_table {cfg.item_table!r} (known: {', '.join(ITEM_TABLES)})"
    )


def training_scores(table: Any, mode: str):
    """The score function a training loss uses: same numbers as `table.scores`, faster layouts.

    matrix: one explicit |V| x D matrix per step and one matmul (about 2x faster on a CPU at
    D = 64 than the factorised path, whose element-wise work over |V| is memory-bound).
    factorised: the table's own scoring; for qr the whole code grid (ids past the catalogue
    score NEG), which saves the slicing copy.
    """
    if isinstance(table, FullTable):
        return table.scores
    if mode == "matrix":
        m, bias = table.matrix(), table.item_bias
        return lambda h: h @ m.T + (0 if bias is None else bias)
    if isinstance(table, QRTable):
        return table.grid_scores
    return table.scores
