"""What an artifact becomes in the ORT format that a reduced onnxruntime build needs: bytes,
answers and speed, against the artifact's own model.onnx.

    python -m benchmarks.ort_format --artifact lowbit=artifacts/beauty-lowbit --name ort-format

The standard onnxruntime packages (pip, onnxruntime-android, the iOS pods) are full builds: they
load model.onnx and fold its decoders into constants at load, so a compact file is what ships and
what a request reads decoded. A reduced build (only the model's operators, for a smaller native
library) loads only ORT-format files and has no graph optimizer, so whatever the file holds is what
every request runs. Two ways to make that file, both measured per artifact:

- `ort`: onnxruntime's converter (`onnxruntime.tools.convert_onnx_models_to_ort`, Fixed style,
  portable: no x86-only layouts) optimizes before saving, so the decoders are folded and the
  file holds the decoded weights: as fast as model.onnx, several times its bytes. Its
  `required_operators.config` (the operators a reduced build must include) is recorded.
- `ort-unoptimized`: the graph saved as it is, nothing folded: the compact bytes, but every
  request decodes the weights again.

Each is checked against model.onnx over `--requests` random full histories (the largest score
difference, and the share of identical top-K lists), sized as stored and deflated (zlib level 9,
as an app package or a download would compress it), and timed with `device_frontier.timings`
beside it (warm p50 / p99, interleaved, batch 1, 1 thread; not cold, since within an artifact
each file's cold call follows its sibling's), and loaded in fresh processes (`memory.load_cost`:
the session's load time, median of three, and the peak resident set over the imports: what an
app pays at start). `--keep DIR` keeps the converted files.
Writes NAME.json (command, git commit, machine, rows) and prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import shlex
import sys
import tempfile
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from lsan.artifact import MODEL, Artifact, session
from lsan.benchmarks.device_frontier import timings
from lsan.benchmarks.env import environment, write_record
from lsan.benchmarks.latency import request_feeds
from lsan.benchmarks.memory import load_cost
from lsan.benchmarks.rotation import artifact_flags, read_artifacts
from lsan.tables import markdown_table

VARIANTS = ("onnx", "ort", "ort-unoptimized")


def operators(model: Path) -> list[str]:
    """The operators an ORT-format file runs, as `domain;opset;ops` lines: what a reduced
    onnxruntime build must include (`--include_ops_by_config`) to load it."""
    from onnxruntime.tools.ort_format_model.utils import create_config_from_models

    config = model.with_suffix(".required_operators.config")
    create_config_from_models([model], config, enable_type_reduction=False)
    return [ln for ln in config.read_text().splitlines() if ln and not ln.startswith("#")]


def convert(model: Path, out: Path) -> dict[str, Path]:
    """model.onnx -> {"ort": out/ort/model.ort by onnxruntime's converter, "ort-unoptimized":
    out/raw/model.ort, the graph saved as it is}; each beside its operator config."""
    from onnxruntime.tools.convert_onnx_models_to_ort import (
        OptimizationStyle,
        convert_onnx_models_to_ort,
    )

    logging.getLogger("ort_format_model.utils").setLevel(logging.WARNING)  # not "Created config"
    with contextlib.redirect_stdout(io.StringIO()):  # the converter narrates every step
        convert_onnx_models_to_ort(model, out / "ort", [OptimizationStyle.Fixed])
    raw = out / "raw" / "model.ort"
    raw.parent.mkdir(parents=True, exist_ok=True)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.optimized_model_filepath = str(raw)
    opts.add_session_config_entry("session.save_model_format", "ORT")
    ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    return {"ort": out / "ort" / "model.ort", "ort-unoptimized": raw}


def answers(ref: Artifact, other: ort.InferenceSession, requests: int) -> dict[str, float]:
    """`other` against the artifact's own session on `requests` random full histories (one
    batch): the largest absolute score difference and the share of identical top-K lists."""
    info = ref.meta.info
    x = request_feeds(info, batch=requests, length=info.max_len, seed=1)
    names = ["top_items", "scores"]
    (top_a, s_a), (top_b, s_b) = ref.session.run(names, x), other.run(names, x)
    finite = np.isfinite(s_a) & np.isfinite(s_b)  # excluded items score -inf in both
    return {
        "max_abs_score_diff": float(np.abs(s_a - s_b)[finite].max()),
        "excluded_agree": bool(np.array_equal(np.isfinite(s_a), np.isfinite(s_b))),
        "top_k_identical": float(np.mean(np.all(top_a == top_b, axis=1))),
    }


def measure(
    arts: dict[str, Artifact], work: Path, requests: int, rounds: int
) -> list[dict[str, Any]]:
    """Every artifact as model.onnx, `ort` and `ort-unoptimized`: bytes, answers, latency."""
    rows, timed = [], {}
    for name, art in arts.items():
        onnx_bytes = (art.path / MODEL).stat().st_size
        files = {"onnx": art.path / MODEL, **convert(art.path / MODEL, work / name)}
        threads = art.session.get_session_options().intra_op_num_threads
        for variant, path in files.items():
            sess = art.session if variant == "onnx" else session(path, threads)
            size = path.stat().st_size
            row = {"artifact": name, "variant": variant, "format": art.meta.quantization,
                   "model_bytes": size, "x_onnx_bytes": size / onnx_bytes,
                   "deflate_bytes": len(zlib.compress(path.read_bytes(), 9)),
                   "operators": None if variant == "onnx" else operators(path)}  # fmt: skip
            rows.append(row | answers(art, sess, requests) | load_cost(path))
            timed[f"{name} {variant}"] = replace(art, session=sess)
    t = timings(timed, rounds=rounds)
    for row in rows:  # warm only: each file's cold call would follow its sibling's, warming it
        lat = t[f"{row['artifact']} {row['variant']}"]["warm"]
        row |= {"warm_p50_ms": lat["p50"], "warm_p99_ms": lat["p99"]}
    onnx_warm = {r["artifact"]: r["warm_p50_ms"] for r in rows if r["variant"] == "onnx"}
    for row in rows:
        row["x_onnx_warm"] = row["warm_p50_ms"] / onnx_warm[row["artifact"]]
    return rows


def shown(row: dict[str, Any]) -> dict[str, Any]:
    """A row as the printed table shows it."""
    return {
        "artifact": row["artifact"], "format": row["format"], "file": row["variant"],
        "bytes": f"{row['model_bytes']:,}", "x model.onnx bytes": f"{row['x_onnx_bytes']:.2f}",
        "deflated bytes": f"{row['deflate_bytes']:,}",
        "max abs score diff": f"{row['max_abs_score_diff']:.1e}",
        "identical top-K": f"{row['top_k_identical']:.0%}",
        "warm p50 ms": f"{row['warm_p50_ms']:.3f}", "warm p99 ms": f"{row['warm_p99_ms']:.3f}",
        "x model.onnx warm": f"{row['x_onnx_warm']:.2f}",
        "load ms": f"{row['load_ms']:.1f}", "RSS over imports MiB": f"{row['rss_over_import_mib']:.1f}",
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ort_format",
                                 description=__doc__.splitlines()[0])  # fmt: skip
    artifact_flags(ap, "ort-format", "an exported artifact folder; repeat for more")
    ap.add_argument("--requests", type=int, default=64, help="random histories compared")
    ap.add_argument("--rounds", type=int, default=20, help="timing rounds (x 20 calls each)")
    ap.add_argument("--keep", default="", help="keep the converted files under this folder")
    args = ap.parse_args(argv)
    if args.requests < 1 or args.rounds < 1:
        ap.error("--requests and --rounds must be at least 1")
    folders, arts = read_artifacts(args.artifact, ap)
    with contextlib.ExitStack() as stack:
        work = Path(args.keep or stack.enter_context(tempfile.TemporaryDirectory()))
        rows = measure(arts, work, args.requests, args.rounds)
    printed = [shown(r) for r in rows]
    print(markdown_table(printed, list(printed[0])))
    command = shlex.join(["python", "-m", "benchmarks.ort_format", *(argv or sys.argv[1:])])
    write_record({"environment": environment(command), "rows": rows,
                  "folders": {k: str(v) for k, v in folders.items()},
                  "kept": args.keep or None}, Path(args.out) / f"{args.name}.json")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
