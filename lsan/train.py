"""The one training loop for every model: Adam, early stopping on validation NDCG@10, checkpoints.

Reproducibility: every epoch re-seeds torch from (seed, epoch), so a resumed run continues
exactly as an uninterrupted one would (same shuffles, same dropout masks).
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from tqdm.auto import tqdm

from lsan import distributed
from lsan.checkpoint import (
    check_resume,
    dataset_record,
    load_model,
    read_config,
    save_config,
    save_tensors,
    write_json,
)
from lsan.config import ConfigError, RunConfig
from lsan.data.batching import item_counts, train_tensors
from lsan.data.prepare import SeqDataset, default_max_len, load_configured, with_slot_rule
from lsan.distill import (
    TeacherError,
    Teachers,
    init_from_checkpoint,
    init_from_teacher,
    load_teachers,
    prepare_codes,
)
from lsan.models import DataInfo, build_model, model_config
from lsan.models.objectives import LOSSES
from lsan.models.pop import Pop

MONITOR = "NDCG@10"  # validation metric for early stopping and model selection


def averaged(model: torch.nn.Module, decay: float) -> AveragedModel | None:
    """An exponential moving average of `model`'s parameters (None when decay is 0).

    Why: validation on a fine-tune at a low learning rate is noisy from epoch to epoch; the
    average is a smoother model to select. Buffers (a table's widths and steps) are the live
    model's at the start; `current` refreshes what depends on the averaged weights.
    """
    if decay == 0:
        return None
    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=False)


def freeze(model: torch.nn.Module, prefixes: str, train_only: str = "") -> None:
    """Leave the parameters whose names start with one of the ","-separated `prefixes` as they
    start (no gradient, not in the optimizer), or, with `train_only`, every parameter but those
    it names. A prefix that names no parameter is an error, so a typo cannot silently train
    everything (or nothing)."""
    if prefixes and train_only:
        raise ConfigError("train.freeze and train.train_only name the same thing two ways: "
                          "set one of them")  # fmt: skip
    field, text = ("train.train_only", train_only) if train_only else ("train.freeze", prefixes)
    wanted = tuple(p.strip() for p in text.split(",") if p.strip())
    params = dict(model.named_parameters())
    for prefix in wanted:
        if not any(n.startswith(prefix) for n in params):
            raise ConfigError(f"{field}: '{prefix}' names no parameter of this model "
                              f"(its parameters start with: {', '.join(sorted({n.split('.')[0] for n in params}))})")  # fmt: skip
    for name, p in params.items():
        if wanted and name.startswith(wanted) != bool(train_only):
            p.requires_grad_(False)


def current(model: torch.nn.Module, ema: AveragedModel | None) -> torch.nn.Module:
    """The model to evaluate and keep: the live one, or the average with its steps re-chosen."""
    if ema is None:
        return model
    # entering training mode is when a low-bit table chooses its steps for its weights
    return ema.module.train().eval()


def resolve_device(name: str = "auto") -> torch.device:
    """ "auto" -> cuda when available, else cpu; an explicit cuda request without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(
            f"device '{name}' requested but no CUDA GPU is available (use --device cpu)"
        )
    try:
        return torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device '{name}' (use auto, cpu, cuda or cuda:N)") from None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def resolve(run: RunConfig, ds: SeqDataset) -> tuple[RunConfig, DataInfo]:
    """Fill dataset-dependent defaults (max_len) and the model config; describe the data."""
    data = run.data
    if data.max_len <= 0:
        data = dataclasses.replace(data, max_len=default_max_len(ds.name))
    model = run.model if run.model is not None else model_config(run.model_name)
    run = dataclasses.replace(run, data=data, model=model)
    info = DataInfo(ds.num_items, ds.num_categories, ds.num_slots, data.max_len, ds.num_users)
    return run, info


def attach_teacher(
    run: RunConfig, info: DataInfo, device: torch.device, resumed: Path | None, slot_rule: str = ""
) -> tuple[RunConfig, Teachers | None, dict[str, str]]:
    """Load `train.teacher` (one checkpoint or several, ","-separated) and record the digests in
    the run; a resume keeps its teachers."""
    tc = run.train
    if not tc.teacher:
        return run, None, {}
    if tc.loss != "ce":
        raise TeacherError(f"distillation (train.teacher) needs train.loss=ce, not {tc.loss}")
    expected = ""
    if resumed is not None and (resumed / "config.json").is_file():
        expected = read_config(resumed)[0].train.teacher_sha256
    teachers, digest, name = load_teachers(tc.teacher, info, device, expected, slot_rule)
    run = dataclasses.replace(run, train=dataclasses.replace(tc, teacher_sha256=digest))
    return run, teachers.to(device), {"path": tc.teacher, "sha256": digest, "model": name}


def train(
    run: RunConfig, out: str | Path, resume: bool = False, progress: bool = True,
    ds: SeqDataset | None = None, command: str = "",
    on_epoch: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Train `run` into checkpoint directory `out`; returns the final metrics (also metrics.json).

    `ds` replaces loading `run.data.dataset` (tests and sweeps pass a prepared dataset);
    `command` is recorded in metrics.json so every result names what produced it; `on_epoch`
    gets each epoch's log record (hyper-parameter search reports and stops trials through it).
    Under torchrun every process runs the loop on its share of the users (lsan.distributed).
    """
    out = Path(out)
    tc = run.train
    if tc.loss not in LOSSES:
        raise ValueError(f"unknown train.loss '{tc.loss}' (known: {', '.join(LOSSES)})")
    # ---- setup: data, model, optimizer
    if tc.threads > 0:
        torch.set_num_threads(tc.threads)
    ctx = distributed.setup(resolve_device(tc.device))  # one process, or one rank of torchrun's
    device, progress = ctx.device, progress and ctx.main
    seed_everything(tc.seed)
    if ds is None:
        with distributed.main_first(ctx):  # rank 0 prepares and caches, the others read the cache
            ds = load_configured(run.data)
    ds = with_slot_rule(ds, run.data.slot_rule)  # a given dataset too (a tune may vary it)
    run, info = resolve(run, ds)
    model = build_model(run.model_name, run.model, info).to(device)
    data = train_tensors(ds, info.max_len).to(device)
    resumed = out if resume else None
    run, teacher, teacher_record = attach_teacher(run, info, device, resumed, ds.slot_rule)
    tc = run.train
    codes = prepare_codes(model, item_counts(ds), teacher, tc.seed)
    if tc.teacher_init:
        if teacher is None:
            raise TeacherError("train.teacher_init needs a teacher (--teacher CKPT)")
        taken = init_from_teacher(model, teacher.single("train.teacher_init"))
        teacher_record["initialised_from"] = f"{len(taken)} tensors"
    init = init_from_checkpoint(model, tc.init, ds.slot_rule) if tc.init else {}
    trainable = getattr(model, "trainable", True)
    if not trainable:
        cast(Pop, model).fit_counts(torch.as_tensor(item_counts(ds)))
    freeze(model, tc.freeze, tc.train_only)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=tc.lr, weight_decay=tc.weight_decay) if params else None
    ema = averaged(model, tc.ema)
    check_resume(out, run, info, model, resume)  # a refused --resume leaves `out` untouched
    out.mkdir(parents=True, exist_ok=True)
    if ctx.main:
        save_config(out, run, info)
        write_json(out / "dataset.json", dataset_record(ds))
    log_path = out / "train_log.jsonl"

    # ---- resume: weights, optimizer and progress of the last finished epoch
    state: dict[str, Any] = {"epoch": 0, "best": -1.0, "best_epoch": 0, "bad": 0, "seconds": 0.0}
    if resume and (out / "trainer_state.pt").is_file():
        saved = torch.load(out / "trainer_state.pt", map_location=device, weights_only=True)
        model.load_state_dict(saved["model"])
        if opt is not None:
            opt.load_state_dict(saved["optimizer"])
        if ema is not None:
            ema.load_state_dict(saved["ema"])
        state = {k: saved[k] for k in state}
    elif ctx.main and log_path.exists():
        log_path.unlink()
    step = distributed.loss_step(model, tc, ctx, teacher) if trainable else None

    # ---- epochs: shuffle, step on every batch, evaluate, keep the best, stop early
    epochs = tc.epochs if trainable else 1
    start_time = time.perf_counter() - state["seconds"]
    for epoch in range(state["epoch"] + 1, epochs + 1):
        t0 = time.perf_counter()
        torch.manual_seed(tc.seed * 100_003 + epoch)
        model.train()
        order = distributed.shard(torch.randperm(len(data), device=device), ctx)
        if ctx.world > 1:  # one permutation on every rank, then each rank its own dropout
            torch.manual_seed(tc.seed * 100_003 + epoch + 1_000_003 * ctx.rank)
        size = distributed.local_batch(tc.batch_size, ctx)
        total, steps = 0.0, 0
        batches = range(0, len(order), size) if trainable else range(0)
        for i in tqdm(batches, desc=f"epoch {epoch}", leave=False, disable=not progress):
            b = data.rows(order[i : i + size])
            assert step is not None and opt is not None and b.targets is not None
            loss = step(b)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if ema is not None:
                ema.update_parameters(model)
            total += loss.item()
            steps += 1
        train_seconds = time.perf_counter() - t0
        record: dict[str, Any] = {
            "epoch": epoch,
            "loss": distributed.mean(total / max(steps, 1), ctx),
            "train_seconds": train_seconds,
        }
        if epoch % tc.eval_every == 0 or epoch == epochs:
            kept = current(model, ema)
            metrics = distributed.evaluate(kept, ds, "valid", info.max_len, run.eval, ctx)
            record["valid"] = metrics
            if metrics[MONITOR] > state["best"]:
                state.update(best=metrics[MONITOR], best_epoch=epoch, bad=0)
                if ctx.main:
                    save_tensors(out / "model.pt", kept.state_dict())
            else:
                state["bad"] += 1
        record["seconds"] = time.perf_counter() - t0
        state.update(epoch=epoch, seconds=time.perf_counter() - start_time)
        if ctx.main:  # one writer: every rank holds the same state
            with open(log_path, "a") as fh:
                fh.write(json.dumps(record) + "\n")
            save_tensors(
                out / "trainer_state.pt",
                {
                    "model": model.state_dict(),
                    "optimizer": opt.state_dict() if opt else {},
                    "ema": ema.state_dict() if ema is not None else {},
                    **state,
                },
            )
        if progress:
            shown = f" valid {MONITOR} {record['valid'][MONITOR]:.4f}" if "valid" in record else ""
            tqdm.write(
                f"epoch {epoch:3d}  loss {record['loss']:.4f}{shown}  {record['seconds']:.1f}s"
            )
        if on_epoch is not None:
            on_epoch(record)
        if state["bad"] >= tc.patience:
            break
        elapsed = (time.perf_counter() - start_time) / 60
        if tc.max_minutes and distributed.anyone(elapsed >= tc.max_minutes, ctx):
            break

    # ---- final: the best weights on validation and test
    distributed.barrier(ctx)  # rank 0's model.pt and log are complete
    best, _, _ = load_model(out, device)
    log = (
        [json.loads(line) for line in log_path.read_text().splitlines()]
        if log_path.exists()
        else []
    )
    train_secs = [r["train_seconds"] for r in log]
    result = {
        "model": run.model_name,
        "dataset": ds.name,
        "valid": distributed.evaluate(best, ds, "valid", info.max_len, run.eval, ctx),
        "test": distributed.evaluate(best, ds, "test", info.max_len, run.eval, ctx),
        "best_epoch": state["best_epoch"],
        "epochs": state["epoch"],
        "seconds_per_epoch": float(np.mean(train_secs)) if train_secs else 0.0,
        "train_seconds": state["seconds"],
        "parameters": sum(p.numel() for p in best.parameters()),
        "model_bytes": (out / "model.pt").stat().st_size,
        "command": command,
        "teacher": teacher_record,
        "codes": codes,
        "init": init,
        "device": str(device),
        "processes": ctx.world,
        "protocol": {
            "split": "leave-one-out (last = test, second last = valid)",
            "ranking": "full catalogue",
            "mask_seen": run.eval.mask_seen,
            "ties": "pessimistic",
            "min_count": run.data.min_count,
            "max_len": info.max_len,
        },
    }
    if ctx.main:
        write_json(out / "metrics.json", result)
    return result
