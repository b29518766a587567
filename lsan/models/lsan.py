"""LSAN: lightweight self-attentive sequential recommendation (../shared/papers/lsan-*.txt).

Design choices (the paper gives the design, no code; where it is silent the choice is ours):
- Compositional item embeddings: any item table of lsan.models.item_tables (`model.item_table`).
  The paper's is `qr` (the default): N base tables (default 2) indexed by mixed-radix quotient-
  remainder codes, sized by the paper's knob m1 (tables of m1 and ceil(|V|/m1) rows) or balanced
  (each ~|V|^(1/N), m1 = 0). Every item has a unique code tuple; padding is a zero vector.
  `full` is one |V| x D table (the paper's LSAN_full.emb, model `lsan_full`); `codes` learned or
  assigned codebooks (popularity, a teacher's k-means).
- Context of position t = (category of item t-1, category of item t, time slot of t), each an
  embedding, summed into a context vector c (D). c attends over the N selected base vectors
  (query W_q c, keys the base vectors, softmax over N; skipped for N = 1, where it is exactly 1)
  to fuse one item vector e; then the context
  is injected as x = e + GeLU(W [e ; c]) with W: 2D -> D (the paper's MLP([e ; c]); the residual
  keeps the item identity strong at initialisation). use_time / use_category switch the parts
  off for the ablations; with both off the fusion query is a learned constant. `time_residual`
  (off in the paper's model) also adds each position's time-slot embedding to x, linearly, as
  SASRec's use_time does: a probe of whether LSAN reads the request's time (data.slot_rule=ahead)
  worse only because its time enters through the GeLU.
- Twin attention, one layer by default, pre-LN: H self-attention heads (full width D each, the
  paper's O(3HD^2) accounting; positional embeddings added to this branch's input only; causal,
  bidirectional or local by `attention`) in parallel with H causal depth-wise convolution heads
  (kernel L). The 2H head outputs (B, T, 2H, D) are concatenated and projected back to D by one
  linear layer (the role of multi-head attention's W_O). Then a GeLU point-wise feed-forward;
  residuals around both, dropout, a final layer norm. `conv = False` drops the conv branch.
- Prediction through the same base tables without building the |V| x D matrix:
  score(v) = sum_n w[v, n] (h . E_n)[code_n(v)] + b[v] (see item_tables).
- Training may score through the explicit matrix (`train_scores = "matrix"`, the default): the
  same numbers (a test checks it), built from the base tables once per step and used in one
  matmul; evaluation and ONNX always use the factorised path.
- Objective: full-softmax cross-entropy on the next item at every non-padding position; L2 is
  the trainer's weight decay (1e-5 by default, as in the paper).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lsan.models.info import DataInfo
from lsan.models.item_tables import TableConfig, build_item_table, training_scores
from lsan.models.layers import (
    PAD,
    AttentionMask,
    CausalDepthwiseConv,
    FeedForward,
    apply_blocks,
    attend,
    attention_mask,
    gelu,
    init_weights,
    last_positions,
    mask_padding,
    next_item_loss,
    padding_keep,
)
from lsan.models.objectives import inference_inputs, is_autoencoding, mask_token, with_mask_token


class ContextFusion(nn.Module):
    """Context-aware fusion of N base vectors into one item vector, then context injection."""

    def __init__(self, dim: int, info: DataInfo, use_category: bool, use_time: bool):
        super().__init__()
        self.use_category, self.use_time = use_category, use_time
        self.prev_cat = (
            nn.Embedding(info.num_categories, dim, padding_idx=PAD) if use_category else None
        )
        self.cur_cat = (
            nn.Embedding(info.num_categories, dim, padding_idx=PAD) if use_category else None
        )
        self.slot = nn.Embedding(info.num_slots, dim, padding_idx=PAD) if use_time else None
        self.const = nn.Parameter(torch.zeros(dim))  # the context when both parts are off
        self.query = nn.Linear(dim, dim)
        self.inject = nn.Linear(2 * dim, dim)
        self.projected = False  # project_context: the inference form for one base vector
        self.temperature = math.sqrt(dim)  # of the fusion softmax (scaled dot product)

    def parts(self, cats: torch.Tensor, slots: torch.Tensor) -> torch.Tensor | None:
        """(B, T, D): the sum of the context parts switched on (after `project_context`, W_c
        times it), None with none on."""
        parts = []
        if self.prev_cat is not None and self.cur_cat is not None:
            prev = F.pad(cats[:, :-1], (1, 0), value=PAD)  # category of item t-1; PAD first
            parts += [self.prev_cat(prev), self.cur_cat(cats)]
        if self.slot is not None:
            parts.append(self.slot(slots))
        return sum(parts[1:], parts[0]) if parts else None

    def context(self, cats: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """(B, T, D): the parts switched on plus the constant (broadcast: one Add in ONNX)."""
        total = self.parts(cats, slots)
        return self.const.expand(*cats.shape, -1) if total is None else total + self.const

    @torch.no_grad()
    def scale_query(self) -> None:
        """Inference form for N > 1 base vectors: the query weights divided by the softmax
        temperature, so the logits need no division (one ONNX node less)."""
        self.query.weight.div_(self.temperature)
        self.query.bias.div_(self.temperature)
        self.temperature = 1.0

    @torch.no_grad()
    def project_context(self) -> None:
        """Inference form for one base vector: the context tables pre-multiplied by the
        injection's context half, the constant folded into its bias.

        W [e ; c] + b = W_e e + W_c c + b, and c is a sum of table rows plus the constant, so
        the projected rows sum to W_c c: the same numbers without the concatenation, the
        constant's Add and half the injection's product. The fusion query reads c itself, so
        this holds only where it is skipped (N = 1)."""
        d = self.inject.out_features
        w_e, w_c = self.inject.weight[:, :d], self.inject.weight[:, d:]
        for table in (self.prev_cat, self.cur_cat, self.slot):
            if table is not None:
                table.weight.copy_(table.weight @ w_c.T)
        inject = nn.Linear(d, d)
        inject.weight.copy_(w_e)
        inject.bias.copy_(self.inject.bias + w_c @ self.const)
        self.inject, self.projected = inject, True

    def inject_projected(self, e: torch.Tensor, cats: torch.Tensor, slots: torch.Tensor):
        """The item vectors e (B, T, D) with the context injected, after project_context: the
        parts' sum is W_c c already and the constant is in the bias, so with no part on nothing
        is added (an expanded zero would cost the export five nodes a request). The bias is
        added last, next to the GeLU, where onnxruntime fuses the two into one BiasGelu (one
        node a request less than the bias inside the product)."""
        z, c = F.linear(e, self.inject.weight), self.parts(cats, slots)
        return e + gelu((z if c is None else z + c) + self.inject.bias)

    def forward(self, base: torch.Tensor, cats: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """base (B, T, N, D) -> fused, context-injected item vectors (B, T, D).

        With one base vector (a full table: LSAN_full) the softmax over one logit is exactly 1,
        so the query is skipped: the same numbers without a D x D product per position (the
        query's weights stay in the checkpoint, untouched by training, and leave the export)."""
        if self.projected:
            return self.inject_projected(base.squeeze(-2), cats, slots)
        c = self.context(cats, slots)
        if base.shape[-2] == 1:
            e = base.squeeze(-2)
        else:
            q = self.query(c)  # (B, T, D)
            logits = (base @ q.unsqueeze(-1)).squeeze(-1)  # (B, T, N)
            if self.temperature != 1.0:  # 1 once the inference form folded it into the query
                logits = logits / self.temperature
            e = (torch.softmax(logits, dim=-1).unsqueeze(-1) * base).sum(-2)  # (B, T, D)
        return e + gelu(self.inject(torch.cat([e, c], dim=-1)))


class TwinAttention(nn.Module):
    """H full-width self-attention heads || H causal depth-wise conv heads -> concat -> D."""

    def __init__(self, dim: int, heads: int, kernel: int, dropout: float, conv: bool):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * heads * dim)
        self.conv = CausalDepthwiseConv(dim, heads, kernel) if conv else None
        self.out = nn.Linear((2 if conv else 1) * heads * dim, dim)
        self.drop = nn.Dropout(dropout)
        self.last_out: nn.Linear | None = None  # fold_conv: the inference form of the last query

    @torch.no_grad()
    def fold_conv(self) -> None:
        """Inference form of the last position: the convolution branch folded into `out`.

        At one position the H depth-wise heads are a linear map of the last L inputs, and `out`
        is linear, so out([sa ; conv]) = [W_sa | W_conv C] [sa ; window] + b + W_conv c_b: one
        product over the attention output and the L-position window, where the convolution took
        a dozen ONNX nodes (transposes, reshapes, the convolution, a concatenation)."""
        if self.conv is None:
            return
        assert self.conv.conv.bias is not None  # the depth-wise convolution has a bias
        d = self.out.out_features
        split = self.heads * d
        w_conv = self.out.weight[:, split:].view(d, self.heads, d)  # [out, head, channel]
        kernel = self.conv.conv.weight.view(d, self.heads, self.conv.kernel)  # [chan, head, tap]
        bias = self.conv.conv.bias.view(d, self.heads)
        folded = nn.Linear(split + self.conv.kernel * d, d)
        taps = torch.einsum("ohc,chj->ojc", w_conv, kernel).reshape(d, -1)
        folded.weight.copy_(torch.cat([self.out.weight[:, :split], taps], dim=1))
        folded.bias.copy_(self.out.bias + torch.einsum("ohc,ch->o", w_conv, bias))
        self.last_out = folded

    def forward(
        self, x: torch.Tensor, pos: torch.Tensor, mask: AttentionMask,
        return_weights: bool = False, last: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        """(B, T, D) -> (B, T, D); last = True: the last position only, (B, 1, D)."""
        b, _, d = x.shape
        # heads are full width: consecutive D-wide slices of each of q, k, v
        q, k, v = self.qkv(x + pos).split(self.heads * d, dim=-1)
        q = q[:, -1:] if last else q  # one matmul on the stored weight
        tq = q.shape[1]
        y, weights = attend(q, k, v, mask, self.heads, self.drop)
        if last and self.last_out is not None:  # folded: the window of the last L inputs
            assert self.conv is not None  # fold_conv made last_out from it
            span = self.conv.kernel
            window = F.pad(x, (0, 0, span - 1, 0))[:, -span:]  # (B, L, D), zeros before t = 0
            y = self.last_out(torch.cat([y, window.reshape(-1, 1, span * d)], dim=-1))
            return y, (weights if return_weights else None)
        heads = y.view(b, tq, self.heads, d)  # (B, Tq, H, D)
        if self.conv is not None:
            conv = self.conv(x[:, -self.conv.kernel :] if last else x)  # (B, T', H, D)
            heads = torch.cat([heads, conv[:, -tq:]], dim=2)  # (B, Tq, 2H, D)
        y = self.out(heads.reshape(b, tq, -1))  # (B, Tq, D)
        return y, (weights if return_weights else None)


@dataclass(frozen=True)
class LSANConfig(TableConfig):
    item_table: str = "qr"  # the paper's quotient-remainder composition (full = LSAN_full.emb)
    m1: int = 2  # rows of the first table (paper's compression knob); 0 = balanced tables
    item_weights: bool = True  # per-item output weights + bias; off collapses qr's accuracy
    dim: int = 128  # embedding and hidden size D (paper: 128; 64 on the sparsest data)
    use_category: bool = True  # category context (item t-1 and item t) in fusion and injection
    use_time: bool = True  # time-slot context (the paper's temporal ablation turns this off)
    time_residual: bool = False  # also add each position's time-slot embedding to its input
    heads: int = 2  # heads per branch (H self-attention + H convolution)
    kernel: int = 3  # convolution window L, in positions
    conv: bool = True  # the convolution branch (False = plain self-attention ablation)
    layers: int = 1  # twin-attention layers
    ffn_mult: int = 1  # feed-forward hidden size = ffn_mult * D (the paper's: D)
    dropout: float = 0.3  # dropout on embeddings, attention weights and residual branches
    attention: str = "causal"  # causal (AR) or bidirectional / local (AE, Cloze) SA branch
    window: int = 3  # local attention reach (attention = local only)
    mask_prob: float = 0.2  # Cloze masking probability (AE only)
    init_std: float = 0.02  # std of the normal initialisation


class TwinBlock(nn.Module):
    """Pre-LN: x + TwinAttention(LN(x)), then x + FFN(LN(x))."""

    def __init__(self, cfg: LSANConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.dim)
        self.twin = TwinAttention(cfg.dim, cfg.heads, cfg.kernel, cfg.dropout, cfg.conv)
        self.ln2 = nn.LayerNorm(cfg.dim)
        self.ffn = FeedForward(cfg.dim, cfg.ffn_mult * cfg.dim, cfg.dropout)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, mask, return_weights=False, pos=None, last=False):
        a, w = self.twin(self.ln1(x), pos, mask, return_weights, last)
        x = (x[:, -1:] if last else x) + self.drop(a)
        return x + self.drop(self.ffn(self.ln2(x))), w


