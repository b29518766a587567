"""The environment a benchmark ran in, recorded with every result.

Numbers without their machine are not comparable: the CPU model, cores, memory, clock and SIMD
flags, thread settings, library versions, the git commit and the load average (other processes
on a shared machine inflate latencies) are stored next to the measurements.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SIMD_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")


def cpuinfo() -> dict[str, Any]:
    """Model name, highest clock and the SIMD flags of interest, from /proc/cpuinfo."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model, mhz, flags = platform.processor() or "unknown", 0.0, set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name":
            model = value
        elif key == "cpu MHz":
            mhz = max(mhz, float(value))
        elif key == "flags":
            flags = set(value.split())
    max_freq = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    if max_freq.is_file():  # kHz; the nominal maximum beats a momentary reading
        mhz = max(mhz, int(max_freq.read_text()) / 1000)
    return {"model": model, "mhz": mhz, "flags": sorted(f for f in SIMD_FLAGS if f in flags)}


def memory_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def cores() -> int:
    """Cores this process may run on (the affinity mask, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def last_level_cache_bytes() -> int:
    """The largest CPU cache of cpu0 in bytes (Linux sysfs; 0 where unknown): what a rotation's
    files must outgrow together before its "cold" calls find their weights outside the caches."""
    best = 0
    for size in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = size.read_text().strip().upper()
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            best = max(best, int(digits) * unit)
    return best


def git_commit() -> dict[str, Any]:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}
    return {"commit": head, "dirty": bool(dirty)}


def versions() -> dict[str, str]:
    import matplotlib
    import numpy
    import onnx
    import onnxruntime
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "onnx": onnx.__version__,
        "numpy": numpy.__version__,
        "matplotlib": matplotlib.__version__,
    }


def environment(command: str) -> dict[str, Any]:
    import torch

    cpu = cpuinfo()
    return {
        "command": command,
        "utc": datetime.now(UTC).isoformat(timespec="seconds"),
        **git_commit(),
        "machine": {
            "cpu": cpu["model"],
            "mhz": cpu["mhz"],
            "simd": cpu["flags"],
            "cores": cores(),
            "memory_bytes": memory_bytes(),
            "last_level_cache_bytes": last_level_cache_bytes(),
            "platform": platform.platform(),
            "python_executable": sys.executable,
        },
        "versions": versions(),
        "threads": {
            "torch_default": torch.get_num_threads(),
            "device_case": 1,  # batch-1 latency: onnxruntime intra-op threads = torch threads = 1
            "throughput_case": cores(),  # batch 32/256: every core
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        },
        "load_average_start": list(os.getloadavg()),
    }


def write_record(record: dict[str, Any], out: str | Path) -> Path:
    """Write a benchmark's JSON record (creating its folder) and say where."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")
    return path
