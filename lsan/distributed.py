"""Processes and devices of the training loop: torchrun + DDP, user sharding, mixed precision.

Started by torchrun with more than one process (RANK, WORLD_SIZE, LOCAL_RANK in the
environment), `setup` joins the process group (nccl on CUDA, gloo on CPU) and binds each
process to the GPU of its LOCAL_RANK; otherwise nothing here touches torch.distributed and a run
is exactly the one-process run. The choices:
- `train.batch_size` is the global batch; each of the W ranks takes batch_size / W sequences.
  Every rank draws the same seeded permutation of the users, wraps it to a multiple of W (as
  torch's DistributedSampler pads) and keeps every W-th user, so all ranks run the same number
  of steps (DDP hangs otherwise) and the W shards of step i together are the one-process batch
  of step i: 1 and W processes train on the same batches.
- DistributedDataParallel averages gradients around `LossStep`, a module whose forward is the
  batch loss: DDP syncs through forward, and the objectives call `model.loss` or `model` +
  `score_items`, which a DDP-wrapped model alone would not see.
- Each rank ranks a contiguous slice of the users and the integer ranks are all-gathered, so the
  metrics are the same pure functions of every user's rank: exactly the one-process evaluation
  of the same weights, never an average of per-rank averages.
- Rank 0 alone writes files; every rank reads trainer_state.pt to resume and model.pt for the
  final evaluation, so the output directory must be on storage that all nodes share.
On a GPU: `train.amp` autocasts the loss step to bf16 (auto: on CUDA when supported; off on CPU
unless asked, so the CPU path stays fp32), which keeps fp32's range, so no loss scaling;
evaluation always scores in fp32, since bf16 ties would change the ranks. `train.compile` wraps
the step in torch.compile. The training tensors move to the device once, before the first
epoch, so steps copy nothing from the host (pinned memory would speed up copies that never
happen).
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from lsan.config import EvalConfig, TrainConfig
from lsan.data.batching import SeqTensors
from lsan.data.prepare import SeqDataset
from lsan.distill import Teachers, distill_loss
from lsan.evaluate import evaluate as evaluate_all
from lsan.evaluate import rank_users, summarise
from lsan.models.objectives import batch_loss

AMP = ("auto", "bf16", "off")


@dataclass(frozen=True)
class Context:
    """Where this process runs: its device and its rank among `world` processes."""

    device: torch.device
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        """The process that writes files and shows progress."""
        return self.rank == 0


def launched() -> bool:
    """True in a process that torchrun started as one of several."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def setup(device: torch.device) -> Context:
    """This process's Context; under torchrun joins the process group (once per process).

    The group lives as long as the process: torchrun's rendezvous cannot be repeated, so several
    trainings in one process (`lsan demo`, sweeps) share it.
    """
    if not launched():
        return Context(device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        cuda = device.type == "cuda"
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
        atexit.register(_shutdown)
    return Context(device, dist.get_rank(), dist.get_world_size())


def _shutdown() -> None:
    """Leave the group together: a rank tearing gloo down while a peer still talks aborts it."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def local_batch(batch_size: int, ctx: Context) -> int:
    """Sequences per step on this rank: the global `train.batch_size` split evenly."""
    if batch_size % ctx.world:
        raise ValueError(
            f"train.batch_size={batch_size} (the global batch) must split evenly over "
            f"{ctx.world} processes"
        )
    return batch_size // ctx.world


def shard(order: Tensor, ctx: Context) -> Tensor:
    """This rank's users of the epoch's permutation: every world-th after wrapping to a multiple."""
    if ctx.world == 1:
        return order
    size = -(-len(order) // ctx.world) * ctx.world
    wrapped = order[torch.arange(size, device=order.device) % len(order)]
    return wrapped[ctx.rank :: ctx.world]


def amp_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of `train.amp`, None for full fp32 (the CPU default)."""
    if amp not in AMP:
        raise ValueError(f"unknown train.amp '{amp}' (known: {', '.join(AMP)})")
    if amp == "bf16":
        return torch.bfloat16
    if amp == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


class LossStep(nn.Module):
    """forward(batch) = the batch's training loss (autocast when asked): what DDP wraps."""

    def __init__(self, model: nn.Module, objective: str, negatives: int, amp: torch.dtype | None):
        super().__init__()
        self.model, self.objective, self.negatives, self.amp = model, objective, negatives, amp
        # the teacher sits in a list, not as a submodule: never in the optimizer, state or DDP
        self.teacher: list[Teachers] = []
        self.kd = (0.0, 1.0)

    def distil_from(self, teacher: Teachers, weight: float, temperature: float) -> None:
        self.teacher, self.kd = [teacher], (weight, temperature)

    def loss(self, b: SeqTensors) -> Tensor:
        if self.teacher:
            return distill_loss(self.model, self.teacher[0], b, *self.kd)
        return batch_loss(self.model, b, self.objective, self.negatives)

    def forward(self, b: SeqTensors) -> Tensor:
        if self.amp is None:
            return self.loss(b)
        with torch.autocast(b.items.device.type, dtype=self.amp):
            return self.loss(b)


def loss_step(
    model: nn.Module, tc: TrainConfig, ctx: Context, teacher: Teachers | None = None
) -> nn.Module:
    """The training loss as a module: DDP-synced across processes, compiled when asked."""
    step: nn.Module = LossStep(model, tc.loss, tc.negatives, amp_dtype(tc.amp, ctx.device))
    if teacher is not None:
        step.distil_from(teacher, tc.kd_weight, tc.kd_temperature)  # type: ignore[operator]
    if ctx.world > 1:
        ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        step = DistributedDataParallel(step, device_ids=ids)
    if tc.compile:
        step = cast(nn.Module, torch.compile(step))
    return step


def evaluate(
    model: nn.Module, ds: SeqDataset, split: str, max_len: int, cfg: EvalConfig, ctx: Context
) -> dict[str, float]:
    """Full-ranking metrics over every user; across processes each ranks a slice, gathered."""
    if ctx.world == 1:
        return evaluate_all(model, ds, split, max_len, cfg, ctx.device)
    parts = np.array_split(np.arange(ds.num_users), ctx.world)
    mine = rank_users(model, ds, split, max_len, cfg, ctx.device, users=parts[ctx.rank])
    return summarise(gather(mine, [len(p) for p in parts], ctx), cfg)


def gather(values: np.ndarray, sizes: list[int], ctx: Context) -> np.ndarray:
    """Every rank's integer `values` (rank r holds sizes[r] of them), concatenated in rank order."""
    buf = torch.zeros(max(sizes), dtype=torch.int64, device=ctx.device)
    buf[: len(values)] = torch.as_tensor(values, dtype=torch.int64, device=ctx.device)
    parts = [torch.empty_like(buf) for _ in sizes]
    dist.all_gather(parts, buf)
    return torch.cat([p[:n] for p, n in zip(parts, sizes, strict=True)]).cpu().numpy()


def mean(value: float, ctx: Context) -> float:
    """The average over ranks of a per-rank number (the epoch's training loss)."""
    if ctx.world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t)
    return t.item() / ctx.world


def anyone(flag: bool, ctx: Context) -> bool:
    """True on every rank when `flag` is True on some rank: all ranks stop at the same epoch."""
    if ctx.world == 1:
        return flag
    t = torch.tensor([int(flag)], device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


@contextmanager
def main_first(ctx: Context) -> Iterator[None]:
    """Rank 0 runs the block before the others (it fills the caches they then read)."""
    if not ctx.main:
        barrier(ctx)
    yield
    if ctx.main:
        barrier(ctx)


def barrier(ctx: Context) -> None:
    """Wait for every rank (rank 0's files are complete after it)."""
    if ctx.world > 1:
        dist.barrier()
