"""Memory: peak resident set size of a fresh process that loads an artifact and answers requests.

The device case is a process that holds one model, so each measurement runs in a new Python
process (serving.runtime only: onnxruntime and numpy, no torch) that loads the artifact with one
thread, answers `requests` single-user requests of the model's full history length, and reports
its peak RSS (getrusage ru_maxrss, KiB on Linux). A process that only imports numpy and
onnxruntime gives the baseline, so the model's own share (weights, the session's buffers, the id
maps) is the difference. The peak is VmHWM from /proc/self/status: getrusage's ru_maxrss would
do, except that Linux carries the parent's peak across fork + exec, so a child of a big process
(the suite itself) reports at least its parent's size.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from lsan.benchmarks.artifacts import Artifact
from lsan.benchmarks.env import REPO

PEAK = """
def peak_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
"""

BASELINE = (
    PEAK
    + """
import json
import numpy, onnxruntime
print(json.dumps({"peak_rss_kib": peak_kib()}))
"""
)

SERVE = (
    PEAK
    + """
import json, sys
import numpy as np
from lsan.serving.runtime import load_artifact
imported = peak_kib()
art = load_artifact(sys.argv[1], threads=1)
ids = art.catalogue
rng = np.random.default_rng(0)
for _ in range(int(sys.argv[2])):
    hist = rng.choice(ids, size=min(art.max_len, len(ids)), replace=False)
    art.recommend([[(int(i), 1.7e9 + 3600.0 * n) for n, i in enumerate(hist)]], k=10)
print(json.dumps({"peak_rss_kib": peak_kib(), "after_import_kib": imported, "torch_imported": "torch" in sys.modules}))
"""
)

# One model file (ONNX or ORT format) loaded into a one-thread session: how long the load takes
# (the graph's optimisation and constant folding, or none for a pre-optimised ORT file) and
# what the process holds at its peak, over its imports.
LOAD = (
    PEAK
    + """
import json, sys, time
from lsan.artifact import session
imported = peak_kib()
t0 = time.perf_counter()
session(sys.argv[1], threads=1)
print(json.dumps({"load_s": time.perf_counter() - t0, "peak_rss_kib": peak_kib(), "after_import_kib": imported}))
"""
)


def run_script(script: str, *args: str, timeout: float = 600) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"memory probe failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def baseline_mib() -> float:
    return run_script(BASELINE)["peak_rss_kib"] / 1024


def peak_rss(path: Path, requests: int) -> dict[str, Any]:
    r = run_script(SERVE, str(path), str(requests))
    return {
        "peak_rss_mib": r["peak_rss_kib"] / 1024,
        "after_import_mib": r["after_import_kib"] / 1024,
        "torch_imported": r["torch_imported"],
    }


def load_cost(model: Path, repeats: int = 3) -> dict[str, float]:
    """Session load time (median of `repeats` fresh processes, ms) and the peak resident set
    over the imports (MiB) of loading one model file."""
    runs = [run_script(LOAD, str(model)) for _ in range(repeats)]
    loads = sorted(r["load_s"] for r in runs)
    over = max(r["peak_rss_kib"] - r["after_import_kib"] for r in runs)
    return {"load_ms": loads[len(loads) // 2] * 1000, "rss_over_import_mib": over / 1024}


def measure(artifacts: list[Artifact], requests: int, log=print) -> dict[str, Any]:
    base = baseline_mib()
    rows = []
    for a in artifacts:
        r = peak_rss(a.path, requests)
        rows.append({**a.key, **r, "model_share_mib": r["peak_rss_mib"] - base,
                     "requests": requests})  # fmt: skip
        log(f"  {a.ckpt.label:24s} {a.format:12s} peak RSS {r['peak_rss_mib']:.1f} MiB")
    return {"baseline_mib": base, "rows": rows}
