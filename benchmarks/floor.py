"""The floor of one request on this CPU, from the graph onnxruntime actually runs.

For an artifact's model.onnx at batch 1 and a full history:
- the graph after onnxruntime's load-time optimisation (constant folding and fusions, so
  decoders of quantized constants are gone and fused kernels count once): its node count and
  the bytes of every constant a request reads (a lookup table only its looked-up rows);
- FLOPs from one profiled run: 2 x output elements x inner size for every matrix product
  (MatMul, Gemm, MatMulInteger, MatMulNBits, the fused int8 forms), and 4 x B x Tq x T x width
  for a fused MultiHeadAttention (its two products), the shapes the profiler saw;
- measured reference points: onnxruntime's cost per node (a chain of tiny Adds), the single-core
  peak FLOP/s and the copy bandwidth at the working set (benchmarks.bound), and a TopK of k over
  the catalogue's scores on its own; where cold calls follow an eviction, also one call of a
  one-node graph after the same eviction (the part of a cold call that no graph can remove).
floor = nodes x per-node cost + max(FLOPs / peak, bytes / bandwidth): what a request could cost
if onnxruntime ran each kernel at machine speed; measured / floor says how far from it we are.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

MATMULS = ("MatMul", "FusedMatMul", "MatMulInteger", "MatMulIntegerToFloat",
           "DynamicQuantizeMatMul", "MatMulNBits", "Gemm", "QGemm", "MatMulFpQ4")  # fmt: skip
LOOKUPS = ("Gather", "GatherBlockQuantized")
ATTENTION = "MultiHeadAttention"


def _options(threads: int = 1) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = threads
    opts.log_severity_level = 3
    return opts


def _median_call(
    sess: Any, feeds: dict[str, np.ndarray], n: int = 200, warm_s: float = 0.5, blocks: int = 5
) -> float:
    """Seconds per call: the fastest of `blocks` medians of `n` calls, after `warm_s` seconds of
    calls. An idle core raises its clock over the first ~0.2 s of work, and these reference
    points take a few milliseconds: measured from idle, a trivial node read 0.84-0.89 us where
    the warm host runs it in 0.35 us, which moved every floor 2x between two runs of the same
    files. The floor is a bound, so the host at its working clock is the point."""
    end = time.perf_counter() + warm_s
    while time.perf_counter() < end:
        sess.run(None, feeds)
    best = math.inf
    for _ in range(blocks):
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            sess.run(None, feeds)
            times.append(time.perf_counter() - t0)
        best = min(best, float(np.median(times)))
    return best


def _chain(nodes: int) -> tuple[Any, dict[str, np.ndarray]]:
    """A session of a chain of `nodes` Adds on one float, and its feeds."""
    from onnx import helper

    f = onnx.TensorProto.FLOAT
    chain = [helper.make_node("Add", [f"x{i}", "one"], [f"x{i + 1}"]) for i in range(nodes)]
    g = helper.make_graph(chain, "chain", [helper.make_tensor_value_info("x0", f, [1])],
                          [helper.make_tensor_value_info(f"x{nodes}", f, [1])],
                          [helper.make_tensor("one", f, [1], [1.0])])  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    sess = ort.InferenceSession(
        m.SerializeToString(), _options(), providers=["CPUExecutionProvider"]
    )
    return sess, {"x0": np.zeros(1, np.float32)}


def per_node_seconds(nodes: int = 64) -> float:
    """onnxruntime's cost of one cheap node: a chain of `nodes` Adds on one float, per node."""
    sess, feeds = _chain(nodes)
    return _median_call(sess, feeds) / nodes


COLD_CALLS = 40  # one-node calls, each after an eviction, for `cold_call_seconds`


