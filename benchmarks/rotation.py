"""Latency of exported artifacts in one interleaved rotation, with each graph's floor: no accuracy.

    python -m benchmarks.rotation --artifact lowbit=artifacts/beauty-lowbit \\
        --artifact lsan-student=artifacts/beauty-lsan-student --runs 3 --name rotation-beauty

The frontier (benchmarks.device_frontier) times its artifacts the same way, but only beside
exporting and evaluating each checkpoint on the test split. This times folders that already
exist: on a new host, or a set of files whose accuracy is known, the latency targets can be
checked without retraining anything, and files of the same architecture and format with other
weights (a one-epoch twin of a checkpoint this machine lacks) stand in for it, since the time
of a graph does not depend on its weights. Each of `--runs` runs is `device_frontier.timings`
(cold: one call per artifact in turn, after reading through a buffer of `--evict-mib` when given, so
that a few small files, which would share the caches, are timed cold too; warm: blocks of
calls; batch 1, full history, 1 thread);
the table gives each artifact's range over the runs, its floor (benchmarks.floor, one set of
reference points measured first) and how many artifacts answer within `--cold-target` ms cold.
Writes NAME.json (command, git commit, machine, every run) and prints the table.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from lsan.artifact import Artifact, ArtifactError, read
from lsan.benchmarks.device_frontier import floors, reference_points, timings, warn_if_cached
from lsan.benchmarks.env import environment, write_record
from lsan.tables import markdown_table


def parse_artifacts(specs: list[str], ap: argparse.ArgumentParser) -> dict[str, Path]:
    """NAME=FOLDER pairs -> {name: folder}; a bad pair or a folder without an artifact is an
    argument error (one line), before anything is timed."""
    out: dict[str, Path] = {}
    for spec in specs:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not folder:
            ap.error(f"--artifact takes NAME=FOLDER, got {spec!r}")
        if name in out:
            ap.error(f"--artifact name {name!r} given twice")
        if not (Path(folder) / "model.onnx").is_file():
            ap.error(f"not an artifact folder (no model.onnx): {folder}")
        out[name] = Path(folder)
    return out


def artifact_flags(ap: argparse.ArgumentParser, name: str, artifact_help: str) -> None:
    """The flags every benchmark of existing folders takes: --artifact (repeated), --name, --out."""
    ap.add_argument("--artifact", action="append", required=True, metavar="NAME=FOLDER",
                    help=artifact_help)  # fmt: skip
    ap.add_argument("--name", default=name, help="results file stem")
    ap.add_argument("--out", default="benchmarks/results")


def read_artifacts(
    specs: list[str], ap: argparse.ArgumentParser
) -> tuple[dict[str, Path], dict[str, Artifact]]:
    """--artifact values -> ({name: folder}, {name: the artifact read and verified}); any bad
    one is an argument error (one line) before anything is measured."""
    folders = parse_artifacts(specs, ap)
    try:
        return folders, {name: read(folder) for name, folder in folders.items()}
    except ArtifactError as e:
        ap.error(str(e))


def rows(runs: list[dict[str, dict]], work: dict[str, dict], cold_target: float) -> list[dict]:
    """One row per artifact (ms): cold / warm p50 as min and max over the runs, the worst cold
    p99, the graph's nodes and floor, and in how many runs its cold p50 met `cold_target`."""
    out = []
    for key in runs[0]:
        c50 = [r[key]["cold"]["p50"] for r in runs]
        w50 = [r[key]["warm"]["p50"] for r in runs]
        out.append({
            "artifact": key, "cold_p50_min": min(c50), "cold_p50_max": max(c50),
            "cold_p99_max": max(r[key]["cold"]["p99"] for r in runs),
            "warm_p50_min": min(w50), "warm_p50_max": max(w50), "nodes": work[key]["nodes"],
            "floor_ms": work[key]["floor_ms"],
            "runs_cold_within_target": sum(c <= cold_target for c in c50), "runs": len(runs),
        })  # fmt: skip
    return out


def shown(row: dict[str, Any], cold_target: float) -> dict[str, Any]:
    """A row as the printed table shows it."""
    f = row["floor_ms"]
    return {
        "artifact": row["artifact"],
        "cold p50 ms": f"{row['cold_p50_min']:.3f}-{row['cold_p50_max']:.3f}",
        "cold p99 ms (worst)": f"{row['cold_p99_max']:.3f}",
        "warm p50 ms": f"{row['warm_p50_min']:.3f}-{row['warm_p50_max']:.3f}",
        "nodes": row["nodes"], "floor ms": f"{f:.3f}",
        "warm p50 / floor": f"{row['warm_p50_min'] / f:.1f}-{row['warm_p50_max'] / f:.1f}x",
        f"cold p50 <= {cold_target} ms": f"{row['runs_cold_within_target']} of {row['runs']} runs",
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.rotation",
                                 description=__doc__.splitlines()[0])  # fmt: skip
    artifact_flags(
        ap, "rotation", "an exported artifact folder; repeat for every file of the rotation"
    )
    ap.add_argument("--runs", type=int, default=3, help="interleaved runs (each of --rounds)")
    ap.add_argument("--rounds", type=int, default=20, help="rounds per run (x 20 calls each)")
    ap.add_argument("--cold-target", type=float, default=0.25, help="ms, batch 1 cold p50")
    ap.add_argument("--evict-mib", type=int, default=0,
                    help="read through a buffer this large (MiB) before every cold call, so a few small "
                         "files are timed cold too (about 2x the last-level cache; 0 = off)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.runs < 1 or args.rounds < 1 or args.cold_target <= 0 or args.evict_mib < 0:
        ap.error(
            "--runs and --rounds must be at least 1, --cold-target above 0, --evict-mib 0 or more"
        )
    folders, arts = read_artifacts(args.artifact, ap)
    evict_bytes = args.evict_mib << 20
    k = min(a.meta.contract.k for a in arts.values())
    work = floors(arts, folders, k, evict_bytes)
    runs = []
    for i in range(args.runs):
        runs.append(timings(arts, rounds=args.rounds, evict_bytes=evict_bytes))
        c50 = [t["cold"]["p50"] for t in runs[-1].values()]
        print(f"run {i + 1} of {args.runs}: cold p50 {min(c50):.3f}-{max(c50):.3f} ms, "
              f"{sum(c <= args.cold_target for c in c50)} of {len(c50)} within {args.cold_target} ms")  # fmt: skip
    table = rows(runs, work, args.cold_target)
    printed = [shown(r, args.cold_target) for r in table]
    print(markdown_table(printed, list(printed[0])))
    ref = work["_reference"]
    print(f"reference points: {reference_points(ref, k)}")
    command = shlex.join(["python", "-m", "benchmarks.rotation", *(argv or sys.argv[1:])])
    host = environment(command)
    caveat = warn_if_cached(work, host["machine"], evict_bytes)
    write_record({"environment": host, "folders": {k: str(v) for k, v in folders.items()},
                  "floors": work, "runs": runs, "table": table, "evict_mib": args.evict_mib,
                  "cold_caveat": caveat},
                 Path(args.out) / f"{args.name}.json")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
