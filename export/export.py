"""Checkpoint -> verified ONNX artifact for the device: `python export/export.py CKPT --out DIR`.

The graph is the model's inference path: left-padded history ids, their categories and time
slots, and the ids to exclude (the user's seen items; PAD entries are ignored) in; the top-K item
ids and scores (and the full masked score vector) out. Batch, history length and exclude length
are dynamic. Exported with the dynamo exporter at a pinned opset.

Formats: fp32 (reference), fp16 (weights stored in half precision, computed in fp32), int8 dynamic
(weights of MatMul/Gemm and Gather, i.e. embedding tables, to int8; activations quantized on the
fly) and int8 static QDQ (activations calibrated on validation sequences). `--quant auto` (the
default) measures every format and ships the smallest one whose test NDCG@10 is within
`--max-drop` (relative) of PyTorch's, preferring the faster on a size tie.

Verification happens at export time and is recorded in metadata.json: fp32 vs PyTorch max abs
score difference (<= 1e-4) and identical top-10; every format's top-10 overlap with PyTorch and
its HR/NDCG@10 on the test split computed with onnxruntime. A failed check refuses the export
(exit 1) unless --force. The artifact is written to a temporary folder and renamed into place,
so a failure never leaves a half-written artifact.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from lsan.checkpoint import CheckpointError, load_model
from lsan.data.batching import eval_tensors, history_pairs
from lsan.data.prepare import SeqDataset, load_dataset
from lsan.data.readers import DataError
from lsan.digest import file_digest
from lsan.evaluate import rank_users
from lsan.metrics import all_metrics
from lsan.models import DataInfo
from lsan.models.layers import NEG
from lsan.models.objectives import uses_users

OPSET = 18
FORMATS = ("fp32", "fp16", "int8", "int8-static")
INPUTS = ("items", "cats", "slots", "exclude")
OUTPUTS = ("top_items", "top_scores", "scores")
PARITY_ATOL = 1e-4


class ExportError(RuntimeError):
    """The export failed or its verification did not pass."""


class InferenceGraph(nn.Module):
    """The exported path: history -> masked scores -> top-K. Works for every model's score_all."""

    def __init__(self, model: nn.Module, k: int):
        super().__init__()
        self.model, self.k = model, k

    def forward(self, items, cats, slots, exclude):
        scores = self.model.score_all(items, cats, slots)  # (B, |V|+1), padding column NEG
        scores = scores.scatter(1, exclude, NEG)  # PAD entries hit column 0, already NEG
        top_scores, top_items = torch.topk(scores, self.k, dim=1)
        return top_items, top_scores, scores


