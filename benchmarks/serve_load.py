"""HTTP serving benchmark: /recommend latency at fixed request rates, next to the bare model.

What is measured and why: the edge server's cost per request is the model call plus HTTP, JSON,
validation and id mapping. We start the real server (uvicorn, one worker, onnxruntime with 1
intra-op thread, as on a phone core) on loopback and replay histories sampled from the
artifact's catalogue at each fixed rate for a fixed time, open loop: every request is sent on its
schedule whether or not earlier ones finished, so queueing shows up in the tail. Per rate we
record client-side latency percentiles, errors, the achieved rate and, from every answer's
`Server-Timing` header, the server's own time (`total`) and the model's share of it (`model`,
the onnxruntime runs), so "server latency minus model time" comes from real responses; the
body's `latency_ms` (the route's time) splits the rest into the runtime's id mapping and
padding and the framework's share (validation, dependencies, JSON, middleware). In the same run
we time the bare `session.run` and the runtime's `recommend` on the same histories.

The load generator must not be the bottleneck: it is one asyncio process over a pool of
keep-alive connections (more are opened when all are busy), with every request's bytes built
before the clock starts and the answer read by Content-Length, no JSON parsing. A request's
client latency runs from its turn to be sent to the last byte of its answer, waiting for a
connection included. It reports how late each send was against its schedule, the rate it
achieved and its own CPU time per request next to the server's, so a reader can check that the
client kept up.

    python -m benchmarks.serve_load ARTIFACT_DIR --rate 100 500 --duration 60 --history 50 \
        --name serving-beauty
    python -m benchmarks.serve_load ARTIFACT_DIR --rate 100 --requests 2000   # the older form
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from lsan.benchmarks.env import environment, write_record
from lsan.serving.runtime import Artifact, load_artifact

RESULTS = Path(__file__).resolve().parent / "results"
MAX_REQUESTS = 200_000  # per rate: a typo in --rate or --duration must not run for hours
TIMING = re.compile(rb"(\w+);dur=([0-9.]+)")
ROUTE_MS = re.compile(rb'"latency_ms":([0-9.eE+-]+)')


def histories_from_artifact(
    art: Artifact, n: int, seed: int = 0, length: int = 0
) -> list[list[dict[str, Any]]]:
    """Realistic request bodies: random catalogue items with increasing timestamps.

    The artifact holds no user data (by design), so histories are sampled from its catalogue,
    `length` items each (0: lengths drawn from 1..max_len, short and full-length histories).
    """
    raw, max_len = art.raw_ids[1:], art.max_len
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        size = length or int(rng.integers(1, max_len + 1))
        items = rng.choice(raw, size=size, replace=size > len(raw))
        ts = 1_400_000_000 + np.cumsum(rng.integers(3600, 86400 * 7, size=size))
        out.append(
            [{"item_id": int(i), "timestamp": int(t)} for i, t in zip(items, ts, strict=True)]
        )
    return out


def percentiles(ms: list[float] | np.ndarray) -> dict[str, float]:
    a = np.asarray(ms, dtype=float)
    if a.size == 0:
        return {"p50": float("nan"), "p95": float("nan"), "p99": float("nan"),
                "mean": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}  # fmt: skip
    p50, p95, p99 = np.percentile(a, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99), "mean": float(a.mean()),
            "min": float(a.min()), "max": float(a.max()), "n": int(a.size)}  # fmt: skip


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


# ---------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, proc: subprocess.Popen | None = None, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with status {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /ready HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server on port {port} not ready in {timeout_s:.0f} s")


def start_server(artifact: Path, port: int, threads: int, log: Path) -> subprocess.Popen:
    """`python -m serving` on 127.0.0.1:port; its output goes to `log` (a full pipe would
    block it)."""
    env = {**os.environ, "LSAN_ARTIFACT": str(artifact), "LSAN_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "serving", "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_ready(port, proc)
    except RuntimeError as exc:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{exc}: {log.read_text()[-500:]}") from None
    return proc


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- the load generator


def request_bytes(path: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body, separators=(",", ":")).encode()
    head = (f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"content-length: {len(data)}\r\n\r\n")  # fmt: skip
    return head.encode() + data


# uvicorn closes a keep-alive connection after 5 s idle (its timeout_keep_alive default); a
# request sent on one just then meets the close (a ConnectionResetError, seen once in 30,000 at
# 500/s), so the client retires its idle connections sooner, as HTTP clients' pools do
IDLE_S = 4.0


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.idle_since = time.perf_counter()

    async def exchange(self, request: bytes) -> tuple[int, bytes, bytes]:
        """Send one request, read the answer: (status, Server-Timing value, body)."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status, length, timing = int(lines[0].split(b" ", 2)[1]), None, b""
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"server-timing":
                timing = value.strip()
        if length is None:
            raise ValueError("answer without Content-Length")
        return status, timing, await self.reader.readexactly(length)


