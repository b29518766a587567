"""HTTP serving benchmark: /recommend latency under a fixed request rate, next to the bare model.

What is measured and why: the edge server's cost per request is the model call plus HTTP, JSON
and id mapping. We start the real server (uvicorn, one worker, onnxruntime with 1 intra-op
thread, as on a phone core) on loopback, replay real test-split histories at a fixed rate
(open loop: requests are sent on schedule whether or not earlier ones finished, so queueing shows
up in the tail) and record client-side latency percentiles and achieved throughput. In the same
run we time the bare `session.run` and the runtime's `recommend` on the same histories, so the
HTTP overhead is the visible difference.

    python -m benchmarks.serve_load ARTIFACT_DIR --rate 100 --requests 2000 --name serving-beauty
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from lsan.serving.runtime import Artifact, load_artifact

RESULTS = Path(__file__).resolve().parent / "results"


def histories_from_artifact(art: Artifact, n: int, seed: int = 0) -> list[list[dict[str, Any]]]:
    """Realistic request bodies: random catalogue items with increasing timestamps.

    The artifact holds no user data (by design), so histories are sampled from its catalogue,
    with lengths drawn to cover short and full-length histories.
    """
    raw, max_len = art.raw_ids[1:], art.max_len
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(1, max_len + 1))
        items = rng.choice(raw, size=length)
        ts = 1_400_000_000 + np.cumsum(rng.integers(3600, 86400 * 7, size=length))
        out.append(
            [{"item_id": int(i), "timestamp": int(t)} for i, t in zip(items, ts, strict=True)]
        )
    return out


def percentiles(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms)
    return {"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
            "p99": float(np.percentile(a, 99)), "mean": float(a.mean()), "n": len(ms)}  # fmt: skip


def bare_model(art: Artifact, bodies: list[list[dict[str, Any]]], k: int) -> dict[str, Any]:
    """The model call alone (session.run on prebuilt feeds) and the runtime's recommend()."""
    hists = [[(e["item_id"], e["timestamp"]) for e in b] for b in bodies]
    feeds = [art.encode([h], True)[0] for h in hists]
    for f in feeds[:20]:
        art.session.run(["top_items", "top_scores"], f)
    run_ms, rec_ms = [], []
    for f, h in zip(feeds, hists, strict=True):
        t0 = time.perf_counter()
        art.session.run(["top_items", "top_scores"], f)
        t1 = time.perf_counter()
        art.recommend([h], k=k)
        t2 = time.perf_counter()
        run_ms.append((t1 - t0) * 1000)
        rec_ms.append((t2 - t1) * 1000)
    return {"session_run_ms": percentiles(run_ms), "runtime_recommend_ms": percentiles(rec_ms)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(artifact: Path, port: int, threads: int) -> subprocess.Popen:
    env = {**os.environ, "LSAN_ARTIFACT": str(artifact), "LSAN_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "serving", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"server exited: {proc.stderr.read().decode()[-500:] if proc.stderr else ''}"
            )
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not become ready in 60 s")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def load(
    port: int, bodies: list[list[dict[str, Any]]], rate: float, k: int, workers: int
) -> dict[str, Any]:
    """Open-loop load at `rate` requests/s; client-side latency of every request."""
    url = f"http://127.0.0.1:{port}/recommend"
    lat: list[float] = []
    server_ms: list[float] = []
    errors = 0
    lock = threading.Lock()
    local = threading.local()

    def one(body: list[dict[str, Any]]) -> None:
        nonlocal errors
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = httpx.Client(timeout=10)
        t0 = time.perf_counter()
        try:
            r = client.post(url, json={"history": body, "k": k, "exclude_seen": True})
            ok = r.status_code == 200
            served = r.json().get("latency_ms", 0.0) if ok else 0.0
        except httpx.HTTPError:
            ok, served = False, 0.0
        ms = (time.perf_counter() - t0) * 1000
        with lock:
            if ok:
                lat.append(ms)
                server_ms.append(served)
            else:
                errors += 1

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for i, body in enumerate(bodies):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            pool.submit(one, body)
    elapsed = time.perf_counter() - start
    return {"client_ms": percentiles(lat), "server_reported_ms": percentiles(server_ms),
            "errors": errors, "requests": len(bodies), "target_rate": rate,
            "achieved_rate": len(bodies) / elapsed}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.serve_load", description=__doc__.splitlines()[0]
    )
    ap.add_argument("artifact")
    ap.add_argument("--rate", type=float, default=100.0, help="requests per second (open loop)")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument(
        "--threads", type=int, default=1, help="onnxruntime intra-op threads in the server"
    )
    ap.add_argument("--workers", type=int, default=16, help="client threads")
    ap.add_argument("--name", default="serving")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    artifact = Path(args.artifact)
    art = load_artifact(artifact, threads=1)
    bodies = histories_from_artifact(art, args.requests)
    bare = bare_model(art, bodies[: min(500, len(bodies))], args.k)
    port = free_port()
    proc = start_server(artifact, port, args.threads)
    try:
        for body in bodies[:50]:  # warm-up through HTTP
            httpx.post(
                f"http://127.0.0.1:{port}/recommend",
                json={"history": body, "k": args.k},
                timeout=10,
            )
        rss_before = rss_kib(proc.pid)
        http = load(port, bodies, args.rate, args.k, args.workers)
        http["rss_kib_after_warmup"], http["rss_kib_after_load"] = rss_before, rss_kib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    meta = art.meta
    result = {
        "command": " ".join(["python -m benchmarks.serve_load", *(argv if argv is not None else sys.argv[1:])]),
        "git_commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu": next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                     if ln.startswith("model name")), "unknown"),
        "cores": os.cpu_count(),
        "artifact": {"path": str(artifact), "model": meta.model, "dataset": meta.dataset,
                     "quantization": meta.quantization, "artifact_bytes": meta.artifact_bytes,
                     "model_onnx_bytes": meta.model_onnx_bytes},
        "server_threads": args.threads,
        "bare": bare,
        "http": http,
        "http_overhead_p50_ms": http["client_ms"]["p50"] - bare["session_run_ms"]["p50"],
    }  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=2))
    rows = [("bare session.run", bare["session_run_ms"]), ("runtime recommend()", bare["runtime_recommend_ms"]),
            ("HTTP /recommend (client)", http["client_ms"]), ("server-reported latency_ms", http["server_reported_ms"])]  # fmt: skip
    table = "| path | p50 ms | p95 ms | p99 ms |\n|---|---|---|---|\n" + "\n".join(
        f"| {name} | {p['p50']:.3f} | {p['p95']:.3f} | {p['p99']:.3f} |" for name, p in rows
    )
    summary = (f"{meta.model} {meta.quantization} on {meta.dataset}, {args.requests} requests at "
               f"{args.rate:g}/s (achieved {http['achieved_rate']:.1f}/s), errors {http['errors']}, "
               f"server RSS {http['rss_kib_after_warmup'] / 1024:.1f} -> {http['rss_kib_after_load'] / 1024:.1f} MiB")  # fmt: skip
    (out / f"{args.name}.md").write_text(f"# {args.name}\n\n{summary}\n\n{table}\n")
    print(summary)
    print(table)
    return 0 if http["errors"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
