"""The export's two-stage top-K against onnxruntime's single TopK, interleaved, by catalogue size.

    python -m benchmarks.topk --checkpoints runs/beauty-sasrec-d32-do4 runs/beauty-lowbit \\
        --sizes 40000 100000 1000000 --name topk

Each checkpoint's architecture (its config; the weights are random, as in the scaling
benchmark) is exported at each catalogue size twice, with the two-stage top-K
(`export/graph.py: top_k`) and with one TopK, and converted to its shipped format (`lowbit` for
a low-bit table, else int8); below `BLOCKED_FROM` ids the two are one graph (block "-"), the
control rows. Both files answer the same full-length requests; their answers
must be identical (top items and scores), and their batch-1, one-thread latencies are timed in
turns, so a drifting host shifts both alike. Writes NAME.json (with the command, git commit and
machine) and prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from lsan.artifact import DEFAULT_K, session
from lsan.benchmarks.artifacts import load_checkpoints
from lsan.benchmarks.env import environment, write_record
from lsan.benchmarks.latency import interleaved, request_feeds, summary
from lsan.benchmarks.scaling import architectures, random_model
from lsan.export.graph import export_fp32, top_k_block
from lsan.export.quantize import convert
from lsan.tables import markdown_table


def compare(
    arch: tuple[str, str, Any, Any], num_items: int, work: Path, warmup: int, repeats: int,
    k: int = DEFAULT_K,
) -> dict[str, Any]:  # fmt: skip
    """One architecture at one catalogue size: the two exports' p50s and whether they agree."""
    desc, name, cfg, template = arch
    info = dataclasses.replace(template, num_items=num_items)
    model, table = random_model(name, cfg, info)
    fmt = "lowbit" if table is not None else "int8"
    x = request_feeds(info, 1, info.max_len)
    runs, answers = [], []
    for two_stage in (False, True):
        fp32, path = work / "fp32.onnx", work / f"{fmt}-{two_stage}.onnx"
        export_fp32(model, info, fp32, min(k, num_items), two_stage)
        convert(fp32, path, fmt, [], table)
        run = partial(session(path, 1).run, ["top_items", "top_scores"], x)
        answers.append(run())
        runs.append(run)
    plain, blocked = interleaved(runs, warmup, repeats, budget_s=60)
    same = all(np.array_equal(a, b) for a, b in zip(*answers, strict=True))
    one, two = summary(plain, 1)["p50_ms"], summary(blocked, 1)["p50_ms"]
    block = top_k_block(num_items + 1, min(k, num_items))  # the padding id's column too
    return {"arch": desc, "format": fmt, "items": num_items, "block": block, "one TopK p50 ms": one,
            "two stages p50 ms": two, "saved ms": one - two, "speed-up": f"{one / two:.2f}x",
            "same answers": same, "calls": len(plain)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoints", nargs="+", required=True, help="architectures to build")
    ap.add_argument("--sizes", nargs="+", type=int, default=[40_000, 100_000, 1_000_000])
    ap.add_argument("--repeats", type=int, default=200, help="timed calls of each export")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--name", default="topk")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    if min(args.sizes) < 2 * DEFAULT_K or args.repeats < 3 or args.warmup < 0:
        ap.error(f"sizes must be at least {2 * DEFAULT_K}, repeats at least 3, warmup >= 0")
    missing = [c for c in args.checkpoints if not (Path(c) / "config.json").is_file()]
    if missing:
        ap.error(f"not a checkpoint folder (no config.json): {', '.join(missing)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="lsan-topk-") as tmp:
        for arch in architectures(load_checkpoints([Path(c) for c in args.checkpoints])):
            for n in args.sizes:
                rows.append(compare(arch, n, Path(tmp), args.warmup, args.repeats))
                r = rows[-1]
                print(f"  {r['arch']} |V|={n:,}: {r['one TopK p50 ms']:.3f} -> "
                      f"{r['two stages p50 ms']:.3f} ms, same answers {r['same answers']}")  # fmt: skip
    shown = {None: "-", True: "yes", False: "no"}
    print(markdown_table([{k: shown.get(v, v) if isinstance(v, bool | None) else v
                           for k, v in r.items()} for r in rows], list(rows[0])))  # fmt: skip
    command = shlex.join(["python", "-m", "benchmarks.topk", *(argv or sys.argv[1:])])
    write_record({"environment": environment(command), "rows": rows},
                 Path(args.out) / f"{args.name}.json")  # fmt: skip
    return 0 if all(r["same answers"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