async def open_loop(
    port: int, requests: list[bytes], rate: float, connections: int, timeout_s: float
) -> dict[str, Any]:
    """Send `requests` at `rate` per second on schedule (open loop), each on an idle keep-alive
    connection (a new one while fewer than `connections` are open); time every answer."""
    idle: list[Conn] = []
    opened = opened_total = 0  # open now, opened in all
    n = len(requests)
    due = np.zeros(n)
    started, sent, done = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    model_ms, total_ms, route_ms = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    errors: Counter[str] = Counter()
    free = asyncio.Condition()

    async def connect() -> Conn:
        nonlocal opened, opened_total
        opened += 1
        try:
            conn = Conn(*await asyncio.open_connection("127.0.0.1", port))
        except BaseException:
            opened -= 1
            raise
        opened_total += 1
        return conn

    async def acquire() -> Conn:
        nonlocal opened
        while True:
            while not idle and opened >= connections:
                async with free:
                    await free.wait()
            if not idle:
                return await connect()
            conn = idle.pop()
            if not conn.reader.at_eof() and time.perf_counter() - conn.idle_since < IDLE_S:
                return conn
            conn.writer.close()  # closed by the server's keep-alive timeout, or about to be
            opened -= 1

    async def release(conn: Conn | None) -> None:
        if conn is not None:
            conn.idle_since = time.perf_counter()
            idle.append(conn)
        async with free:
            free.notify()

    async def one(i: int) -> None:
        nonlocal opened
        started[i] = time.perf_counter()
        conn: Conn | None = None
        try:
            async with asyncio.timeout(timeout_s):
                conn = await acquire()
                sent[i] = time.perf_counter()
                status, timing, body = await conn.exchange(requests[i])
            done[i] = time.perf_counter()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError,
                TimeoutError) as exc:  # fmt: skip
            errors[type(exc).__name__] += 1
            if conn is not None:  # a half-read answer: the connection cannot be reused
                conn.writer.close()
                opened -= 1
            await release(None)
            return
        await release(conn)
        if status != 200:
            errors[f"HTTP {status}"] += 1
            return
        parts = {k.decode(): float(v) for k, v in TIMING.findall(timing)}
        model_ms[i], total_ms[i] = parts.get("model", np.nan), parts.get("total", np.nan)
        if m := ROUTE_MS.search(body):
            route_ms[i] = float(m.group(1))

    for _ in range(min(connections, 8)):  # open before the clock starts
        idle.append(await connect())
    cpu0, tasks = time.process_time(), []
    start = time.perf_counter()
    for i in range(n):
        due[i] = start + i / rate
        delay = due[i] - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    end, cpu = time.perf_counter(), time.process_time() - cpu0
    for conn in idle:
        conn.writer.close()
    ok, n_sent = ~np.isnan(done), int((~np.isnan(sent)).sum())
    span = np.nanmax(sent) - np.nanmin(sent) if n_sent > 1 else float("nan")
    overhead = total_ms - model_ms
    return {
        "target_rate": rate, "requests": n, "ok": int(ok.sum()),
        "errors": int(sum(errors.values())), "errors_by_kind": dict(errors),
        "achieved_rate": float((n_sent - 1) / span) if span > 0 else float("nan"),
        "seconds": end - start, "connections_opened": opened_total,
        "client_ms": percentiles((done - started)[ok] * 1000),  # a connection's wait included
        "client_from_schedule_ms": percentiles((done - due)[ok] * 1000),
        "lateness_ms": percentiles((started - due)[~np.isnan(started)] * 1000),
        "connection_wait_ms": percentiles((sent - started)[~np.isnan(sent)] * 1000),
        "server_total_ms": percentiles(total_ms[~np.isnan(total_ms)]),
        "server_model_ms": percentiles(model_ms[~np.isnan(model_ms)]),
        "server_overhead_ms": percentiles(overhead[~np.isnan(overhead)]),
        "server_route_ms": percentiles(route_ms[~np.isnan(route_ms)]),
        "client_cpu_us_per_request": cpu / n * 1e6, "client_cpu_share": cpu / (end - start),
    }  # fmt: skip