class LSAN(nn.Module):
    def __init__(self, cfg: LSANConfig, info: DataInfo):
        super().__init__()
        self.cfg, self.info = cfg, info
        self.item_emb = build_item_table(cfg, info.num_items, cfg.dim)
        self.fusion = ContextFusion(cfg.dim, info, cfg.use_category, cfg.use_time)
        self.slot = (  # "slot": lsan.distill.slot_tensors
            nn.Embedding(info.num_slots, cfg.dim, padding_idx=PAD) if cfg.time_residual else None
        )
        self.pos_emb = nn.Embedding(info.max_len, cfg.dim)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(TwinBlock(cfg) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.dim)
        self.mask_emb = nn.Parameter(torch.zeros(cfg.dim)) if is_autoencoding(self) else None
        init_weights(self, cfg.init_std)
        if not isinstance(self.item_emb, nn.Embedding):  # init_weights drew the full table
            self.item_emb.reset(cfg.init_std)
        if self.mask_emb is not None:
            nn.init.normal_(self.mask_emb, 0.0, cfg.init_std)

    def embed(self, items: torch.Tensor, cats: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Context-aware item vectors (B, T, D)."""
        if self.mask_emb is not None:  # AE: [MASK] replaces every selected base vector
            base = with_mask_token(self.base, items, self.mask_emb, mask_token(self))
            x = self.fusion(base, cats, slots)
        elif self.fusion.projected:  # the rows themselves, (B, T, D)
            x = self.fusion.inject_projected(self.item_emb(items), cats, slots)
        else:
            x = self.fusion(self.base(items), cats, slots)
        return x if self.slot is None else x + self.slot(slots)

    def base(self, items: torch.Tensor) -> torch.Tensor:
        """(B, T) -> (B, T, N, D) selected base vectors (N = 1 for the full table)."""
        return self.item_emb.base(items)

    def inference_form(self) -> LSAN:
        """A copy for export computing the same scores with fewer ONNX nodes: each twin block's
        convolution folded into its output projection at the last position; with one base
        vector the context tables projected through the injection, with more the softmax
        temperature folded into the fusion query (ContextFusion)."""
        model = copy.deepcopy(self).eval()
        for block in model.blocks:
            assert isinstance(block, TwinBlock)
            block.twin.fold_conv()
        one = torch.ones(1, 1, dtype=torch.long, device=self.pos_emb.weight.device)
        if self.base(one).shape[-2] == 1:
            model.fusion.project_context()
        else:
            model.fusion.scale_query()
        return model

    @property
    def items(self) -> nn.Module | None:
        """The compositional table, None for a full one (kept for the benchmarks' size code)."""
        return None if self.cfg.full_table else self.item_emb

    def forward(self, items, cats, slots, return_weights: bool = False, last_only: bool = False):
        """Hidden state per position (B, T, D); with return_weights also per-layer SA weights.

        last_only: the last position alone, (B, 1, D) (inference: see apply_blocks).
        """
        keep = padding_keep(items)  # (B, T, 1)
        # (T, D); padding positions need no zeroing: masked as keys, and their queries'
        # outputs are zeroed after each block (one Mul less in ONNX)
        pos = last_positions(self.pos_emb, items.shape[1])
        x = self.drop(self.embed(items, cats, slots)) * keep
        mask = attention_mask(items, self.cfg.attention, self.cfg.window)
        x, weights = apply_blocks(
            self.blocks, x, keep, mask, return_weights, last_only, pos=pos
        )  # fmt: skip
        h = self.ln(x)
        return (h, weights) if return_weights else h

    def item_scores(self, h: torch.Tensor) -> torch.Tensor:
        return self.item_emb.scores(h)

    def score_items(self, h: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Scores of given items: h (N, D), ids (N, K) -> (N, K)."""
        return self.item_emb.score_ids(h, ids)

    def loss(self, items, cats, slots, targets) -> torch.Tensor:
        scores = training_scores(self.item_emb, self.cfg.train_scores)
        return next_item_loss(self(items, cats, slots), targets, scores)

    def score_all(self, items, cats, slots) -> torch.Tensor:
        h = self(*inference_inputs(self, items, cats, slots), last_only=True)[:, -1]
        scores = self.item_scores(h)  # (B, |V|+1)
        return mask_padding(scores)
