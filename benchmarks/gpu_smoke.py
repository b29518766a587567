"""GPU smoke run: training throughput and peak memory of SASRec and LSAN, one command.

    python -m benchmarks.gpu_smoke                      # CUDA, bf16 autocast, 200 timed steps
    python -m benchmarks.gpu_smoke --compile            # the same through torch.compile
    python -m benchmarks.gpu_smoke --device cpu --steps 5   # checks the script without a GPU

Each model trains `--steps` timed steps after `--warmup` untimed ones (CUDA start-up, autocast
caches, compilation) on a generated dataset, with the trainer's own loss step
(`lsan.distributed.loss_step`: the same autocast and compile settings as `lsan train`), then
ranks `--eval-users` users over the full catalogue. It prints training samples/s (sequences per
second), evaluation users/s and peak memory (torch.cuda.max_memory_allocated on CUDA, the
process's peak RSS on CPU), and writes the numbers with the environment to `--out`.
Exit status 0 after a run, 2 when CUDA is asked for (the default) and there is no CUDA GPU.
"""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from lsan.benchmarks.env import REPO, cores, cpuinfo, git_commit, write_record
from lsan.config import DataConfig, EvalConfig, RunConfig, TrainConfig
from lsan.data.batching import train_tensors
from lsan.data.prepare import DATASETS, SeqDataset, load_dataset
from lsan.distributed import AMP, Context, amp_dtype, loss_step
from lsan.evaluate import rank_users
from lsan.models import build_model, model_config
from lsan.train import resolve

DEFAULT_OUT = REPO / "benchmarks" / "results" / "gpu-smoke.json"


def peak_rss_bytes() -> int:
    """This process's peak resident set (VmHWM; unlike ru_maxrss it is not the parent's)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def run_environment(command: str, device: torch.device) -> dict[str, Any]:
    """What the numbers depend on: commit, torch and CUDA versions, the GPU or CPU."""
    return {
        "command": command,
        "utc": datetime.now(UTC).isoformat(timespec="seconds"),
        **git_commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "cpu": cpuinfo()["model"],
        "cores": cores(),
        "threads": torch.get_num_threads(),
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    name: str, ds: SeqDataset, args: argparse.Namespace, device: torch.device
) -> dict[str, Any]:
    """Timed training steps and one full-ranking evaluation of model `name`."""
    tc = TrainConfig(batch_size=args.batch_size, loss=args.loss, amp=args.amp,
                     compile=args.compile, seed=args.seed)  # fmt: skip
    run, info = resolve(
        RunConfig(data=DataConfig(dataset=ds.name, max_len=args.max_len), model_name=name,
                  model=model_config(name), train=tc), ds)  # fmt: skip
    torch.manual_seed(args.seed)
    model = build_model(name, run.model, info).to(device)
    data = train_tensors(ds, info.max_len).to(device)  # device-resident: no per-step copies
    step = loss_step(model, tc, Context(device))
    opt = torch.optim.Adam(model.parameters(), lr=tc.lr)
    model.train()
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            sync(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            start = time.perf_counter()
        rows = torch.randint(0, len(data), (tc.batch_size,), device=device)
        loss = step(data.rows(rows))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    sync(device)
    train_s = time.perf_counter() - start
    users = torch.arange(min(args.eval_users, ds.num_users)).numpy()
    start = time.perf_counter()
    rank_users(model, ds, "valid", info.max_len, EvalConfig(), device, users=users)
    sync(device)
    eval_s = time.perf_counter() - start
    cuda = device.type == "cuda"
    return {
        "model": name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "amp": str(amp_dtype(tc.amp, device) or "off").removeprefix("torch."),
        "compile": tc.compile,
        "steps": args.steps,
        "batch_size": tc.batch_size,
        "samples_per_s": args.steps * tc.batch_size / train_s,
        "eval_users_per_s": len(users) / eval_s,
        "loss": loss.item(),
        "peak_memory": "torch.cuda.max_memory_allocated" if cuda else "peak RSS",
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if cuda else peak_rss_bytes(),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_smoke", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    p.add_argument("--models", nargs="+", default=["sasrec", "lsan"])
    p.add_argument("--dataset", default="synthetic", choices=DATASETS)
    p.add_argument("--min-count", type=int, default=5, help="k-core (1 for synthetic-1m)")
    p.add_argument("--steps", type=int, default=200, help="timed training steps per model")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps before timing")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--max-len", type=int, default=50)
    p.add_argument("--loss", default="ce", help="ce, bpr or sampled (train.loss)")
    p.add_argument("--amp", default="auto", choices=AMP, help="auto = bf16 on CUDA when supported")
    p.add_argument("--compile", action="store_true", help="torch.compile the training step")
    p.add_argument("--eval-users", type=int, default=2048, help="users ranked over the catalogue")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", default=str(DEFAULT_OUT), help="JSON results file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"error: no CUDA GPU visible to torch {torch.__version__} (cuda "
              f"{torch.version.cuda}); `--device cpu` checks the script without one",
              file=sys.stderr)  # fmt: skip
        return 2
    device = torch.device(args.device)
    ds = load_dataset(args.dataset, min_count=args.min_count)
    results = [measure(name, ds, args, device) for name in args.models]
    print(f"{ds.name}: {ds.num_users} users, {ds.num_items} items, device {device}")
    print(f"{'model':8} {'samples/s':>10} {'eval users/s':>13} {'peak MiB':>9}  amp")
    for r in results:
        print(f"{r['model']:8} {r['samples_per_s']:10.0f} {r['eval_users_per_s']:13.0f} "
              f"{r['peak_memory_bytes'] / 2**20:9.0f}  {r['amp']}")  # fmt: skip
    command = "python -m benchmarks.gpu_smoke " + shlex.join(
        argv if argv is not None else sys.argv[1:]
    )
    record = {
        "environment": run_environment(command, device),
        "dataset": {"name": ds.name, "users": ds.num_users, "items": ds.num_items},
        "results": results,
    }
    write_record(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
