"""Row-wise low-bit item vectors: the quantizer a table trains through and the export ships.

Why: at D = 32 a 4-bit Beauty table is already 194 KB of codes, more than the whole 5% budget
(166 KB); a smaller D loses more accuracy than fewer bits per value do, once the model is trained
with the quantizer in the loop (quantization-aware training, straight-through gradients).

Each row v is stored as `bits[v]`-bit codes c (one per value) and one int8 exponent e:
value = (c - L + 0.5) * 2^(e / 8), L = 2^(bits - 1): a mid-rise grid (no level at zero, which
2-bit codes cannot spare) with a per-row step on a 1/8-octave grid, so the step is one byte.
The step is chosen per row for the least squared error among 27 steps from max|row| / (L - 0.5)
down (`choose_exponents`, about 0.5 s for a 12k x 32 table on one core, so a training table keeps
its exponents and chooses them again once per epoch, not per step); the codes follow from the
weights and the exponents. Rows of different widths coexist (popular items can get more bits:
`model.hot_rows`).

The 256 steps (`step_table()`) are materialised and indexed, in PyTorch and in the ONNX decoder
alike, so the shipped file decodes to exactly the values PyTorch evaluated.
"""

from __future__ import annotations

import torch

WIDTHS = (1, 2, 4, 8)  # bits per value that pack whole values into a byte
# steps tried, in 1/8 octaves from the step whose top level is the row's largest value: down to
# an eighth of it (at 1-2 bits the least-squares step clips the largest values), a little above
_SEARCH = torch.arange(-24, 3)


def step_table() -> torch.Tensor:
    """2^(e / 8) for e = -128..127 (index e + 128): the 256 steps an exponent byte can name."""
    return torch.exp2(torch.arange(-128, 128, dtype=torch.float32) / 8)


def levels(bits: torch.Tensor) -> torch.Tensor:
    """L = 2^(bits - 1) per row, as a float column."""
    return torch.exp2(bits.float() - 1).unsqueeze(-1)


def steps_of(exps: torch.Tensor) -> torch.Tensor:
    """Each row's step (R, 1) for its exponent byte (R,)."""
    return step_table().to(exps.device)[exps.long() + 128].unsqueeze(-1)


def dequantize_rows(codes: torch.Tensor, exps: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """(R, D) values of codes (R, D) uint8 with exponents (R,) int8 at widths (R,)."""
    return (codes.float() - levels(bits) + 0.5) * steps_of(exps)


def _codes(w: torch.Tensor, step: torch.Tensor, lv: torch.Tensor) -> torch.Tensor:
    return torch.clamp(torch.floor(w / step) + lv, min=0.0).minimum(2 * lv - 1)


@torch.no_grad()
def quantize_rows(w: torch.Tensor, bits: torch.Tensor, exps: torch.Tensor) -> torch.Tensor:
    """Codes (R, D) uint8 of rows w (R, D) at widths bits (R,) and step exponents exps (R,)."""
    return _codes(w.detach().float(), steps_of(exps), levels(bits)).to(torch.uint8)


@torch.no_grad()
def choose_exponents(w: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """Per row, the step exponent (R,) int8 with the least squared error for rows w (R, D)."""
    w = w.detach().float()
    lv = levels(bits)
    top = w.abs().amax(-1) / (lv.squeeze(-1) - 0.5)
    e0 = torch.round(8 * torch.log2(top))  # -inf for an all-zero row (padding)
    steps = step_table().to(w.device)
    best_err = torch.full((w.shape[0],), torch.inf, device=w.device)
    best_e = torch.full((w.shape[0],), -128.0, device=w.device)
    for j in _SEARCH.tolist():
        e = torch.clamp(e0 + j, -128, 127)
        s = steps[e.long() + 128].unsqueeze(-1)
        err = ((_codes(w, s, lv) - lv + 0.5) * s - w).pow(2).sum(-1)
        better = err < best_err
        best_err, best_e = torch.where(better, err, best_err), torch.where(better, e, best_e)
    return best_e.to(torch.int8)


def fake_quantize(w: torch.Tensor, bits: torch.Tensor, exps: torch.Tensor) -> torch.Tensor:
    """w on its row-wise grid; gradients pass straight through (the identity) while training."""
    step, lv = steps_of(exps), levels(bits)
    with torch.no_grad():  # the same values as dequantize_rows(quantize_rows(...)), one pass
        q = ((_codes(w.float(), step, lv) - lv + 0.5) * step).to(w.dtype)
    return w + (q - w).detach() if torch.is_grad_enabled() and w.requires_grad else q
