"""analysis.json, analysis.md and the pictures of one `lsan analyze` run.

The markdown tables follow the paper's Tables 2 and 3: rows = models, columns = datasets, then
the average over datasets.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lsan.analysis import plots
from lsan.analysis.attention import AnalysisConfig, ModelAttention
from lsan.report import git_commit
from lsan.tables import markdown_table

PICTURES = {
    "heatmaps.png": ("Attention heat maps (Figure 1)", plots.heatmaps),
    "reconstructions.png": ("Rank-5 reconstructions (Figure 2)", plots.reconstructions),
    "spectra.png": ("Singular-value decay (Figure 3)", plots.spectra),
    "locality.png": ("Attention by distance", plots.locality),
}


def record(r: ModelAttention, cfg: AnalysisConfig, command: str, commit: str) -> dict[str, Any]:
    """The JSON entry of one checkpoint: means over users, layers and heads, and the breakdown."""
    d, share = r.locality_curve()
    return {
        "checkpoint": r.checkpoint,
        "model": r.model,
        "label": r.label,
        "dataset": r.dataset,
        "mode": r.mode,
        "attention": r.attention,
        "users": len(r.lengths),
        "mean_length": float(r.lengths.mean()),
        "layers": int(r.sparsity.shape[1]),
        "heads": int(r.sparsity.shape[2]),
        "sparsity_mean": float(r.sparsity.mean()),
        "sparsity_std": float(r.sparsity.std()),
        "sparsity_per_layer_head": r.sparsity.mean(0).tolist(),
        "rank_k_mean": float(r.rank.mean()),
        "rank_k_std": float(r.rank.std()),
        "rank_k_per_layer_head": r.rank.mean(0).tolist(),
        "rank_k_fraction_mean": float((r.rank / r.lengths[:, None, None]).mean()),
        "reconstruction_error_mean": float(r.error.mean()),
        "locality": {"distance": d.tolist(), "share": share.tolist()},
        "spectrum": r.spectrum.tolist(),
        "heatmap_users": r.heat_users,
        "heatmap_window": int(r.heat.shape[0]),
        "sigma": cfg.sigma,
        "seed": cfg.seed,
        "split": cfg.split,
        "command": command,
        "git_commit": commit,
    }


def paper_table(rows: list[dict[str, Any]], key: str, fmt: Callable[[float], str]) -> str:
    """Rows = models, columns = datasets and their average (the layout of Tables 2 and 3)."""
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    labels = Counter((r["label"], r["dataset"]) for r in rows)
    table: dict[str, dict[str, float]] = {}
    for r in rows:
        name = r["label"]
        if labels[(name, r["dataset"])] > 1:  # two runs of one model: tell them apart
            name = f"{name} {Path(r['checkpoint']).name}"
        table.setdefault(name, {})[r["dataset"]] = r[key]
    out = []
    for name, values in table.items():
        cells = {ds: fmt(v) for ds, v in values.items()}
        out.append(
            {"Model/Dataset": name, **cells, "Avg.": fmt(float(np.mean(list(values.values()))))}
        )
    return markdown_table(out, ["Model/Dataset", *datasets, "Avg."])


def write_report(
    results: list[ModelAttention], cfg: AnalysisConfig, out: Path, command: str
) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    commit = git_commit()
    rows = [record(r, cfg, command, commit) for r in results]
    for name, (_, draw) in PICTURES.items():
        draw(results, out / name)
    jpath, mpath = out / "analysis.json", out / "analysis.md"
    jpath.write_text(json.dumps({
        "command": command,
        "git_commit": commit,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": dataclasses.asdict(cfg),
        "models": rows,
        "pictures": list(PICTURES),
    }, indent=2))  # fmt: skip
    detail = markdown_table(
        [{**r, "checkpoint": Path(r["checkpoint"]).name, "mean n": f"{r['mean_length']:.1f}",
          "sparsity": f"{r['sparsity_mean']:.4f} ± {r['sparsity_std']:.4f}",
          "rank k": f"{r['rank_k_mean']:.2f}", "k / n": f"{r['rank_k_fraction_mean']:.2f}",
          "rank-k error": f"{r['reconstruction_error_mean']:.4f}",
          "share at d=0": f"{r['locality']['share'][r['locality']['distance'].index(0)]:.3f}"}
         for r in rows],
        ["checkpoint", "model", "dataset", "mode", "users", "mean n", "sparsity", "rank k", "k / n",
         "rank-k error", "share at d=0"],
    )  # fmt: skip
    pictures = "\n".join(f"- [{title}]({name})\n\n  ![{title}]({name})"
                         for name, (title, _) in PICTURES.items())  # fmt: skip
    mpath.write_text(
        f"# Attention analysis\n\n"
        f"`{command}` (commit {commit}); {cfg.split} histories of up to {cfg.users} users per "
        f"dataset (seed {cfg.seed}); each user's matrix cut to its real n x n block; means over "
        f"users, layers and heads.\n\n"
        f"## Sparsity S = (L1/n) / L2 (lower = sparser; paper Table 2)\n\n"
        f"{paper_table(rows, 'sparsity_mean', lambda v: f'{v:.4f}')}\n\n"
        f"## Hard-threshold rank k (noise sigma = {cfg.sigma:g}; paper Table 3)\n\n"
        f"{paper_table(rows, 'rank_k_mean', lambda v: f'{v:.2f}')}\n\n"
        f"## Per checkpoint\n\n{detail}\n\n"
        f"rank-k error: ||A - A_k||_F / ||A||_F of the rank-k SVD; share at d=0: mean share of a "
        f"query's attention on itself.\n\n## Pictures\n\n{pictures}\n"
    )
    return jpath, mpath
