"""Training step time of several model configurations on one dataset, interleaved.

    python -m benchmarks.train_speed --dataset beauty --data-dir ../shared/data \\
        --runs sasrec lsan "lsan:model.train_scores=matrix" --set model.dim=64

Each run is `MODEL[:SETTING=VALUE,...]`; `--set` applies to every run. The runs take turns, one
Adam step each on the same real training batches, so background load hits all of them alike;
the median step time (forward + backward + optimizer) is reported with the implied seconds per
epoch. Writes JSON with the command, git commit and machine (benchmarks/results/).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from typing import Any

import torch

from lsan.benchmarks.env import environment, write_record
from lsan.config import DataConfig, merge, parse_sets
from lsan.data.batching import train_tensors
from lsan.data.prepare import default_max_len, load_dataset
from lsan.models import DataInfo, build_model, model_config
from lsan.models.objectives import batch_loss
from lsan.tables import markdown_table


def parse_run(spec: str, common: list[str]) -> tuple[str, str, dict[str, Any]]:
    """ "lsan:model.m1=3,model.dim=64" -> (label, model name, model settings)."""
    name, _, rest = spec.partition(":")
    sets = [*common, *(s for s in rest.split(",") if s)]
    tree = parse_sets(sets)
    unknown = set(tree) - {"model"}
    if unknown:
        raise SystemExit(f"error: only model.* settings are timed here, got {sorted(unknown)}")
    return spec, name, tree.get("model", {})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="beauty")
    ap.add_argument("--data-dir", default="")
    ap.add_argument("--runs", nargs="+", default=["sasrec", "lsan"])
    ap.add_argument("--set", action="append", default=[], metavar="model.KEY=VALUE")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per run")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="benchmarks/results/train-speed.json")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1:
        ap.error("--steps and --batch-size must be at least 1")
    torch.set_num_threads(args.threads)
    ds = load_dataset(args.dataset, args.data_dir, "", DataConfig.min_count)
    max_len = default_max_len(ds.name)
    info = DataInfo(ds.num_items, ds.num_categories, ds.num_slots, max_len, ds.num_users)
    data = train_tensors(ds, max_len)
    runs = [parse_run(spec, args.set) for spec in args.runs]
    models, opts, times = {}, {}, {label: [] for label, _, _ in runs}
    for label, name, values in runs:
        torch.manual_seed(0)
        models[label] = build_model(name, model_config(name, merge({}, values)), info).train()
        opts[label] = torch.optim.Adam(models[label].parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    for step in range(args.steps + 2):  # two warm-up steps
        rows = torch.randperm(len(data), generator=g)[: args.batch_size]
        b = data.rows(rows)
        for label, _, _ in runs:
            torch.manual_seed(step)
            t0 = time.perf_counter()
            loss = batch_loss(models[label], b)
            opts[label].zero_grad(set_to_none=True)
            loss.backward()
            opts[label].step()
            if step >= 2:
                times[label].append(time.perf_counter() - t0)
    steps_per_epoch = -(-len(data) // args.batch_size)
    base = statistics.median(times[runs[0][0]])
    rows_out = []
    for label, _, _ in runs:
        med = statistics.median(times[label])
        rows_out.append({
            "run": label, "params": sum(p.numel() for p in models[label].parameters()),
            "ms/step (median)": 1000 * med, "s/epoch (implied)": med * steps_per_epoch,
            f"vs {runs[0][0]}": f"{med / base:.2f}x",
        })  # fmt: skip
    print(markdown_table(rows_out, list(rows_out[0])))
    command = shlex.join(["python", "-m", "benchmarks.train_speed", *(argv or sys.argv[1:])])
    record = {"environment": environment(command), "dataset": ds.name,
              "steps_per_epoch": steps_per_epoch, "threads": args.threads, "rows": rows_out}  # fmt: skip
    write_record(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
