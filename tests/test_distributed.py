"""Distributed training (2 gloo processes on CPU, launched by torchrun), chunked evaluation, bf16.

The torchrun worker is this file run as a script (`__main__` below): every process builds the
same small generated dataset and calls `lsan.train.train`, which joins the process group from
torchrun's environment, exactly as `torchrun ... -m lsan train` does.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from lsan.checkpoint import load_model
from lsan.config import DataConfig, EvalConfig, RunConfig, TrainConfig
from lsan.data.batching import train_tensors
from lsan.data.prepare import SeqDataset, build
from lsan.data.synthetic import SyntheticConfig, generate
from lsan.distributed import Context, LossStep, amp_dtype, local_batch, shard
from lsan.evaluate import evaluate, rank_users, target_ranks
from lsan.models import DataInfo, build_model, model_config
from lsan.train import train

REPO = Path(__file__).resolve().parents[1]
TINY = {"dim": 32, "layers": 1, "heads": 1, "dropout": 0.1}
EPOCHS = 10


def dataset() -> SeqDataset:
    """601 users: the two ranks evaluate 301 and 300, so an average of averages would show."""
    cfg = SyntheticConfig(users=601, items=300, categories=8, mean_length=20, seed=3)
    return build(generate(cfg), "synthetic", 5)


def run_config(epochs: int, model: str = "sasrec") -> RunConfig:
    return RunConfig(
        data=DataConfig(max_len=20),
        model_name=model,
        model=model_config(model, TINY if model == "sasrec" else {}),
        train=TrainConfig(
            epochs=epochs, batch_size=64, patience=100, device="cpu", lr=3e-3, threads=1
        ),
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(out: Path, epochs: int, resume: bool = False) -> None:
    """Train with 2 processes on the loopback interface, as on a 2-GPU node."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
        __file__, str(out), str(epochs), *(["--resume"] if resume else []),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 2-process run and the same configuration in one process, plus popularity."""
    ds = dataset()
    two = tmp_path_factory.mktemp("two")
    torchrun(two, EPOCHS)
    one = train(run_config(EPOCHS), tmp_path_factory.mktemp("one"), progress=False, ds=ds)
    pop = train(run_config(1, "pop"), tmp_path_factory.mktemp("pop"), progress=False, ds=ds)
    return ds, two, one, pop


def test_two_processes_match_one(runs):
    ds, two, one, pop = runs
    res = json.loads((two / "metrics.json").read_text())
    assert res["processes"] == 2 and one["processes"] == 1
    assert res["valid"]["users"] == res["test"]["users"] == ds.num_users == 601
    # both clearly beat popularity, and agree within seed-to-seed noise (about 0.02 here)
    for r in (res, one):
        assert r["valid"]["NDCG@10"] > pop["valid"]["NDCG@10"] + 0.05
    assert abs(res["valid"]["NDCG@10"] - one["valid"]["NDCG@10"]) < 0.03


def test_rank0_writes_and_metrics_gather_exactly(runs):
    ds, two, _, _ = runs
    log = (two / "train_log.jsonl").read_text().splitlines()
    assert len(log) == EPOCHS  # one writer: two would append every record twice
    assert all(math.isfinite(json.loads(line)["loss"]) for line in log)
    # the gathered ranks give exactly the one-process evaluation of the same weights
    model, _, info = load_model(two)
    res = json.loads((two / "metrics.json").read_text())
    again = evaluate(model, ds, "test", info.max_len, EvalConfig(), torch.device("cpu"))
    assert again == pytest.approx(res["test"], abs=1e-12)


def test_resume_under_two_processes(runs, tmp_path):
    _, two, _, _ = runs
    torchrun(tmp_path, EPOCHS // 2)
    torchrun(tmp_path, EPOCHS, resume=True)
    straight = json.loads((two / "metrics.json").read_text())
    resumed = json.loads((tmp_path / "metrics.json").read_text())
    assert resumed["epochs"] == EPOCHS
    assert resumed["valid"] == pytest.approx(straight["valid"], abs=1e-6)
    assert len((tmp_path / "train_log.jsonl").read_text().splitlines()) == EPOCHS


@pytest.mark.parametrize("users", [12, 13, 2])
def test_shards_make_up_the_one_process_batches(users):
    order = torch.randperm(users)
    world, batch = 3, 6
    shards = [shard(order, Context(torch.device("cpu"), r, world)) for r in range(world)]
    size = local_batch(batch, Context(torch.device("cpu"), 0, world))
    assert len({len(s) for s in shards}) == 1  # same steps on every rank: DDP cannot hang
    wrapped = order[torch.arange(len(shards[0]) * world) % users]
    for i in range(0, len(shards[0]), size):
        union = torch.cat([s[i : i + size] for s in shards])
        assert sorted(union.tolist()) == sorted(wrapped[i * world : (i + size) * world].tolist())
    with pytest.raises(ValueError, match="split evenly"):
        local_batch(64, Context(torch.device("cpu"), 0, 3))


def test_chunked_evaluation_gives_the_same_ranks():
    ds = dataset()
    torch.manual_seed(0)
    emb = torch.randn(ds.num_items + 1, 4).round()  # coarse scores: many ties
    seen: list[int] = []

    class Rand(nn.Module):
        def score_all(self, items, cats, slots):
            seen.append(items.shape[0])
            return emb[items].sum(1) @ emb.T

    def ranks(max_scores: int) -> np.ndarray:
        cfg = EvalConfig(max_scores=max_scores)
        return rank_users(Rand(), ds, "valid", 10, cfg, torch.device("cpu"))

    whole = ranks(2**24)
    assert max(seen) == 512
    seen.clear()
    chunked = ranks(3 * (ds.num_items + 1))
    assert max(seen) == 3 and sum(seen) == ds.num_users
    assert np.array_equal(whole, chunked)
    # the one-pass rank is the two-count definition, ties counted against the target
    scores = torch.randint(0, 5, (64, 50)).float()
    target = torch.randint(0, 50, (64,))
    t = scores.gather(1, target[:, None])
    assert torch.equal(target_ranks(scores, target), (scores > t).sum(1) + (scores == t).sum(1) - 1)


def test_bf16_autocast_on_cpu_trains():
    assert amp_dtype("auto", torch.device("cpu")) is None  # the CPU default stays fp32
    assert amp_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ValueError, match="train.amp"):
        amp_dtype("fp8", torch.device("cpu"))
    ds = dataset()
    torch.manual_seed(0)
    info = DataInfo(ds.num_items, ds.num_categories, ds.num_slots, 20)
    model = build_model("sasrec", model_config("sasrec", TINY), info).eval()  # no dropout noise
    batch = train_tensors(ds, 20).rows(torch.arange(32))
    fp32 = LossStep(model, "ce", 100, None)(batch)
    bf16 = LossStep(model, "ce", 100, torch.bfloat16)(batch)
    bf16.backward()
    assert torch.isfinite(bf16) and bf16.dtype == torch.float32
    assert bf16.item() != fp32.item() and abs(bf16.item() - fp32.item()) < 0.05 * fp32.item()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_gpu_smoke_cpu_mode(tmp_path, capsys):
    from benchmarks.gpu_smoke import main

    out = tmp_path / "smoke.json"
    argv = ["--device", "cpu", "--steps", "3", "--warmup", "1", "--eval-users", "64"]
    assert main([*argv, "--max-len", "20", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert [r["model"] for r in res["results"]] == ["sasrec", "lsan"]
    assert all(r["samples_per_s"] > 0 and r["peak_memory_bytes"] > 0 for r in res["results"])
    assert "samples/s" in capsys.readouterr().out
    if not torch.cuda.is_available():
        assert main(["--device", "cuda", "--out", str(tmp_path / "no.json")]) == 2
        assert "no CUDA GPU" in capsys.readouterr().err


if __name__ == "__main__":  # one torchrun worker: out epochs [--resume]
    train(
        run_config(int(sys.argv[2])),
        sys.argv[1],
        resume="--resume" in sys.argv,
        progress=False,
        ds=dataset(),
    )