def cold_call_seconds(evict: Callable[[], None], calls: int = COLD_CALLS) -> float:
    """Median seconds of one call of a one-node graph, each after `evict()` (untimed): what
    any artifact's cold call pays before its own work, the interpreter, the binding and
    onnxruntime finding their code and data in memory again (stop 52's Intel host, 960 MiB
    read first: 0.23-0.26 ms, the whole 0.25 ms cold target with no model at all)."""
    sess, feeds = _chain(1)
    for _ in range(5):
        sess.run(None, feeds)
    times = []
    for _ in range(calls):
        evict()
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def topk_seconds(num_scores: int, k: int) -> float:
    """A TopK of k over one row of `num_scores` float scores, alone in a session."""
    from onnx import helper

    f = onnx.TensorProto.FLOAT
    g = helper.make_graph(
        [helper.make_node("TopK", ["s", "k"], ["v", "i"])], "topk",
        [helper.make_tensor_value_info("s", f, [1, num_scores])],
        [helper.make_tensor_value_info("v", f, [1, k]),
         helper.make_tensor_value_info("i", onnx.TensorProto.INT64, [1, k])],
        [helper.make_tensor("k", onnx.TensorProto.INT64, [1], [k])],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    sess = ort.InferenceSession(
        m.SerializeToString(), _options(), providers=["CPUExecutionProvider"]
    )
    s = np.random.default_rng(0).normal(size=(1, num_scores)).astype(np.float32)
    return _median_call(sess, {"s": s})


def references(
    num_scores: int, k: int, max_bytes: int, evict: Callable[[], None] | None = None
) -> dict[str, Any]:
    """The measured reference points every floor of this run uses; with `evict` (the cold
    calls' eviction) also a one-node graph's cold call (`cold_call_seconds`), in ms."""
    from lsan.benchmarks.bound import machine_peak
    from lsan.benchmarks.env import environment

    peak = machine_peak(environment(""), max_bytes)
    ref = {"per_node_us": per_node_seconds() * 1e6, "topk_us": topk_seconds(num_scores, k) * 1e6,
           "peak_gflops_1core": peak["peak_gflops_1core"], "int8_factor": peak["int8_factor"],
           "bandwidth": peak["bandwidth"]}  # fmt: skip
    if evict is not None:
        ref["cold_one_node_ms"] = cold_call_seconds(evict) * 1e3
    return ref


def _dims(shape: list[dict[str, int]] | list[int]) -> list[int]:
    return [int(next(iter(d.values()))) if isinstance(d, dict) else int(d) for d in shape]


def graph_work(model_path: Path, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
    """Node count, constant bytes read and matrix FLOPs of one request on the loaded graph."""
    with tempfile.TemporaryDirectory() as tmp:
        opts = _options()
        opts.optimized_model_filepath = str(Path(tmp) / "loaded.onnx")
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(tmp) / "profile")
        sess = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])
        sess.run(None, feeds)
        events = json.loads(Path(sess.end_profiling()).read_text())
        loaded = onnx.load(str(Path(tmp) / "loaded.onnx"), load_external_data=False)
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in loaded.graph.node:
        for i in node.input:
            readers.setdefault(i, []).append(node)
    positions = int(np.prod(feeds["items"].shape))  # ids a lookup reads per request
    read = 0.0
    for init in loaded.graph.initializer:
        dims = list(init.dims)
        nbytes = math.prod(dims) * onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
        uses = readers.get(init.name, [])
        if dims and uses and all(n.op_type in LOOKUPS and n.input[0] == init.name for n in uses):
            read += min(dims[0], positions * len(uses)) * nbytes / max(dims[0], 1)  # its rows
        else:
            read += nbytes
    flops = 0
    kernels = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    for e in kernels:
        args = e.get("args", {})
        if args.get("op_name") not in (*MATMULS, ATTENTION):
            continue
        ins = [_dims(next(iter(x.values()))) for x in args.get("input_type_shape", [])]
        outs = [_dims(next(iter(x.values()))) for x in args.get("output_type_shape", [])]
        if not ins or not outs:
            continue
        if args["op_name"] == ATTENTION:  # q (B, Tq, W) against k and v (B, T, W)
            flops += 4 * int(np.prod(ins[0])) * ins[1][1]
        else:
            flops += 2 * int(np.prod(outs[0])) * ins[0][-1]  # output elements x inner size
    return {"nodes": len(loaded.graph.node), "kernels_run": len(kernels),
            "bytes_read": int(read), "flops": int(flops)}  # fmt: skip


def floor(work: dict[str, Any], ref: dict[str, Any], int8: bool) -> dict[str, Any]:
    """The floor in ms of a request whose graph does `work`, at the reference points `ref`."""
    from lsan.benchmarks.bound import bandwidth_at

    gflops = ref["peak_gflops_1core"] * (ref["int8_factor"] if int8 else 1)
    compute = work["flops"] / (gflops * 1e9)
    memory = work["bytes_read"] / bandwidth_at(ref["bandwidth"], work["bytes_read"])
    overhead = work["nodes"] * ref["per_node_us"] * 1e-6
    return {"floor_ms": (overhead + max(compute, memory)) * 1000, "compute_us": compute * 1e6,
            "memory_us": memory * 1e6, "overhead_us": overhead * 1e6}  # fmt: skip
