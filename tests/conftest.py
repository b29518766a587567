"""Shared fixtures: a small generated dataset, the shared real data, a private cache dir."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# Every test run gets its own prepared-data cache, shared across tests of the run.
os.environ.setdefault("LSAN_CACHE_DIR", tempfile.mkdtemp(prefix="lsan-test-cache-"))

from lsan.data.prepare import SeqDataset, build  # noqa: E402
from lsan.data.synthetic import SyntheticConfig, generate  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("LSAN_TEST_DATA_DIR", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def small_ds() -> SeqDataset:
    """A few hundred generated users: enough structure to learn, seconds to train."""
    cfg = SyntheticConfig(users=600, items=300, categories=8, mean_length=20, seed=3)
    return build(generate(cfg), "synthetic", 5)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not (SHARED_DATA / "ml-100k" / "u.data").is_file():
        pytest.skip(f"real datasets not found in {SHARED_DATA} (set LSAN_TEST_DATA_DIR)")
    return SHARED_DATA


def train_tiny(name: str, model: dict, ds: SeqDataset, out: Path, epochs: int = 2) -> Path:
    """Train a tiny checkpoint of model `name` on `ds` (max_len 12, CPU) into `out`."""
    from lsan.config import DataConfig, RunConfig, TrainConfig
    from lsan.models import model_config
    from lsan.train import train

    run = RunConfig(
        data=DataConfig(dataset="synthetic", max_len=12),
        model_name=name,
        model=model_config(name, model),
        train=TrainConfig(epochs=epochs, batch_size=64, device="cpu"),
    )
    train(run, out, progress=False, ds=ds)
    return out


def loaded_graph(path, tmp_path):
    """The graph onnxruntime runs after its load-time optimisation (constant folding included)."""
    import onnx
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    opts.log_severity_level = 3
    ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return onnx.load(str(tmp_path / "optimized.onnx"))


def wait_ready(proc, url: str, log: Path, seconds: float = 60) -> None:
    """Wait until the server process `proc` answers GET url/ready with 200, or fail the test
    with its log (it exited, or it was not ready in time)."""
    import time

    import httpx

    deadline = time.monotonic() + seconds
    while True:
        if proc.poll() is not None:
            pytest.fail(f"server exited {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"server not ready in time:\n{log.read_text()}")
        time.sleep(0.1)


def fuzz_never_5xx(operation, mode, also=lambda response: None) -> None:
    """Hypothesis-drive a schemathesis `operation` (50 cases of `mode`): every answer conforms
    to the schema and its declared status codes and is never a 5xx; `also` checks more."""
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [not_a_server_error, response_schema_conformance, status_code_conformance]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=50, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    def check(case):
        response = case.call()
        case.validate_response(response, checks=checks)
        assert response.status_code < 500
        also(response)

    check()
