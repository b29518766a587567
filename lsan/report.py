"""Collect trained checkpoints into one results table (JSON + markdown) with their commands.

`lsan report runs/beauty-* --name models-beauty` writes benchmarks/results/models-beauty.json and
.md: HR/NDCG@5/10/20, parameters, model bytes, seconds per epoch and the exact training command of
every checkpoint, plus each row's parameter and NDCG@10 ratio to a reference model (SASRec).
"""

from __future__ import annotations

import dataclasses
import json
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

from lsan.checkpoint import read_config, read_metrics
from lsan.tables import markdown_table

COLUMNS = ["run", "HR@5", "NDCG@5", "HR@10", "NDCG@10", "HR@20", "NDCG@20", "params", "params vs ref",
           "NDCG@10 vs ref", "model bytes", "s/epoch", "epochs"]  # fmt: skip


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def collect(checkpoints: list[Path], reference: str = "sasrec") -> list[dict[str, Any]]:
    rows = []
    for ckpt in checkpoints:
        metrics = read_metrics(ckpt)
        if not metrics:
            continue
        run, _ = read_config(ckpt)
        rows.append({
            "run": ckpt.name,
            "model": run.model_name,
            "dataset": metrics["dataset"],
            **metrics["test"],
            "valid_NDCG@10": metrics["valid"]["NDCG@10"],
            "params": metrics["parameters"],
            "model bytes": metrics.get("model_bytes") or (ckpt / "model.pt").stat().st_size,
            "s/epoch": metrics["seconds_per_epoch"],
            "epochs": metrics["epochs"],
            "best_epoch": metrics["best_epoch"],
            "model_config": dataclasses.asdict(run.model),
            "command": metrics.get("command", ""),
            "checkpoint": str(ckpt),
        })  # fmt: skip
    ref = next((r for r in rows if r["model"] == reference), None)
    for r in rows:
        r["params vs ref"] = f"{r['params'] / ref['params']:.0%}" if ref and ref["params"] else "-"
        if ref and ref["NDCG@10"] > 0:
            r["NDCG@10 vs ref"] = f"{r['NDCG@10'] / ref['NDCG@10'] - 1:+.1%}"
        else:
            r["NDCG@10 vs ref"] = "-"
    return rows


def write_report(
    rows: list[dict[str, Any]], name: str, out: Path, command: str,
    extra: dict[str, Any] | None = None,
) -> tuple[Path, Path]:  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "name": name,
        "command": command,
        "git_commit": git_commit(),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"platform": platform.platform(), "processor": platform.processor()},
        "protocol": "leave-one-out, full ranking over the catalogue, seen items masked, test split",
        "rows": rows,
        **(extra or {}),
    }
    jpath, mpath = out / f"{name}.json", out / f"{name}.md"
    jpath.write_text(json.dumps(record, indent=2))
    commands = "\n".join(f"- `{r['run']}`: `{r['command']}`" for r in rows if r["command"])
    mpath.write_text(f"# {name}\n\n{markdown_table(rows, COLUMNS)}\n\nCommands:\n{commands}\n")
    return jpath, mpath
