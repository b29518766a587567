"""Measures of attention matrices: smooth sparsity, noise-based hard-threshold rank, locality.

Pure numpy functions on stacks of matrices (..., n, n), so they are tested on known answers and
the extraction code only has to slice the real part of each user's attention. The formulas are
those of sections 3 and 4 of ../shared/papers/causal-self-attentive-recommender-*.txt; where the
paper is ambiguous the docstring says how we read it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike


def sparsity(x: ArrayLike, dims: int | None = None) -> np.ndarray:
    """S(x) = (L1(x) / n) / L2(x) over the last `dims` axes (all when None): eq. 5 with p = 2.

    n is the number of entries, so a matrix counts as its flattened vector. S lies in
    [1/n, 1/sqrt(n)]: 1/n for a single non-zero entry, 1/sqrt(n) for equal magnitudes; lower is
    sparser. Unlike counting zeros it responds to unevenness, which matters because softmax
    attention is never exactly zero (except where a mask, e.g. the causal triangle, forces it).
    """
    a = np.abs(np.asarray(x, dtype=np.float64))
    dims = a.ndim if dims is None else dims
    flat = a.reshape(*a.shape[: a.ndim - dims], -1)
    l2 = np.sqrt((flat**2).sum(-1))
    if np.any(l2 == 0):
        raise ValueError("the sparsity of an all-zero input is undefined")
    return flat.mean(-1) / l2


@dataclass(frozen=True)
class ThresholdRank:
    k: np.ndarray  # (...,) singular values of Y = A + E above tau: the rank of eq. 9
    tau: np.ndarray  # (...,) the threshold of eq. 8
    error: np.ndarray  # (...,) ||A - A_k||_F / ||A||_F for the rank-k SVD of A (eq. 10)


def threshold_rank(a: ArrayLike, sigma: float, rng: np.random.Generator) -> ThresholdRank:
    """The paper's noise-based hard-threshold rank k of square matrices a (..., n, n), eq. 7-10.

    Y = A + E with E i.i.d. N(0, sigma^2), and
        tau = sqrt(2 (sigma^2 + ||Sigma(Y)||_F^2 / n^2) log(2n)),  k = #{singular values of Y > tau}.
    Our reading of eq. 8: sigma is the noise's standard deviation (the paper calls it the
    variance but squares it, and eq. 11 adds r sigma^2); ||Sigma(Y)||_F is the Frobenius norm of
    the singular values of Y, sqrt(sum_i s_i^2) = ||Y||_F (the paper's printed sum of |Sigma_ij|
    lacks the square a Frobenius norm has). So ||Sigma(Y)||_F^2 / n^2 is the mean squared entry
    of Y, and tau scales with the matrix. The reconstruction A_k is the rank-k truncated SVD of
    A itself (eq. 10 approximates "the original matrix"), its relative error exact by
    Eckart-Young. k is 0 when no singular value clears tau, which happens for tiny matrices
    (n <= 4) with one-hot rows.
    """
    a = np.asarray(a, dtype=np.float64)
    n = a.shape[-1]
    if a.ndim < 2 or a.shape[-2] != n:
        raise ValueError(f"threshold_rank needs square matrices, got shape {a.shape}")
    y = a + sigma * rng.standard_normal(a.shape)  # eq. 7
    s_y = np.linalg.svd(y, compute_uv=False)  # (..., n), descending
    tau = np.sqrt(2.0 * (sigma**2 + (s_y**2).sum(-1) / n**2) * np.log(2 * n))  # eq. 8
    k = (s_y > tau[..., None]).sum(-1)  # eq. 9
    s_a = np.linalg.svd(a, compute_uv=False)
    return ThresholdRank(k=k, tau=tau, error=truncation_error(s_a, k))


def truncation_error(s: np.ndarray, k: ArrayLike) -> np.ndarray:
    """||A - A_k||_F / ||A||_F from A's descending singular values s (..., n): the tail's share."""
    s = np.asarray(s, dtype=np.float64)
    keep = np.arange(s.shape[-1]) < np.asarray(k)[..., None]
    total = (s**2).sum(-1)
    tail = np.where(keep, 0.0, s**2).sum(-1)
    return np.sqrt(tail / np.where(total > 0, total, 1.0))


def low_rank(a: ArrayLike, k: int) -> np.ndarray:
    """The rank-k truncated SVD U_k Sigma_k V_k^T of matrices a (..., m, n) (eq. 10)."""
    u, s, vt = np.linalg.svd(np.asarray(a, dtype=np.float64), full_matrices=False)
    return (u[..., :k] * s[..., None, :k]) @ vt[..., :k, :]


def normalized_spectrum(a: ArrayLike) -> np.ndarray:
    """Singular values (..., n) in descending order divided by the largest (Figure 3's decay)."""
    s = np.linalg.svd(np.asarray(a, dtype=np.float64), compute_uv=False)
    return s / np.where(s[..., :1] > 0, s[..., :1], 1.0)


def distance_mass(a: ArrayLike) -> np.ndarray:
    """Attention mass summed over queries (and leading axes) by distance d = query - key.

    a (..., n, n) with rows = queries; returns (2n - 1,) with index d + n - 1 for
    d = -(n-1) .. n-1 (d > 0: the key is older than the query). Divided by the number of query
    rows it is the average share of a query's attention at each distance, summing to 1.
    """
    a = np.asarray(a, dtype=np.float64)
    n = a.shape[-1]
    per_cell = a.reshape(-1, n, n).sum(0)  # (n, n)
    q, k = np.indices((n, n))
    return np.bincount((q - k + n - 1).ravel(), weights=per_cell.ravel(), minlength=2 * n - 1)
