"""Attention matrices of trained checkpoints on sampled validation users, and their measures.

Choices:
- The model reads what it reads at inference (lsan.models.objectives.inference_inputs): the
  history, plus an appended [MASK] for AE models, in eval mode (no dropout).
- Only the real part of a user's matrix counts: inputs are left-padded, so the real positions
  are the last n (n = real items, the [MASK] included for AE), and each (layer, head) matrix is
  cut to its bottom-right n x n block. Padding queries attend to themselves only and would
  add an identity block that is no behaviour of the model; the block's rows still sum to 1.
- The same users (a seeded sample) are used for every checkpoint of one dataset, so models are
  compared on identical sequences; the rank noise is seeded per checkpoint, so a result does not
  depend on the order of the checkpoints.
- Pictures use the mean over users and heads of the last layer (the one whose output is scored),
  on the last `window` positions of users with at least that many; the numbers average over all
  layers and heads.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from lsan.analysis.measures import distance_mass, normalized_spectrum, sparsity, threshold_rank
from lsan.checkpoint import CheckpointError, load_model
from lsan.config import ConfigError
from lsan.data.batching import SPLITS, eval_tensors
from lsan.data.prepare import PAD, SeqDataset, load_configured
from lsan.models.objectives import inference_inputs, uses_users


@dataclass(frozen=True)
class AnalysisConfig:
    """What `lsan analyze` reads and how; the paper gives no noise level, so sigma is ours.

    sigma = 1e-4: attention rows sum to 1, so ||A||_F >= 1 and the threshold of eq. 8 is at least
    sqrt(2 log 2n) / n (0.017 at n = 200), while the noise's largest singular value is about
    2 sigma sqrt(n) (0.003 at n = 200): the noise alone adds no rank and k is set by the matrix.
    """

    users: int = 512  # validation users sampled per dataset (all of them when fewer)
    seed: int = 0  # seeds the user sample and the rank noise E
    sigma: float = 1e-4  # std of the noise E of the hard-threshold rank (see above)
    split: str = "valid"  # evaluation split whose histories are read
    window: int = 15  # positions shown in heat maps (the most recent ones)
    batch_size: int = 128  # users per forward pass

    def __post_init__(self) -> None:
        if self.users < 1 or self.window < 1 or self.batch_size < 1:
            raise ConfigError("users, window and batch size must be >= 1")
        if self.sigma < 0:
            raise ConfigError(f"sigma must be >= 0, got {self.sigma}")
        if self.split not in SPLITS:
            raise ConfigError(f"unknown split '{self.split}' (known: {', '.join(SPLITS)})")


@dataclass(frozen=True)
class ModelAttention:
    """What one checkpoint's attention looks like on the sampled users."""

    checkpoint: str  # checkpoint directory
    model: str  # model name (sasrec, bert4rec, local, lsan, ...)
    dataset: str
    attention: str  # causal, bidirectional or local
    lengths: np.ndarray  # (U,) n: real positions per user (incl. [MASK] for AE)
    sparsity: np.ndarray  # (U, L, H) S of each n x n block
    rank: np.ndarray  # (U, L, H) hard-threshold rank k
    error: np.ndarray  # (U, L, H) relative Frobenius error of the rank-k reconstruction
    locality: np.ndarray  # (2T - 1,) mean share of a query's attention at d = -(T-1) .. T-1
    spectrum: np.ndarray  # (T,) mean normalised singular values, zero beyond a user's n
    heat: np.ndarray  # (w, w) mean last-layer attention over the last w positions
    heat_users: int  # users averaged into `heat` (those with n >= w)

    @property
    def mode(self) -> str:
        return "AR" if self.attention == "causal" else "AE"

    @property
    def label(self) -> str:
        return f"{self.model} ({self.mode})"

    def locality_curve(self) -> tuple[np.ndarray, np.ndarray]:
        """(distances, shares): d >= 0 only for causal attention, which cannot look ahead."""
        t = (len(self.locality) + 1) // 2
        d = np.arange(-(t - 1), t)
        keep = d >= 0 if self.mode == "AR" else np.ones_like(d, dtype=bool)
        return d[keep], self.locality[keep]


def has_weights(model: nn.Module) -> bool:
    return "return_weights" in inspect.signature(model.forward).parameters


