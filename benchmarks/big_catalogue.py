"""Big catalogue: training and full-ranking evaluation over 1M items in bounded memory, 1 thread.

    python -m benchmarks.big_catalogue      # about 11 min on one core (+2 min the first time)

The data is `synthetic-1m` (lsan.data.prepare.SYNTHETIC): 2,000 generated users with 5.8M
interactions over 1,007,984 items once prepared with data.min_count=1 (a catalogue exists only
where items occur, hence that many interactions). It is prepared (generated the first time, then
read from the cache) in a process of its own. Then each model runs, in a fresh process so that
its peak RSS (VmHWM) is its own, the documented command

    lsan train --dataset synthetic-1m --model MODEL --device cpu --quiet --set data.min_count=1
        --set train.loss=sampled --set train.epochs=1 --set train.threads=1 --out DIR

(one epoch: the last 50 steps of every user, 2,000 sequences in 8 steps, then the trainer's
validation and final evaluations), followed by one more timed full-ranking evaluation of the
test split: every user against every item, in steps of at most eval.max_scores (16M) scores.
One epoch learns next to nothing at this scale; the point is time and memory, not accuracy.

The runs: LSAN as configured by default (m1 = 2: base tables of 2 and 504k rows, D = 128), LSAN
with balanced base tables (m1 = 0: two tables of 1,004 rows) and SASRec (one 1M x 64 table).
All train with sampled softmax (100 negatives): a full softmax needs (positions x |V|) logits per
step, 256 x ~50 x 1M = 51 GB, for LSAN's factorised scores as for a full table.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lsan.benchmarks.env import REPO, environment, write_record
from lsan.benchmarks.gpu_smoke import peak_rss_bytes

DATASET = "synthetic-1m"
DEFAULT_OUT = REPO / "benchmarks" / "results" / "big-catalogue.json"


def train_argv(spec: str, out: Path, cache_dir: str) -> list[str]:
    """The `lsan train` command measured for `spec`: a model name, optionally `:key=value,...`
    model settings (`lsan:m1=0` is LSAN with balanced base tables)."""
    model, _, settings = spec.partition(":")
    sets = ["data.min_count=1", "train.loss=sampled", "train.epochs=1", "train.threads=1"]
    sets += [f"model.{kv}" for kv in settings.split(",") if kv]
    argv = ["train", "--dataset", DATASET, "--model", model, "--device", "cpu", "--quiet"]
    argv += [x for s in sets for x in ("--set", s)]
    return argv + (["--cache-dir", cache_dir] if cache_dir else []) + ["--out", str(out)]


def prepare(cache_dir: str) -> dict[str, Any]:
    """Child: prepare (or read) the dataset; its time and the process's peak RSS."""
    from lsan.data.prepare import cache_root, load_dataset

    cached = any(cache_root(cache_dir).glob(f"{DATASET}-*.npz"))
    start = time.perf_counter()
    ds = load_dataset(DATASET, cache_dir=cache_dir, min_count=1)
    return {
        "seconds": time.perf_counter() - start,
        "from_cache": cached,  # False: the seconds include generating the interactions
        "users": ds.num_users,
        "items": ds.num_items,
        "interactions": len(ds.items),
        "peak_rss_bytes": peak_rss_bytes(),
    }


def measure(spec: str, cache_dir: str) -> dict[str, Any]:
    """Child: `lsan train` for one epoch, then one timed evaluation; the process's peak RSS."""
    import torch

    from lsan.checkpoint import load_model
    from lsan.cli import main as lsan
    from lsan.data.prepare import load_dataset
    from lsan.evaluate import evaluate, users_per_step

    with tempfile.TemporaryDirectory(prefix="big-catalogue-") as tmp:
        out = Path(tmp) / "checkpoint"
        start = time.perf_counter()
        if lsan(train_argv(spec, out, cache_dir)) != 0:
            raise RuntimeError(f"lsan train failed for {spec}")
        wall = time.perf_counter() - start
        res = json.loads((out / "metrics.json").read_text())
        best, run, info = load_model(out)
        ds = load_dataset(DATASET, cache_dir=cache_dir, min_count=1)
        start = time.perf_counter()
        test = evaluate(best, ds, "test", info.max_len, run.eval, torch.device("cpu"))
        eval_s = time.perf_counter() - start
    return {
        "model": spec,
        "parameters": res["parameters"],
        "seconds_per_epoch": res["seconds_per_epoch"],
        "eval_seconds": eval_s,
        "eval_users_per_s": ds.num_users / eval_s,
        "eval_users_per_step": users_per_step(run.eval, ds.num_items),
        "train_command_seconds": wall,
        "peak_rss_bytes": peak_rss_bytes(),
        "valid": res["valid"],
        "test": test,
        "command": "lsan " + shlex.join(train_argv(spec, Path("DIR"), cache_dir)),
    }


def child(argv: list[str], cache_dir: str) -> dict[str, Any]:
    """Run one measurement in a fresh Python process (its own peak RSS) and read its JSON."""
    cmd = [sys.executable, "-m", "benchmarks.big_catalogue", "--child", *argv]
    cmd += ["--cache-dir", cache_dir] if cache_dir else []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.big_catalogue", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--models", nargs="+", default=["lsan", "lsan:m1=0", "sasrec"],
                   help="model names, each optionally with :key=value,... model settings")  # fmt: skip
    p.add_argument("--cache-dir", default="", help="prepared-data cache (default: lsan's)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="JSON results file")
    p.add_argument("--child", nargs="+", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:  # inside a measured process: one JSON line on stdout
        kind, *rest = args.child
        row = prepare(args.cache_dir) if kind == "prepare" else measure(rest[0], args.cache_dir)
        print(json.dumps(row))
        return 0
    command = "python -m benchmarks.big_catalogue " + shlex.join(
        argv if argv is not None else sys.argv[1:]
    )
    env = environment(command)
    data = child(["prepare"], args.cache_dir)
    print(f"{DATASET}: {data['users']} users, {data['items']:,} items, "
          f"{data['interactions']:,} interactions ({'read' if data['from_cache'] else 'built'} "
          f"in {data['seconds']:.0f} s)", flush=True)  # fmt: skip
    rows = []
    for model in args.models:
        rows.append(child(["train", model], args.cache_dir))
        r = rows[-1]
        print(f"{model:10} {r['parameters']:>11,} params  {r['seconds_per_epoch']:6.1f} s/epoch  "
              f"eval {r['eval_seconds']:5.1f} s "
              f"({r['eval_users_per_s']:.0f} users/s)  peak RSS {r['peak_rss_bytes'] / 2**30:.2f} "
              f"GiB  valid NDCG@10 {r['valid']['NDCG@10']:.4f}", flush=True)  # fmt: skip
    env |= {"measured_threads": 1, "load_average_end": list(os.getloadavg())}
    record = {"environment": env,
              "dataset": {"name": DATASET, **data}, "results": rows}  # fmt: skip
    write_record(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
