"""`python -m benchmarks.run` (also `lsan bench`): the whole suite on given checkpoints, one run.

    python -m benchmarks.run --checkpoints runs/beauty-sasrec runs/beauty-lsan runs/beauty-lsan_full \
        --name beauty --data-dir ../shared/data

Each checkpoint is exported in every format with export/export.py (into a temporary folder, or
--work to keep the artifacts), then measured side by side: size, memory, latency, accuracy vs
size, catalogue scaling and a lower bound (one module each in benchmarks/). Writes
benchmarks/results/NAME.json (every row, the environment, the command), NAME.md (tables, ratios
vs SASRec fp32, the targets with PASS/MISS) and NAME-{frontier,latency,scaling}.png.
--quick uses few repeats, small catalogues and no dataset (NDCG None), for CI.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lsan.artifact import DEFAULT_K
from lsan.benchmarks import bound, frontier, latency, memory, report, scaling, size
from lsan.benchmarks.artifacts import dataset_for, export_all, load_checkpoints
from lsan.benchmarks.env import cores, environment
from lsan.checkpoint import CheckpointError
from lsan.data.prepare import SeqDataset
from lsan.data.readers import DataError
from lsan.export import ExportError
from lsan.export.quantize import FORMATS

SECTIONS = ("size", "memory", "latency", "frontier", "scaling", "bound")


@dataclass(frozen=True)
class Settings:
    quick: bool = False
    formats: tuple[str, ...] = FORMATS
    skip: tuple[str, ...] = ()
    k: int = DEFAULT_K  # top-K in the exported graph
    warmup: int = 30  # untimed calls before each latency measurement
    repeats: int = 300  # timed calls at batch 1 (a fifth of it at batch 32/256)
    budget_s: float = 10.0  # at most this long per latency configuration
    batches: tuple[int, ...] = (1, 32, 256)
    requests: int = 50  # requests answered by each memory probe
    scaling_sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    max_memory: int = 4 * 2**30  # skip scaling models whose export would need more (bytes)
    bandwidth_bytes: int = 256 * 2**20  # largest working set of the bandwidth probe
    evaluate: bool = True  # test metrics of each artifact (needs the checkpoint's dataset)
    data_dir: str = ""


QUICK = {"warmup": 3, "repeats": 20, "budget_s": 1.0, "requests": 10, "evaluate": False,
         "scaling_sizes": (10_000, 100_000), "bandwidth_bytes": 32 * 2**20}  # fmt: skip


def run_suite(
    checkpoints: list[Path], name: str, out: Path, settings: Settings, command: str = "",
    work: Path | None = None, ds: SeqDataset | None = None, log=print,
) -> dict[str, Any]:  # fmt: skip
    """Run every section not in settings.skip; write NAME.json/.md/.png into `out`.

    `ds` replaces loading each checkpoint's dataset for the test metrics (tests pass one; it
    must be the dataset every checkpoint was trained on).
    """
    s, t0 = settings, time.perf_counter()
    ckpts = load_checkpoints(checkpoints)
    out.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"name": name, "quick": s.quick, "env": environment(command),
                           "settings": dict(vars(s))}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="lsan-bench-") as tmp:
        work = work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        datasets: dict[tuple, SeqDataset] = {}
        artifacts = []
        if set(SECTIONS) - set(s.skip) - {"scaling"}:  # scaling builds its own models
            log("export")
            for c in ckpts:
                data = ds
                if data is None and s.evaluate:
                    data = dataset_for(c, s.data_dir, datasets)
                artifacts += export_all(c, work, list(s.formats), s.k, data, log)
        need_peak = "bound" not in s.skip or "scaling" not in s.skip
        peak = bound.machine_peak(res["env"], s.bandwidth_bytes) if need_peak else {}
        if "size" not in s.skip:
            res["size"] = [size.artifact_size(a) for a in artifacts]
        if "memory" not in s.skip:
            log("memory")
            res["memory"] = memory.measure(artifacts, s.requests, log)
        if "latency" not in s.skip:
            log("latency")
            res["latency"] = latency_rows(artifacts, ckpts, s, log)
        if "frontier" not in s.skip:
            res["frontier"] = frontier.rows(artifacts)
        if "scaling" not in s.skip:
            log("scaling")
            res["scaling"] = scaling.measure(
                scaling.architectures(ckpts), list(s.scaling_sizes), work, peak, s.warmup,
                s.repeats, s.budget_s, s.max_memory, log, s.k,
            )  # fmt: skip
        if "bound" not in s.skip:
            res["bound"] = {
                "machine": peak,
                "rows": bound_rows(artifacts, res.get("latency", []), peak),
            }
    res["env"]["load_average_end"] = list(os.getloadavg())
    res["seconds"] = round(time.perf_counter() - t0, 1)
    res["targets"] = report.targets(res)
    (out / f"{name}.json").write_text(json.dumps(res, indent=2))
    for path in [out / f"{name}.json", *report.render(res, out, name)]:
        log(f"wrote {path}")
    return res


def latency_rows(artifacts, ckpts, s: Settings, log) -> list[dict[str, Any]]:
    rows, n = [], cores()
    for a in artifacts:
        rows += latency.onnxruntime_rows(a, s.batches, n, s.warmup, s.repeats, s.budget_s)
        rows += latency.runtime_rows(a, s.warmup, s.repeats, s.budget_s)
        last = rows[-1]  # the serving runtime at full history length
        log(f"  {a.ckpt.label:24s} {a.format:12s} recommend p50 {last['p50_ms']:.3f} ms "
            f"(batch 1, 1 thread, history {last['length']})")  # fmt: skip
    for c in ckpts:
        rows += latency.torch_rows(c, s.batches, n, s.k, s.warmup, s.repeats, s.budget_s)
    return rows


def bound_rows(artifacts, lat: list[dict[str, Any]], peak: dict[str, Any]) -> list[dict[str, Any]]:
    """The bound of every batch-1 onnxruntime measurement, next to its measured p50."""
    rows = []
    for a in artifacts:
        info = a.ckpt.info
        for t in sorted({min(10, info.max_len), info.max_len}):
            b = bound.bound_row(a.ckpt.model, info, t, a.format, peak)
            m = report.find(lat, **a.key, engine="onnxruntime", batch=1, length=t)
            measured = m["p50_ms"] if m else None
            rows.append({**a.key, **b, "measured_p50_ms": measured,
                         "gap": measured / b["bound_ms"] if measured else None})  # fmt: skip
    return rows


# ---------------------------------------------------------------- command line


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__.splitlines()[0]
    )
    ap.add_argument(
        "--checkpoints", nargs="+", required=True, type=Path, help="checkpoint directories"
    )
    ap.add_argument(
        "--name", required=True, help="results file name (benchmarks/results/NAME.json)"
    )
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument(
        "--quick", action="store_true", help="few repeats, small catalogues, no dataset (CI)"
    )
    ap.add_argument(
        "--skip", default="", help=f"comma-separated sections to skip: {','.join(SECTIONS)}"
    )
    ap.add_argument(
        "--formats", default=",".join(FORMATS), help="artifact formats to export and measure"
    )
    ap.add_argument(
        "--data-dir",
        default="",
        help="raw data folder for the test metrics (default: the checkpoint's)",
    )
    ap.add_argument(
        "--no-eval", action="store_true", help="skip the test metrics (no dataset needed)"
    )
    ap.add_argument("--repeats", type=int, help="timed calls per batch-1 configuration")
    ap.add_argument("--warmup", type=int, help="untimed calls before each configuration")
    ap.add_argument("--budget", type=float, help="max seconds per latency configuration")
    ap.add_argument(
        "--batches", help="batch sizes timed, e.g. 1,32,256 (1 = one thread, others all)"
    )
    ap.add_argument("--scaling-sizes", help="catalogue sizes, e.g. 10000,100000,1000000")
    ap.add_argument(
        "--max-memory-gb", type=float, help="skip scaling models needing more to export"
    )
    ap.add_argument(
        "--k", type=int, default=DEFAULT_K, help="top-K computed in the exported graphs"
    )
    ap.add_argument("--work", type=Path, help="keep the exported artifacts in this folder")
    ap.add_argument("--quiet", action="store_true")
    return ap  # fmt: skip


def settings_from(args: argparse.Namespace) -> Settings:
    values: dict[str, Any] = dict(QUICK) if args.quick else {}
    skip = tuple(x for x in args.skip.split(",") if x)
    formats = tuple(x for x in args.formats.split(",") if x)
    for bad, known, what in ((skip, SECTIONS, "section"), (formats, FORMATS, "format")):
        unknown = set(bad) - set(known)
        if unknown:
            raise ValueError(
                f"unknown {what} {', '.join(sorted(unknown))} (known: {', '.join(known)})"
            )
    values.update(quick=args.quick, skip=skip, formats=formats, k=args.k, data_dir=args.data_dir)
    if args.no_eval:
        values["evaluate"] = False
    for key, flag in (
        ("repeats", args.repeats),
        ("warmup", args.warmup),
        ("budget_s", args.budget),
    ):
        if flag is not None:
            values[key] = flag
    if args.batches:
        values["batches"] = tuple(int(v) for v in args.batches.split(","))
    if args.scaling_sizes:
        values["scaling_sizes"] = tuple(int(v) for v in args.scaling_sizes.split(","))
    if args.max_memory_gb:
        values["max_memory"] = int(args.max_memory_gb * 2**30)
    return Settings(**values)


def main(argv: list[str] | None = None, ds: SeqDataset | None = None) -> int:
    args = parser().parse_args(argv)
    command = shlex.join(
        ["python", "-m", "benchmarks.run", *(sys.argv[1:] if argv is None else argv)]
    )
    logging.getLogger().setLevel(logging.ERROR)  # onnxruntime.quantization's advice on stderr
    for noisy in ("torch.onnx", "torch.onnx._internal.exporter._registration"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="torch.onnx")
    log = (lambda *_: None) if args.quiet else print
    try:
        settings = settings_from(args)
        run_suite(args.checkpoints, args.name, args.out, settings, command, args.work, ds, log)
    except (ValueError, ExportError, CheckpointError, DataError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
