"""The paper's attention pictures (Figures 1-3) plus locality curves, as PNG files.

Figures are built with matplotlib's object API (`Figure`, rendered by Agg on save), so no pyplot
state or backend switch leaks into the process.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from lsan.analysis.attention import ModelAttention
from lsan.analysis.measures import low_rank

DPI = 110


def _matrix_row(fig: Figure, axes, matrices: list[np.ndarray], titles: list[str]) -> None:
    """Matrices side by side on one colour scale; tick 0 is the most recent position."""
    vmax = max(float(m.max()) for m in matrices)
    for ax, m, title in zip(axes, matrices, titles, strict=True):
        im = ax.imshow(m, cmap="Blues", vmin=0.0, vmax=vmax)
        w = m.shape[0]
        ticks = list(range(w - 1, -1, -max(w // 5, 1)))[::-1]  # always label 0
        ax.set_xticks(ticks, [str(i - w + 1) for i in ticks])
        ax.set_yticks(ticks, [str(i - w + 1) for i in ticks])
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("key position")
    axes[0].set_ylabel("query position")
    fig.colorbar(im, ax=list(axes), shrink=0.8)


def _name(r: ModelAttention, results: list[ModelAttention]) -> str:
    """The model's label, with its dataset when the results span several."""
    return r.label if len({x.dataset for x in results}) == 1 else f"{r.label}, {r.dataset}"


def heatmaps(results: list[ModelAttention], path: Path) -> Path:
    """Figure 1: mean last-layer attention over the most recent positions; a row per dataset."""
    rows = [
        [r for r in results if r.dataset == d] for d in dict.fromkeys(r.dataset for r in results)
    ]
    cols = max(len(row) for row in rows)
    fig = Figure(figsize=(3.2 * cols + 1, 3.4 * len(rows)), layout="constrained")
    axes = np.asarray(fig.subplots(len(rows), cols)).reshape(len(rows), cols)
    for row, row_axes in zip(rows, axes, strict=True):
        _matrix_row(
            fig, row_axes[: len(row)], [r.heat for r in row], [_name(r, results) for r in row]
        )
        for ax in row_axes[len(row) :]:
            ax.set_axis_off()
    fig.savefig(path, dpi=DPI)
    return path


def reconstructions(results: list[ModelAttention], path: Path, k: int = 5) -> Path:
    """Figure 2: the mean matrices (top) and their rank-k SVD reconstructions (bottom)."""
    fig = Figure(figsize=(3.2 * len(results) + 1, 6.4), layout="constrained")
    axes = np.asarray(fig.subplots(2, len(results))).reshape(2, len(results))
    _matrix_row(fig, axes[0], [r.heat for r in results], [_name(r, results) for r in results])
    _matrix_row(
        fig, axes[1], [low_rank(r.heat, k).clip(min=0.0) for r in results],
        [f"{_name(r, results)}, rank {k}" for r in results],
    )  # fmt: skip
    fig.savefig(path, dpi=DPI)
    return path


def _curves(path: Path, lines: list[tuple[str, np.ndarray, np.ndarray]], x: str, y: str) -> Path:
    """One line plot of labelled (xs, ys) curves."""
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for label, xs, ys in lines:
        ax.plot(xs, ys, marker=".", label=label)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return path


def spectra(results: list[ModelAttention], path: Path) -> Path:
    """Figure 3: mean singular values (each matrix divided by its largest), in descending order."""
    lines = [(_name(r, results), np.arange(1, len(r.spectrum) + 1), r.spectrum) for r in results]
    return _curves(
        path, lines, "singular value index", "s_i / s_1 (mean over users, layers, heads)"
    )


def locality(results: list[ModelAttention], path: Path) -> Path:
    """Mean share of a query's attention at each distance query - key (> 0: older keys)."""
    lines = [(_name(r, results), *r.locality_curve()) for r in results]
    return _curves(
        path, lines, "distance (query position - key position)",
        "share of attention (mean over queries)",
    )  # fmt: skip