def example_inputs(info: DataInfo, batch: int = 2, length: int = 0, seed: int = 0):
    """A fixed, seeded batch used for tracing and the parity check (no fully padded row)."""
    g = torch.Generator().manual_seed(seed)
    t = length or min(info.max_len, 8)
    items = torch.randint(1, info.num_items + 1, (batch, t), generator=g)
    items[0, : t // 2] = 0  # one row left-padded
    cats = torch.randint(1, max(info.num_categories, 2), (batch, t), generator=g) * (items != 0)
    slots = torch.randint(1, max(info.num_slots, 2), (batch, t), generator=g) * (items != 0)
    exclude = torch.cat([items, torch.zeros(batch, 1, dtype=torch.long)], 1)  # seen items + a PAD
    return items, cats, slots, exclude


def export_fp32(model: nn.Module, info: DataInfo, path: Path, k: int) -> None:
    graph = InferenceGraph(model, k).eval()
    batch, seq, excl = (
        torch.export.Dim("batch"),
        torch.export.Dim("seq", max=info.max_len),
        torch.export.Dim("exclude"),
    )
    dynamic = {"items": {0: batch, 1: seq}, "cats": {0: batch, 1: seq}, "slots": {0: batch, 1: seq},
               "exclude": {0: batch, 1: excl}}  # fmt: skip
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(
            graph, example_inputs(info, batch=3, length=min(info.max_len, 6)), dynamo=True,
            opset_version=OPSET, input_names=list(INPUTS), output_names=list(OUTPUTS),
            dynamic_shapes=dynamic, optimize=True, verbose=False,
        )  # fmt: skip
    if prog is None:
        raise ExportError("torch.onnx.export returned no program")
    prog.save(str(path), external_data=False)
    m = onnx.load(str(path))
    for node in m.graph.node:  # the exporter's per-node stack traces would be ~40% of a small model
        del node.metadata_props[:]
        node.doc_string = ""
    onnx.save(m, str(path))


def convert(fp32: Path, out: Path, fmt: str, calibration: list[dict[str, np.ndarray]]) -> None:
    """Write `fmt` of the fp32 model to `out`."""
    if fmt == "fp32":
        shutil.copyfile(fp32, out)
    elif fmt == "fp16":
        onnx.save(compact_weights(onnx.load(str(fp32)), "fp16"), str(out))
    elif fmt == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(
            str(fp32), str(out), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm", "Gather"],
            extra_options={"MatMulConstBOnly": True},
        )  # fmt: skip
        onnx.save(compact_weights(onnx.load(str(out)), "uint8", min_elements=1024), str(out))
    elif fmt == "int8-static":
        from onnxruntime.quantization import (
            CalibrationDataReader,
            QuantFormat,
            QuantType,
            quantize_static,
        )

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.it = iter(calibration)

            def get_next(self):
                return next(self.it, None)

        quantize_static(
            str(fp32), str(out), Reader(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm", "Gather"],
            extra_options={"MatMulConstBOnly": True},
        )  # fmt: skip
        onnx.save(compact_weights(onnx.load(str(out)), "uint8", min_elements=1024), str(out))
    else:
        raise ExportError(f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")


def compact_weights(model: onnx.ModelProto, kind: str, min_elements: int = 256) -> onnx.ModelProto:
    """Store the large float32 initializers that are left in fp16 or uint8, decoded at load.

    fp16: each becomes float16 followed by a Cast to float32. uint8: asymmetric per-tensor
    quantization (scale = range / 255) followed by DequantizeLinear; this reaches tensors the
    onnxruntime quantizers leave in fp32 because they feed element-wise ops (LSAN's per-item
    output weights and bias, layer norms). Every op still computes in fp32, and onnxruntime folds
    the decoding once when the session loads, so only bytes on disk and in transit shrink.
    (onnxconverter-common's full fp16 conversion produced graphs onnxruntime rejects, a Cast type
    mismatch, or never finished on these dynamo exports.)
    """
    from onnx import helper, numpy_helper

    graph = model.graph
    kept, decoders = [], []
    for init in graph.initializer:
        if init.data_type != onnx.TensorProto.FLOAT or np.prod(init.dims) < min_elements:
            kept.append(init)
            continue
        x = numpy_helper.to_array(init)
        if kind == "fp16":
            half = np.clip(x, -65504, 65504).astype(
                np.float16
            )  # "minus infinity" masks stay finite
            kept.append(numpy_helper.from_array(half, init.name + "_fp16"))
            decoders.append(
                helper.make_node(
                    "Cast", [init.name + "_fp16"], [init.name], to=onnx.TensorProto.FLOAT
                )
            )
            continue
        lo, hi = float(min(x.min(), 0.0)), float(max(x.max(), 0.0))  # zero stays exact
        scale = max((hi - lo) / 255.0, 1e-12)
        zero = int(np.clip(round(-lo / scale), 0, 255))
        q = np.clip(np.round(x / scale) + zero, 0, 255).astype(np.uint8)
        names = [init.name + "_u8", init.name + "_scale", init.name + "_zero"]
        kept += [numpy_helper.from_array(q, names[0]), numpy_helper.from_array(np.array(scale, dtype=np.float32), names[1]),
                 numpy_helper.from_array(np.array(zero, dtype=np.uint8), names[2])]  # fmt: skip
        decoders.append(helper.make_node("DequantizeLinear", names, [init.name]))
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(decoders + nodes)
    return model


def session(path: Path, threads: int = 1) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def feeds(items, cats, slots, exclude) -> dict[str, np.ndarray]:
    arrays = (items, cats, slots, exclude)
    return {
        n: np.ascontiguousarray(np.asarray(a), dtype=np.int64)
        for n, a in zip(INPUTS, arrays, strict=True)
    }


# ---------------------------------------------------------------- verification


def ort_ranks(
    sess: ort.InferenceSession, ds: SeqDataset, split: str, max_len: int, k: int, batch: int = 256
) -> np.ndarray:
    """Rank of each user's target from the artifact's top-K (K means 'not in the top-K')."""
    data = eval_tensors(ds, split, max_len)
    ranks = []
    for start in range(0, ds.num_users, batch):
        users = np.arange(start, min(start + batch, ds.num_users))
        rows, seen = history_pairs(ds, users, split)
        width = max(int(np.bincount(rows, minlength=len(users)).max()), 1)
        exclude = np.zeros((len(users), width), dtype=np.int64)
        col = np.arange(len(rows)) - np.searchsorted(rows, rows)  # position within its row
        exclude[rows, col] = seen
        b = data.rows(torch.as_tensor(users))
        top = sess.run(["top_items"], feeds(b.items, b.cats, b.slots, exclude))[0]  # (B, K)
        hit = top == ds.items[ds.offsets[users + 1] - (2 if split == "valid" else 1)][:, None]
        ranks.append(np.where(hit.any(1), hit.argmax(1), k))
    return np.concatenate(ranks)


def latency_ms(sess: ort.InferenceSession, info: DataInfo, repeats: int = 50) -> float:
    """Median single-request latency at batch 1, full history length."""
    x = feeds(*example_inputs(info, batch=1, length=info.max_len))
    for _ in range(5):
        sess.run(None, x)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sess.run(["top_items", "top_scores"], x)
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1000)


def verify(
    model: nn.Module,
    path: Path,
    info: DataInfo,
    ds: SeqDataset | None,
    torch_metrics: dict | None,
    k: int,
) -> dict[str, Any]:
    """Parity with PyTorch on a fixed batch, plus test metrics computed with onnxruntime."""
    sess = session(path)
    x = example_inputs(info, batch=4, length=info.max_len, seed=1)
    with torch.no_grad():
        ref_top, _, ref_scores = InferenceGraph(model, k)(*x)
    top, scores = sess.run(["top_items", "scores"], feeds(*x))
    real = ref_scores.numpy() > NEG / 2  # compare real scores; masked entries are NEG in both
    report: dict[str, Any] = {
        "max_abs_score_diff": float(np.abs(scores[real] - ref_scores.numpy()[real]).max()),
        "top10_identical": bool(np.array_equal(top[:, :10], ref_top[:, :10].numpy())),
        "top10_overlap": float(np.mean([len(set(a[:10]) & set(b[:10])) / 10 for a, b in zip(top, ref_top.numpy(), strict=True)])),
        "latency_ms_b1": latency_ms(sess, info),
        "bytes": path.stat().st_size,
    }  # fmt: skip
    if ds is not None:
        m = all_metrics(ort_ranks(sess, ds, "test", info.max_len, k), (5, 10, 20))
        report["test"] = {key: m[key] for key in ("HR@10", "NDCG@10", "HR@20", "NDCG@20")}
        if torch_metrics:
            ref = torch_metrics["NDCG@10"]
            report["ndcg10_rel_drop"] = float((ref - m["NDCG@10"]) / ref) if ref > 0 else 0.0
    return report


def quantized_ops(path: Path) -> dict[str, int]:
    """Counts of the ops that carry int8 work, to document what ended up quantized."""
    ops: dict[str, int] = {}
    for node in onnx.load(str(path)).graph.node:
        if node.op_type in ("MatMulInteger", "DynamicQuantizeLinear", "DequantizeLinear", "QuantizeLinear",
                            "GatherBlockQuantized", "MatMulIntegerToFloat", "Gather", "MatMul", "Gemm"):  # fmt: skip
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return ops


# ---------------------------------------------------------------- the export


def export(
    ckpt: str | Path, out: str | Path, quant: str = "auto", k: int = 100, max_drop: float = 0.02,
    force: bool = False, data_dir: str = "", cache_dir: str = "", evaluate_data: bool = True,
    log=print, ds: SeqDataset | None = None, formats: tuple[str, ...] = FORMATS,
    every_format: Path | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Export checkpoint `ckpt` to artifact directory `out`; returns the metadata.

    `ds` replaces loading the checkpoint's dataset for the test-split metrics (tests pass one).
    `formats` are the candidates `quant="auto"` tries. With `every_format`, every candidate that
    could be produced is also written as its own artifact `<every_format>-<format>` (the
    benchmarks measure them all from one ONNX export and one PyTorch evaluation).
    """
    out = Path(out)
    if quant != "auto" and quant not in FORMATS:
        raise ExportError(f"unknown quantization {quant!r} (known: auto, {', '.join(FORMATS)})")
    if not out.parent.is_dir():
        raise ExportError(f"output parent folder {out.parent} does not exist")
    if not os.access(out.parent, os.W_OK):
        raise ExportError(f"output folder {out.parent} is not writable")
    model, run, info = load_model(ckpt)
    if uses_users(model):
        raise ExportError(
            f"model '{run.model_name}' scores with a user embedding, but the ONNX contract has no "
            "user id (items, cats, slots only); serve it from PyTorch or export a sequence model"
        )
    if k < 1 or k > info.num_items:
        raise ExportError(f"--k must be in 1..{info.num_items}")
    dataset = json.loads((Path(ckpt) / "dataset.json").read_text())
    torch_test = None
    if not evaluate_data:
        ds = None
    elif ds is None:
        data = run.data
        ds = load_dataset(
            data.dataset, data_dir or data.data_dir, cache_dir or data.cache_dir, data.min_count
        )
    if ds is not None:
        if ds.num_items != info.num_items:
            raise ExportError(
                f"dataset '{ds.name}' has {ds.num_items} items, the checkpoint {info.num_items}"
            )
        ranks = rank_users(
            model,
            ds,
            "test",
            info.max_len,
            dataclasses.replace(run.eval, mask_seen=True),
            torch.device("cpu"),
        )
        torch_test = all_metrics(ranks, (10, 20))
    tried = list(formats) if quant == "auto" else [quant]

    with tempfile.TemporaryDirectory(prefix=".export-", dir=out.parent) as tmp_name:
        tmp = Path(tmp_name)
        fp32 = tmp / "reference.onnx"
        log(f"exporting {run.model_name} to ONNX (opset {OPSET})")
        export_fp32(model, info, fp32, k)
        calibration = calibration_feeds(ds, info) if "int8-static" in tried else []
        candidates: dict[str, dict[str, Any]] = {}
        for fmt in tried:
            path = tmp / f"{fmt}.onnx"
            try:
                convert(fp32, path, fmt, calibration)
                candidates[fmt] = verify(model, path, info, ds, torch_test, k)
                candidates[fmt]["ops"] = quantized_ops(path)
            except Exception as exc:  # a format that cannot be produced is reported, not fatal
                candidates[fmt] = {
                    "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                }
            c = candidates[fmt]
            if "error" in c:
                log(f"  {fmt:12s} failed: {c['error']}")
            else:
                shown = f"NDCG@10 {c['test']['NDCG@10']:.4f}" if "test" in c else "no data"
                log(
                    f"  {fmt:12s} {c['bytes']:>11,d} B  {c['latency_ms_b1']:.3f} ms  top10 overlap {c['top10_overlap']:.3f}  {shown}"
                )

        chosen, problems = choose(candidates, quant, max_drop)
        if problems and not force:
            raise ExportError(
                "verification failed: " + "; ".join(problems) + " (use --force to write anyway)"
            )

        def write(fmt: str, problems: list[str], dest: Path) -> dict[str, Any]:
            final = tmp / f"artifact-{fmt}"
            final.mkdir()
            shutil.copyfile(tmp / f"{fmt}.onnx", final / "model.onnx")
            meta = metadata(run, info, dataset, fmt, candidates, torch_test, k, problems, ckpt)
            embed_metadata(final / "model.onnx", meta)
            meta["sha256"] = file_digest(final / "model.onnx")
            meta["bytes"] = (final / "model.onnx").stat().st_size
            (final / "metadata.json").write_text(json.dumps(meta, indent=2))
            if dest.exists():
                shutil.rmtree(dest)
            shutil.move(final, dest)  # a rename when dest is on the same filesystem
            return meta

        meta = write(chosen, problems, out)
        if every_format is not None:
            for fmt, c in candidates.items():
                if "error" not in c:
                    dest = every_format.with_name(f"{every_format.name}-{fmt}")
                    write(fmt, choose(candidates, fmt, max_drop)[1], dest)
    log(f"artifact: {out} ({chosen}, {meta['bytes']:,} bytes)")
    return meta


def calibration_feeds(
    ds: SeqDataset | None, info: DataInfo, users: int = 256
) -> list[dict[str, np.ndarray]]:
    """Validation histories (never test) for static quantization, in batches of 32."""
    if ds is None:
        return [
            feeds(*example_inputs(info, batch=8, length=info.max_len, seed=s)) for s in range(4)
        ]
    data = eval_tensors(ds, "valid", info.max_len)
    rng = np.random.default_rng(0)
    pick = rng.choice(ds.num_users, size=min(users, ds.num_users), replace=False)
    out = []
    for start in range(0, len(pick), 32):
        b = data.rows(torch.as_tensor(pick[start : start + 32]))
        out.append(feeds(b.items, b.cats, b.slots, b.items))
    return out


def choose(
    candidates: dict[str, dict[str, Any]], quant: str, max_drop: float
) -> tuple[str, list[str]]:
    """Pick the format to ship and list the checks it fails (empty = all passed)."""

    def problems_of(fmt: str) -> list[str]:
        c = candidates[fmt]
        if "error" in c:
            return [f"{fmt}: {c['error']}"]
        found = []
        if fmt == "fp32":
            if c["max_abs_score_diff"] > PARITY_ATOL:
                found.append(
                    f"fp32 max abs score diff {c['max_abs_score_diff']:.2e} > {PARITY_ATOL}"
                )
            if not c["top10_identical"]:
                found.append("fp32 top-10 differs from PyTorch")
        elif c.get("ndcg10_rel_drop", 0.0) > max_drop:
            found.append(f"{fmt} NDCG@10 relative drop {c['ndcg10_rel_drop']:.1%} > {max_drop:.0%}")
        return found

    fp32_problems = problems_of("fp32") if "fp32" in candidates else []
    if quant != "auto":
        return quant, fp32_problems + ([] if quant == "fp32" else problems_of(quant))
    ok = [f for f in FORMATS if f in candidates and not problems_of(f)]
    if not ok:
        return "fp32", fp32_problems or ["no format passed verification"]
    best = min(ok, key=lambda f: (candidates[f]["bytes"], candidates[f]["latency_ms_b1"]))
    return best, fp32_problems


def metadata(
    run, info, dataset, chosen, candidates, torch_test, k, problems, ckpt
) -> dict[str, Any]:
    chosen_c = candidates[chosen]
    return {
        "format_version": 1,
        "model": run.model_name,
        "model_config": dataclasses.asdict(run.model),
        "dataset": dataset["name"],
        "dataset_stats": dataset["stats"],
        "checkpoint": str(Path(ckpt).resolve()),
        "info": dataclasses.asdict(info),
        "raw_item_ids": dataset["raw_item_ids"],
        "item_category": dataset["item_category"],
        "category_names": dataset["category_names"],
        "time_slot_rule": {
            "rule": dataset["slot_rule"],
            "pad": 0,
            "unknown": 1,
            "hour": "UTC hour of the unix timestamp + 2",
            "weekday": "Monday=0 .. Sunday=6, + 2",
        },  # fmt: skip
        "contract": {
            "inputs": {
                "items": "int64 (B, T) item indices 1..|V|, left-padded with 0, T <= max_len",
                "cats": "int64 (B, T) category id of each item (item_category), 0 on padding",
                "slots": "int64 (B, T) time-slot id of each interaction, 0 on padding, 1 unknown",
                "exclude": "int64 (B, E) item indices to exclude from the ranking, 0 = none",
            },
            "outputs": {
                "top_items": f"int64 (B, {k}) item indices, best first",
                "top_scores": f"float32 (B, {k})",
                "scores": "float32 (B, |V|+1) masked scores (index 0 = padding)",
            },
            "k": k,
            "max_len": info.max_len,
        },  # fmt: skip
        "opset": OPSET,
        "quantization": chosen,
        "quantized_ops": chosen_c.get("ops", {}),
        "parity": {
            f: {key: v for key, v in c.items() if key != "ops"} for f, c in candidates.items()
        },
        "test_metrics_pytorch": torch_test,
        "test_metrics": chosen_c.get("test"),
        "verification_problems": problems,
        "popular_items": popular(dataset, info),
        "torch_version": torch.__version__,
        "onnxruntime_version": ort.__version__,
    }


def popular(dataset: dict[str, Any], info: DataInfo, n: int = 100) -> list[int]:
    """Fallback ranking for empty histories: most frequent items (indices) in the training data."""
    counts = dataset.get("item_counts")
    if counts is None:
        return list(range(1, min(n, info.num_items) + 1))
    return [int(i) for i in np.argsort(-np.asarray(counts), kind="stable")[:n] if i != 0]


def embed_metadata(path: Path, meta: dict[str, Any]) -> None:
    m = onnx.load(str(path))
    keys = {"lsan.model": meta["model"], "lsan.dataset": meta["dataset"], "lsan.quantization": meta["quantization"],
            "lsan.k": str(meta["contract"]["k"]), "lsan.max_len": str(meta["info"]["max_len"]),
            "lsan.num_items": str(meta["info"]["num_items"]), "lsan.time_slot_rule": meta["time_slot_rule"]["rule"]}  # fmt: skip
    del m.metadata_props[:]
    for key, value in keys.items():
        m.metadata_props.add(key=key, value=value)
    onnx.save(m, str(path))


# ---------------------------------------------------------------- command line


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="lsan export", description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", help="checkpoint directory written by `lsan train`")
    ap.add_argument("--out", required=True, help="artifact directory to write")
    ap.add_argument("--quant", default="auto", choices=["auto", *FORMATS])
    ap.add_argument(
        "--k", type=int, default=100, help="top-K computed in the graph (the server's max k)"
    )
    ap.add_argument(
        "--max-drop",
        type=float,
        default=0.02,
        help="max relative NDCG@10 drop for a quantized format",
    )
    ap.add_argument("--force", action="store_true", help="write the artifact even if a check fails")
    ap.add_argument(
        "--no-eval", action="store_true", help="skip the test-split metrics (no dataset needed)"
    )
    ap.add_argument("--data-dir", default="")
    ap.add_argument("--cache-dir", default="")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.getLogger().setLevel(logging.ERROR)  # onnxruntime.quantization's advice on stderr
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    try:
        export(args.checkpoint, args.out, args.quant, args.k, args.max_drop, args.force,
               args.data_dir, args.cache_dir, evaluate_data=not args.no_eval)  # fmt: skip
    except (ExportError, CheckpointError, DataError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