def sample_users(num_users: int, cfg: AnalysisConfig) -> np.ndarray:
    rng = np.random.default_rng(cfg.seed)
    return np.sort(rng.choice(num_users, size=min(cfg.users, num_users), replace=False))


@torch.no_grad()
def model_attention(
    model: nn.Module, model_name: str, ds: SeqDataset, max_len: int, cfg: AnalysisConfig,
    device: torch.device, checkpoint: str = "", progress: bool = False,
) -> ModelAttention:  # fmt: skip
    """Extract `model`'s attention on the sampled users and measure it, user by user."""
    users = torch.as_tensor(sample_users(ds.num_users, cfg))
    data = eval_tensors(ds, cfg.split, max_len).rows(users)
    rng = np.random.default_rng(cfg.seed)
    lengths, sparse, rank, error = [], [], [], []
    loc, rows, matrices = np.zeros(2 * max_len - 1), 0, 0
    spectrum = np.zeros(max_len)
    windows: dict[int, list[np.ndarray]] = {}  # n -> last-layer windows of users of length n
    starts = range(0, len(data), cfg.batch_size)
    desc = Path(checkpoint).name or model_name
    for start in tqdm(starts, desc=desc, leave=False, disable=not progress):
        b = data.rows(torch.arange(start, min(start + cfg.batch_size, len(data)))).to(device)
        items, cats, slots = inference_inputs(model, b.items, b.cats, b.slots)
        kw = {"users": b.users} if uses_users(model) else {}
        _, weights = model(items, cats, slots, return_weights=True, **kw)
        stacked = torch.stack(weights, dim=1).float().cpu().numpy()  # (B, L, H, T, T)
        t = stacked.shape[-1]
        for row, n in enumerate((items != PAD).sum(1).tolist()):
            a = stacked[row, :, :, t - n :, t - n :].astype(np.float64)  # (L, H, n, n) real block
            r = threshold_rank(a, cfg.sigma, rng)
            lengths.append(n)
            sparse.append(sparsity(a, dims=2))
            rank.append(r.k)
            error.append(r.error)
            loc[t - n : t + n - 1] += distance_mass(a)
            matrices += a.shape[0] * a.shape[1]
            rows += a.shape[0] * a.shape[1] * n
            spectrum[:n] += normalized_spectrum(a).reshape(-1, n).sum(0)
            windows.setdefault(n, []).append(a[-1].mean(0)[-cfg.window :, -cfg.window :])
    # the heat-map window falls back to the longest users when none reaches cfg.window
    w = min(cfg.window, max(lengths))
    heat = [m[-w:, -w:] for n, ms in windows.items() if n >= w for m in ms]
    return ModelAttention(
        checkpoint=checkpoint, model=model_name, dataset=ds.name,
        attention=getattr(getattr(model, "cfg", None), "attention", "causal"),
        lengths=np.asarray(lengths), sparsity=np.stack(sparse), rank=np.stack(rank),
        error=np.stack(error), locality=loc / rows, spectrum=spectrum / matrices,
        heat=np.mean(heat, axis=0), heat_users=len(heat),
    )  # fmt: skip


def analyze(
    checkpoints: list[Path], cfg: AnalysisConfig, device: torch.device, data_dir: str = "",
    cache_dir: str = "", progress: bool = False,
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
) -> list[ModelAttention]:  # fmt: skip
    """Analyse every checkpoint whose model returns attention weights; skip the others."""
    datasets: dict[tuple[str, str, str, int, str], SeqDataset] = {}  # each dataset is loaded once
    results = []
    for ckpt in checkpoints:
        model, run, info = load_model(ckpt, device)
        if not has_weights(model):
            log(f"skipped {ckpt}: model '{run.model_name}' has no attention weights to analyse")
            continue
        d = run.data
        key = (
            d.dataset,
            data_dir or d.data_dir,
            cache_dir or d.cache_dir,
            d.min_count,
            d.slot_rule,
        )
        if key not in datasets:
            datasets[key] = load_configured(d, data_dir, cache_dir)
        ds = datasets[key]
        if ds.num_items != info.num_items:
            raise CheckpointError(
                f"dataset '{ds.name}' has {ds.num_items} items but {ckpt} expects {info.num_items}"
            )
        results.append(
            model_attention(
                model, run.model_name, ds, info.max_len, cfg, device, str(ckpt), progress
            )  # fmt: skip
        )
    if not results:
        raise CheckpointError("no checkpoint among the given paths has attention weights")
    return results
