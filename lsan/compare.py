"""`lsan compare`: train several models on one dataset and tabulate them in the seed's style.

One row per model (HR/NDCG@5/10/20 on the test split, parameters, seconds per epoch), each
column's best in bold, and the relative improvement of auto-regressive over auto-encoding
attention: the best AR model against the best AE model per column (the seed paper's "AR over
AE"), plus every AR run against every AE run of the same design (e.g. sasrec vs bert4rec and
vs local, lsan causal vs lsan bidirectional). Models without attention (pop, gru4rec, ...) are
listed but belong to no side.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from lsan.checkpoint import read_config, read_metrics
from lsan.config import RunConfig
from lsan.report import collect, write_report
from lsan.tables import markdown_table

METRICS = ["HR@5", "NDCG@5", "HR@10", "NDCG@10", "HR@20", "NDCG@20"]


def mode(run: RunConfig) -> str:
    """AR, AE, or "-" for models without a self-attention switch."""
    attention = getattr(run.model, "attention", None)
    if attention is None:
        return "-"
    return "AR" if attention == "causal" else "AE"


def architecture(run: RunConfig) -> str:
    """Model identity without the attention switch, to pair AR and AE runs of one design."""
    fields = {k: v for k, v in dataclasses.asdict(run.model).items()}
    for key in ("attention", "mask_prob", "window"):
        fields.pop(key, None)
    return f"{type(run.model).__name__}:{sorted(fields.items())}"


def relative(ar: dict[str, Any], ae: dict[str, Any]) -> dict[str, str]:
    return {m: f"{ar[m] / ae[m] - 1:+.1%}" if ae[m] > 0 else "-" for m in METRICS}


def comparison_rows(rows: list[dict[str, Any]], runs: list[RunConfig]) -> list[dict[str, Any]]:
    """Rows with mode, bold column winners, and the AR-over-AE rows appended."""
    for row, run in zip(rows, runs, strict=True):
        row["mode"] = mode(run)
    shown = [dict(r) for r in rows]
    for m in METRICS:
        best = max((r[m] for r in rows), default=0.0)
        for r, s in zip(rows, shown, strict=True):
            s[m] = f"**{r[m]:.4f}**" if r[m] == best else f"{r[m]:.4f}"
    ar = [r for r in rows if r["mode"] == "AR"]
    ae = [r for r in rows if r["mode"] == "AE"]
    if ar and ae:
        best_ar = {m: max(r[m] for r in ar) for m in METRICS}
        best_ae = {m: max(r[m] for r in ae) for m in METRICS}
        shown.append({"run": "AR over AE (best vs best)", **relative(best_ar, best_ae)})
    designs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for row, run in zip(rows, runs, strict=True):
        if row["mode"] in ("AR", "AE"):
            designs.setdefault(architecture(run), {}).setdefault(row["mode"], []).append(row)
    for design in designs.values():
        for ar_row in design.get("AR", []):
            for ae_row in design.get("AE", []):
                name = f"{ar_row['run']} over {ae_row['run']}"
                shown.append({"run": name, **relative(ar_row, ae_row)})
    return shown


def compare(
    runs: dict[str, RunConfig], out: Path, name: str, results: Path, command: str = "",
    progress: bool = True, ds: Any = None,
) -> tuple[str, Path]:  # fmt: skip
    """Train every run into out/<key> (finished ones are reused) and write the table files."""
    from lsan.train import train

    out.mkdir(parents=True, exist_ok=True)
    for key, run in runs.items():
        ckpt = out / key
        if read_metrics(ckpt):
            print(f"{key}: reusing the finished checkpoint in {ckpt}")
            continue
        print(f"{key}: training into {ckpt}")
        train(run, ckpt, resume=True, progress=progress, ds=ds, command=command)
    rows = collect([out / key for key in runs])
    saved = [read_config(out / key)[0] for key in runs]  # what each checkpoint really is
    table_rows = comparison_rows(rows, saved)
    columns = ["run", "mode", *METRICS, "params", "s/epoch", "epochs"]
    table = markdown_table(table_rows, columns)
    jpath, mpath = write_report(rows, name, results, command, extra={"table": table_rows})
    mpath.write_text(f"# {name}\n\n{table}\n\nCommand: `{command}`\n")
    return table, jpath
