"""fp32 ONNX -> each shipped format, and what quantization touched.

fp32 (reference); fp16 (weights stored in half precision, computed in fp32); int8 (onnxruntime
dynamic quantization of MatMul/Gemm weights and Gather tables, and of the tied scoring table
(export/fold.py); activations quantized on the fly with one scale per tensor, so a row's answer
depends on its batch: the runtime then answers row by row; constants decoded once at load);
int8-static (QDQ, activations calibrated on validation sequences); int4 (4-bit
block-quantized weights, export/int4.py: item tables read by onnxruntime's 4-bit kernels, the
encoder's small matrices decoded once at load); lowbit (a low-bit-trained item table at its own
widths, export/lowbit.py) and lowbit8 (the same with the encoder's matrix in 8 bits).
Tensors the quantizers leave in fp32 are stored as uint8 (fp16 for fp16), decoded once when
the session loads.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import torch

from lsan.artifact import feeds
from lsan.data.batching import eval_tensors
from lsan.data.prepare import SeqDataset
from lsan.export import ExportError
from lsan.export.fold import (
    decode,
    foldable_decoders,
    integer_scoring,
    rescaled_products,
    small_lookups,
)
from lsan.export.graph import example_inputs
from lsan.export.lowbit import PackedTable, quantize_lowbit
from lsan.info import DataInfo

FORMATS = ("fp32", "fp16", "int8", "int8-static", "int4")  # what any checkpoint can ship
# only for checkpoints trained with a low-bit item table (model.bits): the table at its trained
# widths, the encoder's weights in 4 bits (export/lowbit.py) or in 8 (lowbit8: the same
# requests, a few KB more); `--quant auto` adds them for them. Format -> the encoder's bits.
ENCODER_BITS = {"lowbit": 4, "lowbit8": 8}
TABLE_FORMATS = tuple(ENCODER_BITS)
ALL_FORMATS = FORMATS + TABLE_FORMATS
# what `--quant auto` tries: int8-static (QDQ) is never the best choice, so only an explicit
# `--quant int8-static` builds it. Measured on Beauty SASRec D64 (1 thread, batch 1): 845 KB and
# 0.72 ms against int8's 843 KB and 0.25 ms (fp32 0.32 ms): QDQ's Quantize/Dequantize pairs
# around every product cost more than the int8 kernels save, and it is never smaller.
AUTO_FORMATS = tuple(f for f in FORMATS if f != "int8-static")
QUANT_OPS = ("MatMulInteger", "DynamicQuantizeLinear", "DequantizeLinear", "QuantizeLinear",
             "GatherBlockQuantized", "MatMulNBits", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
             "Gather", "MatMul", "Gemm")  # fmt: skip


def convert(
    fp32: Path, out: Path, fmt: str, calibration: list[dict[str, np.ndarray]],
    table: PackedTable | None = None,
) -> None:  # fmt: skip
    """Write `fmt` of the fp32 model to `out` (without shape annotations or node names).

    `table`: the checkpoint's low-bit item table (export/lowbit.py), for the lowbit format."""
    if fmt in TABLE_FORMATS:
        quantize_lowbit(fp32, out, table, ENCODER_BITS[fmt])
    else:
        _convert(fp32, out, fmt, calibration)
    m = onnx.load(str(out))
    slim(m)
    onnx.save(m, str(out))


def slim(m: onnx.ModelProto) -> None:
    """Drop what onnxruntime does not read: shape annotations, node names, long tensor names,
    the exporter's notes on the graph's inputs and outputs.

    value_info is recomputed by onnxruntime's shape inference at load, and every tensor but the
    graph's inputs and outputs gets a short name (base 36, in order of appearance): on a 4-bit
    model of 189 KB the two were 12% of the file. ONNX is proto2, so an empty string that is set
    is still written: names and doc strings are cleared, not emptied (4 bytes a node), and the
    torch.export notes on each input and output (~150 bytes each) go: 1.6 KB of a 150 KB file.
    """
    g = m.graph
    del g.value_info[:]
    io = (*g.input, *g.output)
    for v in io:
        del v.metadata_props[:]
    keep = {v.name for v in io}
    names: dict[str, str] = {}

    def short(name: str) -> str:
        if not name or name in keep:
            return name
        if name not in names:
            names[name] = np.base_repr(len(names), 36).lower()
        return names[name]

    for init in g.initializer:
        init.name = short(init.name)
    for node in g.node:
        node.ClearField("name")
        node.ClearField("doc_string")
        node.input[:] = [short(i) for i in node.input]
        node.output[:] = [short(o) for o in node.output]


def _convert(fp32: Path, out: Path, fmt: str, calibration: list[dict[str, np.ndarray]]) -> None:
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
        m = compact_weights(onnx.load(str(out)), "uint8", min_elements=1024)
        integer_scoring(m)  # the tied table scores in int8 too
        small_lookups(m)  # small tables (LSAN's context) decoded whole, at load
        foldable_decoders(m)  # and every other constant is decoded once, at load
        rescaled_products(m)  # products of gathered int8 rows: one fused kernel, not four nodes
        onnx.save(m, str(out))
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
    elif fmt == "int4":
        from lsan.export.int4 import ENCODER_DECODED_BELOW, quantize_int4

        quantize_int4(fp32, out, decode_below=ENCODER_DECODED_BELOW)
    else:
        raise ExportError(f"unknown format {fmt!r} (known: {', '.join(ALL_FORMATS)})")


def compact_weights(model: onnx.ModelProto, kind: str, min_elements: int = 256) -> onnx.ModelProto:
    """Store the large float32 initializers that are left in fp16 or uint8, decoded at load.

    fp16: each becomes float16 followed by a Cast to float32. uint8: asymmetric per-tensor
    quantization (scale = range / 255) decoded by Cast/Sub/Mul (`fold.decode`); this reaches
    tensors the onnxruntime quantizers leave in fp32 because they feed element-wise ops (LSAN's
    per-item output weights and bias, layer norms). Every op still computes in fp32, and
    onnxruntime folds the decoders when the session loads (it would not fold DequantizeLinear),
    so only bytes on disk and in transit shrink.
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
            half = np.clip(x, -65504, 65504).astype(np.float16)  # "minus infinity" stays finite
            kept.append(numpy_helper.from_array(half, init.name + "_fp16"))
            decoders.append(helper.make_node("Cast", [init.name + "_fp16"], [init.name],
                                             to=onnx.TensorProto.FLOAT))  # fmt: skip
            continue
        lo, hi = float(min(x.min(), 0.0)), float(max(x.max(), 0.0))  # zero stays exact
        scale = max((hi - lo) / 255.0, 1e-12)
        zero = int(np.clip(round(-lo / scale), 0, 255))
        q = np.clip(np.round(x / scale) + zero, 0, 255).astype(np.uint8)
        names = [init.name + "_u8", init.name + "_scale", init.name + "_zero"]
        kept += [numpy_helper.from_array(q, names[0]), numpy_helper.from_array(np.array(scale, dtype=np.float32), names[1]),
                 numpy_helper.from_array(np.array(zero, dtype=np.float32), names[2])]  # fmt: skip
        decoders += decode(*names, init.name)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(decoders + nodes)
    return model


def quantized_ops(path: Path) -> dict[str, int]:
    """Counts of the ops that carry quantized work, to document what ended up quantized."""
    ops: dict[str, int] = {}
    for node in onnx.load(str(path)).graph.node:
        if node.op_type in QUANT_OPS:
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return ops


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