def load(
    port: int, requests: list[bytes], rate: float, connections: int = 256,
    timeout_s: float = 10.0, server_pid: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One open-loop phase, with the server's CPU time and memory around it when its pid is
    known."""
    before = (cpu_seconds(server_pid), rss_kib(server_pid)) if server_pid else None
    out = asyncio.run(open_loop(port, requests, rate, connections, timeout_s))
    if before is not None and server_pid is not None:
        cpu = cpu_seconds(server_pid) - before[0]
        out |= {"server_cpu_us_per_request": cpu / len(requests) * 1e6,
                "server_cpu_share": cpu / out["seconds"],
                "rss_kib_before": before[1], "rss_kib_after": rss_kib(server_pid)}  # fmt: skip
    return out


# ---------------------------------------------------------------- the record


def verdicts(phase: dict[str, Any]) -> dict[str, bool]:
    over, model = phase["server_overhead_ms"], phase["server_model_ms"]
    return {"overhead_le_model_p50": bool(over["p50"] <= model["p50"]),
            "p99_le_10ms": bool(phase["client_ms"]["p99"] <= 10.0),
            "no_errors": phase["errors"] == 0}  # fmt: skip


def markdown(record: dict[str, Any]) -> str:
    a, bare = record["artifact"], record["bare"]
    env = record["environment"]
    lines = [
        f"# {record['name']}", "",
        f"{a['model']} {a['quantization']} on {a['dataset']}, history {record['history'] or '1-max'}, "
        f"k {record['k']}, server threads {record['server_threads']}, {env['machine']['cores']} cores "
        f"({env['machine']['cpu']}), load average {env['load_average_start'][0]:.2f} at the start, "
        f"{record['load_average_end'][0]:.2f} at the end.", "",
        f"`{env['command']}`", "",
        "| rate /s (achieved) | requests | errors | client p50 / p95 / p99 / max ms "
        "| server total p50 / p99 | model p50 / p99 | overhead (total - model) p50 / p99 "
        "| late p99 ms | client CPU us/req | server CPU us/req |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for p in record["phases"]:
        c, t, m = p["client_ms"], p["server_total_ms"], p["server_model_ms"]
        o = p["server_overhead_ms"]
        lines.append(
            f"| {p['target_rate']:g} ({p['achieved_rate']:.1f}) | {p['requests']} | {p['errors']} "
            f"| {c['p50']:.3f} / {c['p95']:.3f} / {c['p99']:.3f} / {c['max']:.3f} "
            f"| {t['p50']:.3f} / {t['p99']:.3f} | {m['p50']:.3f} / {m['p99']:.3f} "
            f"| {o['p50']:.3f} / {o['p99']:.3f} | {p['lateness_ms']['p99']:.3f} "
            f"| {p['client_cpu_us_per_request']:.0f} | {p.get('server_cpu_us_per_request', float('nan')):.0f} |"
        )  # fmt: skip
    lines += ["", "| in process (no HTTP) | p50 ms | p95 ms | p99 ms |", "|---|---|---|---|"]
    for name, key in [("bare session.run", "session_run_ms"),
                      ("runtime recommend() (id mapping, padding)", "runtime_recommend_ms")]:  # fmt: skip
        p = bare[key]
        lines.append(f"| {name} | {p['p50']:.3f} | {p['p95']:.3f} | {p['p99']:.3f} |")
    lines += ["", "Where a request's time goes (p50 ms, from each answer's Server-Timing and "
              "latency_ms): model; the route less the model (id mapping, padding, the answer); "
              "the server less the route (validation, dependencies, JSON, middleware, thread pool); "
              "the client less the server (uvicorn's HTTP, loopback, the client).", "",
              "| rate /s | model | route - model | total - route | client - total |",
              "|---|---|---|---|---|"]  # fmt: skip
    for p in record["phases"]:
        b = p["breakdown_p50_ms"]
        lines.append(f"| {p['target_rate']:g} | {b['model']:.3f} | {b['route_less_model']:.3f} "
                     f"| {b['total_less_route']:.3f} | {b['client_less_total']:.3f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.serve_load",
                                 description=__doc__.splitlines()[0])  # fmt: skip
    ap.add_argument("artifact")
    ap.add_argument("--rate", type=float, nargs="+", default=[100.0],
                    help="requests per second (open loop), one phase per rate")  # fmt: skip
    ap.add_argument("--duration", type=float, default=None,
                    help="seconds per rate (default: --requests requests per rate)")  # fmt: skip
    ap.add_argument("--requests", type=int, default=2000, help="requests per rate")
    ap.add_argument("--history", type=int, default=0,
                    help="history length of every request (0: drawn from 1..max_len)")  # fmt: skip
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1,
                    help="onnxruntime intra-op threads in the server")  # fmt: skip
    ap.add_argument("--workers", "--connections", dest="connections", type=int, default=256,
                    help="most keep-alive connections the client opens")  # fmt: skip
    ap.add_argument("--port", type=int, default=None,
                    help="load the server already listening on 127.0.0.1:PORT instead of "
                         "starting one")  # fmt: skip
    ap.add_argument("--name", default="serving")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    counts = [int(args.duration * r) if args.duration else args.requests for r in args.rate]
    if max(counts) > MAX_REQUESTS or min(counts) < 2:
        ap.error(f"each rate must send between 2 and {MAX_REQUESTS} requests (got {counts})")
    command = "python -m benchmarks.serve_load " + shlex.join(
        argv if argv is not None else sys.argv[1:]
    )
    env = environment(command)
    artifact = Path(args.artifact)
    art = load_artifact(artifact, threads=1)
    hists = histories_from_artifact(art, min(2000, max(counts)), length=args.history)
    bare = bare_model(art, hists[:500], args.k)
    pool = [request_bytes("/recommend", {"history": h, "k": args.k, "exclude_seen": True})
            for h in hists]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        proc = None
        port = args.port
        if port is None:
            port = free_port()
            proc = start_server(artifact, port, args.threads, Path(tmp) / "server.log")
        pid = proc.pid if proc is not None else None
        try:
            load(port, pool[:100], 200.0, args.connections)  # warm-up: connections, allocator
            phases = []
            for rate, n in zip(args.rate, counts, strict=True):
                phase = load(port, [pool[i % len(pool)] for i in range(n)], rate,
                             args.connections, server_pid=pid)  # fmt: skip
                ms = {key: phase[key]["p50"] for key in
                      ("server_model_ms", "server_route_ms", "server_total_ms", "client_ms")}  # fmt: skip
                phase["breakdown_p50_ms"] = {
                    "model": ms["server_model_ms"],
                    "route_less_model": ms["server_route_ms"] - ms["server_model_ms"],
                    "total_less_route": ms["server_total_ms"] - ms["server_route_ms"],
                    "client_less_total": ms["client_ms"] - ms["server_total_ms"],
                }
                phase["verdicts"] = verdicts(phase)
                phases.append(phase)
                c, o, m = phase["client_ms"], phase["server_overhead_ms"], phase["server_model_ms"]
                print(f"{rate:g}/s: {n} requests, achieved {phase['achieved_rate']:.1f}/s, "
                      f"errors {phase['errors']}, client p50 {c['p50']:.3f} p99 {c['p99']:.3f} ms, "
                      f"server overhead p50 {o['p50']:.3f} ms vs model {m['p50']:.3f} ms, "
                      f"late p99 {phase['lateness_ms']['p99']:.3f} ms", flush=True)  # fmt: skip
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=15)
    meta = art.meta
    record = {
        "name": args.name, "environment": env, "load_average_end": list(os.getloadavg()),
        "artifact": {"path": str(artifact), "model": meta.model, "dataset": meta.dataset,
                     "quantization": meta.quantization, "artifact_bytes": meta.artifact_bytes,
                     "model_onnx_bytes": meta.model_onnx_bytes},
        "server_threads": args.threads, "history": args.history, "k": args.k,
        "server": "started" if args.port is None else f"given, port {args.port}",
        "bare": bare, "phases": phases,
    }  # fmt: skip
    out = Path(args.out)
    write_record(record, out / f"{args.name}.json")
    table = markdown(record)
    (out / f"{args.name}.md").write_text(table)
    print(table)
    return 0 if all(p["errors"] == 0 for p in phases) else 1


if __name__ == "__main__":
    raise SystemExit(main())
