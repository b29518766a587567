"""fp32 ONNX model -> 4-bit weights: `quantize_int4(src, dst)`.

Why 4 bits: on the device the artifact is dominated by the item tables (|V| x D floats, read as
embeddings and again as the output layer). Block-wise 4-bit codes with one fp32 scale and one
4-bit zero point per block of `block_size` values cost 4 + 36/block_size bits per weight (5.1 at
block 32: a sixth of fp32, two thirds of per-tensor int8), and the per-block scale keeps the
error local to 32 values instead of a whole table.

What is rewritten, for each float32 initializer with at least `min_elements` values:
- MatMul whose B is the initializer (K x N), Gemm with it as B (alpha = beta = 1, no transA), and
  MatMul whose B is `Transpose(initializer)` (the dynamo exporter's tied output layer,
  `h @ E.T`) become onnxruntime's `MatMulNBits` (com.microsoft): the weights stay 4-bit in memory
  and the kernel multiplies block by block, by default with int8 activations (accuracy_level 4,
  quantized per block of each row, so a user's scores never depend on the rest of the batch).
- Gather along axis 0 of a 2-D table whose row length is a multiple of the block becomes
  `GatherBlockQuantized` (com.microsoft, uint8 data, bits = 4, blocks along the row): only the
  gathered rows are decoded.
- Every other use (per-item bias and weight vectors, codebooks multiplied with a computed tensor,
  a Gather whose rows do not split into blocks) reads the float tensor back from a decoder made of
  standard ops (BitwiseAnd, BitShift, Concat, Cast, Sub, Mul, Reshape, Slice, Transpose) whose
  inputs are all initializers, so onnxruntime's constant folding evaluates it once when the
  session loads: no per-request cost, only the bytes on disk shrink.
All three share one storage layout, MatMulNBits' own: the matrix is quantized row by row in
blocks along its last axis, codes packed two per byte (low nibble first) as uint8 (R, blocks,
block/2), scales float32 (R, blocks), zero points packed the same way (R, ceil(blocks/2)). So a
table used by Gather and by the output layer is stored once: GatherBlockQuantized reads the
packed codes as (R, cols/2) and MatMulNBits through a Reshape that is folded at load. The codes
come from onnxruntime's own block quantizer (the kernel behind `MatMulNBitsQuantizer`, asymmetric).
The graph keeps opset 18 and no int4 tensor types.

`MatMulNBitsQuantizer` itself is not used for the graph: on these exports it leaves the tied
item table in fp32 for the Transpose and adds a 4-bit copy for the Gather (the SASRec file grows),
misses Gemm and element-wise uses, and raises the opset to 21 for int4 Gather tensors.

What stays float (reported with the reason): initializers under `min_elements` (layer norms,
biases of a hidden width) unless they are lookup tables whose rows split into whole blocks
(`lookup_rows`: LSAN's context tables), initializers holding non-finite values (a mask
would lose its meaning), initializers that are also graph inputs or outputs, and float types
other than float32. Integer initializers (item code tables, shapes, indices) are never touched.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import NodeProto, TensorProto, helper, numpy_helper

# The block quantizer MatMulNBitsQuantizer calls; importing the tool's module would configure
# the root logger as a side effect.
from onnxruntime.capi._pybind_state import quantize_matmul_4bits

MS = "com.microsoft"
# What the int4 and lowbit formats pass as `decode_below`: the encoder's weights (every float
# tensor under this many elements) are decoded at load from one stored 4-bit matrix
# (`blob_decoders`) rather than read by MatMulNBits, so a request runs fp32 MatMuls on a few KB
# of cache-resident weights with no per-call activation quantization, and answers as the decoded
# fp32 graph would; item-sized tables keep the 4-bit kernels.
ENCODER_DECODED_BELOW = 1 << 16
OTHER_FLOATS = {TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}


@dataclass(frozen=True)
class Blocks:
    """A matrix (rows, cols) quantized row by row in blocks along its last axis (MatMulNBits)."""

    packed: np.ndarray  # (rows, blocks, block // 2) uint8, two codes 0..15 a byte, low nibble first
    scales: np.ndarray  # (rows, blocks) float32
    zeros: np.ndarray  # (rows, ceil(blocks / 2)) uint8, zero points packed like the codes
    cols: int  # values per row before padding to whole blocks
    # 8: codes (rows, blocks, block) and zero points (rows, blocks) a byte each, for the
    # load-time decoder only (onnxruntime's block kernels read 4)
    bits: int = 4

    @property
    def block(self) -> int:
        return self.packed.shape[2] * 8 // self.bits


@dataclass
class Edit:
    """One call's rewrite: what it adds to and removes from the graph (never shared)."""

    accuracy_level: int  # MatMulNBits' compute: 0 (unset) fp32, 4 int8 activations per row block
    initializers: list[TensorProto] = field(default_factory=list)
    decoders: list[NodeProto] = field(default_factory=list)  # read only initializers: folded
    replaced: dict[str, list[NodeProto]] = field(default_factory=dict)  # node's output[0] -> new


# ---------------------------------------------------------------- numerics


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """Codes 0..15 along the last axis -> bytes, two a byte, low nibble first (odd: pad with 0)."""
    codes = np.asarray(codes, dtype=np.uint8)
    if codes.shape[-1] % 2:
        codes = np.concatenate([codes, np.zeros((*codes.shape[:-1], 1), np.uint8)], -1)
    return (codes[..., 0::2] & 0x0F) | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    """Inverse of pack_nibbles: (..., n) bytes -> (..., 2n) codes."""
    packed = np.asarray(packed, dtype=np.uint8)
    return np.stack([packed & 0x0F, packed >> 4], -1).reshape(*packed.shape[:-1], -1)


def quantize_blocks(matrix: np.ndarray, block: int) -> Blocks:
    """Asymmetric 4-bit codes of `matrix` (rows, cols), with onnxruntime's MatMulNBits quantizer."""
    rows, cols = matrix.shape
    blocks = -(-cols // block)
    # the kernel reads B as (K, N): our rows are its columns
    b = np.zeros((blocks * block, rows), np.float32)
    b[:cols] = matrix.T
    packed = np.zeros((rows, blocks, block // 2), np.uint8)
    scales = np.zeros((rows, blocks), np.float32)
    zeros = np.zeros((rows, (blocks + 1) // 2), np.uint8)
    quantize_matmul_4bits(packed, b, scales, zeros, block, rows, blocks * block, False)
    return Blocks(packed, scales, zeros, cols)


def quantize_blocks8(matrix: np.ndarray, block: int) -> Blocks:
    """Asymmetric 8-bit codes of `matrix` (rows, cols) in blocks along its rows: each block's
    range [min(0, lo), max(0, hi)] in 255 steps, zero point rounded (the 4-bit rule at 8 bits)."""
    rows, cols = matrix.shape
    blocks = -(-cols // block)
    x = np.zeros((rows, blocks * block), np.float32)
    x[:, :cols] = matrix
    x = x.reshape(rows, blocks, block)
    lo = np.minimum(x.min(-1), 0.0)
    hi = np.maximum(x.max(-1), 0.0)
    scales = ((hi - lo) / 255.0).astype(np.float32)
    scales[scales == 0] = 1.0
    zeros = np.clip(np.rint(-lo / scales), 0, 255)
    codes = np.clip(np.rint(x / scales[..., None]) + zeros[..., None], 0, 255)
    return Blocks(codes.astype(np.uint8), scales, zeros.astype(np.uint8), cols, bits=8)


def block_axis(shape: tuple[int, ...]) -> int:
    """The axis a decoded-at-load tensor is blocked along: the longest (the last of equals), so
    a (1, |V|, 2) per-item weight is blocked along the items, not in pairs."""
    return len(shape) - 1 - int(np.argmax(shape[::-1]))


def dequantize_blocks(q: Blocks) -> np.ndarray:
    """The float matrix the kernels and the load-time decoder see, (rows, cols) float32."""
    rows, blocks = q.scales.shape
    if q.bits == 8:
        codes, zeros = q.packed.astype(np.float32), q.zeros[:, :, None].astype(np.float32)
    else:
        codes = unpack_nibbles(q.packed).astype(np.float32)  # (rows, blocks, block)
        zeros = unpack_nibbles(q.zeros)[:, :blocks, None].astype(np.float32)
    return ((codes - zeros) * q.scales[:, :, None]).reshape(rows, -1)[:, : q.cols]


# ---------------------------------------------------------------- graph pieces


def attr(node: NodeProto, name: str, default: Any) -> Any:
    found = [a for a in node.attribute if a.name == name]
    return helper.get_attribute_value(found[0]) if found else default


def declare_contrib(model: onnx.ModelProto) -> None:
    """Import onnxruntime's com.microsoft domain if a node uses it and the model does not yet."""
    used = any(n.domain == MS for n in model.graph.node)
    if used and not any(o.domain == MS for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS, 1))


def consumers(graph: onnx.GraphProto) -> dict[str, list[tuple[NodeProto, int]]]:
    """Value name -> (node, input slot) reading it. A use inside a subgraph counts as slot -1."""
    uses: dict[str, list[tuple[NodeProto, int]]] = {}
    for node in graph.node:
        for slot, name in enumerate(node.input):
            uses.setdefault(name, []).append((node, slot))
        for a in node.attribute:
            for sub in [a.g] if a.HasField("g") else list(a.graphs):
                for name in subgraph_inputs(sub):
                    uses.setdefault(name, []).append((node, -1))
    return uses


def subgraph_inputs(graph: onnx.GraphProto) -> set[str]:
    names = {name for node in graph.node for name in node.input}
    for node in graph.node:
        for a in node.attribute:
            for sub in [a.g] if a.HasField("g") else list(a.graphs):
                names |= subgraph_inputs(sub)
    return names


def kernel_axis(
    node: NodeProto, slot: int, shape: tuple[int, ...], uses: dict, outputs: set[str], block: int
) -> int | None:
    """The axis a 4-bit kernel would block this use along, or None if the use needs floats."""
    if len(shape) != 2:
        return None
    if node.op_type == "Gather" and slot == 0 and attr(node, "axis", 0) == 0:
        return 1 if shape[1] % block == 0 else None
    if node.op_type == "MatMul" and slot == 1:
        return 0  # B is (K, N): blocks run along K, down the columns
    if node.op_type == "Gemm" and slot == 1:
        plain = attr(node, "alpha", 1.0) == 1.0 and attr(node, "beta", 1.0) == 1.0
        if not plain or attr(node, "transA", 0):
            return None
        return 1 if attr(node, "transB", 0) else 0  # transB: B is (N, K), blocks along its rows
    if node.op_type == "Transpose" and slot == 0 and list(attr(node, "perm", [1, 0])) == [1, 0]:
        readers = uses.get(node.output[0], [])
        only_matmul = all(n.op_type == "MatMul" and s == 1 for n, s in readers)
        return 1 if readers and only_matmul and node.output[0] not in outputs else None
    return None


def storage(
    name: str, x: np.ndarray, axis: int, block: int, edit: Edit, bits: int = 4
) -> tuple[Blocks, str]:
    """Quantize `x` blocked along `axis`, add its initializers; returns the codes and a prefix.
    8 bits only for what a load-time decoder reads: onnxruntime's block kernels take 4."""
    matrix = np.moveaxis(x, axis, -1).reshape(-1, x.shape[axis])
    q = quantize_blocks8(matrix, block) if bits == 8 else quantize_blocks(matrix, block)
    prefix = f"{name}.q{bits}.axis{axis}"
    rows = matrix.shape[0]
    edit.initializers += [
        numpy_helper.from_array(q.packed.reshape(rows, -1), prefix + ".codes"),
        numpy_helper.from_array(q.scales, prefix + ".scales"),
        numpy_helper.from_array(q.zeros, prefix + ".zeros"),
    ]
    return q, prefix


def matmul_nbits(a: str, out: str, q: Blocks, prefix: str, edit: Edit) -> NodeProto:
    # MatMulNBits wants the codes as (N, blocks, block/2); a Reshape of the shared 2-D codes,
    # folded at load, keeps one copy on disk for Gather and MatMul alike.
    if not any(prefix + ".codes3" in n.output for n in edit.decoders):
        shape = numpy_helper.from_array(np.array(q.packed.shape, np.int64), prefix + ".shape3")
        edit.initializers.append(shape)
        edit.decoders.append(
            helper.make_node("Reshape", [prefix + ".codes", shape.name], [prefix + ".codes3"])
        )
    inputs = [a, prefix + ".codes3", prefix + ".scales", prefix + ".zeros"]
    return helper.make_node(
        "MatMulNBits", inputs, [out], domain=MS, K=q.cols, N=q.packed.shape[0], bits=4,
        block_size=q.block, accuracy_level=edit.accuracy_level,
    )  # fmt: skip


def gather_quantized(node: NodeProto, q: Blocks, prefix: str) -> NodeProto:
    inputs = [prefix + ".codes", node.input[1], prefix + ".scales", prefix + ".zeros"]
    return helper.make_node(
        "GatherBlockQuantized", inputs, list(node.output), domain=MS, gather_axis=0,
        quantize_axis=1, block_size=q.block, bits=4,
    )  # fmt: skip


def unpack_nodes(src: str, dst: str, shape: list[int], edit: Edit) -> list[NodeProto]:
    """Nodes unpacking uint8 bytes `src` into codes `dst` of `shape`, low nibble first."""
    lo, hi, axes, shp = dst + ".lo", dst + ".hi", dst + ".axes", dst + ".shp"
    edit.initializers += [
        numpy_helper.from_array(np.array([-1], np.int64), axes),
        numpy_helper.from_array(np.array(shape, np.int64), shp),
    ]
    return [
        helper.make_node("BitwiseAnd", [src, "q4.mask"], [lo]),
        helper.make_node("BitShift", [src, "q4.shift"], [hi], direction="RIGHT"),
        helper.make_node("Unsqueeze", [lo, axes], [lo + "1"]),
        helper.make_node("Unsqueeze", [hi, axes], [hi + "1"]),
        helper.make_node("Concat", [lo + "1", hi + "1"], [dst + ".pairs"], axis=-1),
        helper.make_node("Reshape", [dst + ".pairs", shp], [dst]),
    ]


def decoder(
    name: str, shape: tuple[int, ...], axis: int, q: Blocks, prefix: str, edit: Edit
) -> None:
    """Standard-op nodes computing the float tensor `name` from its codes; folded at load."""
    rows, blocks = q.scales.shape
    block = q.block
    moved = [*np.delete(shape, axis), shape[axis]]
    p = prefix + ".dec"
    consts = {
        p + ".scale_axes": np.array([-1], np.int64),
        p + ".flat": np.array([rows, blocks * block], np.int64),
        p + ".start": np.array([0], np.int64),
        p + ".end": np.array([q.cols], np.int64),
        p + ".last": np.array([-1], np.int64),
        p + ".moved": np.array(moved, np.int64),
    }
    f = TensorProto.FLOAT
    if q.bits == 8:  # a byte a code: only the block axis to restore
        consts[p + ".shape3"] = np.array([rows, blocks, block], np.int64)
        nodes = [helper.make_node("Reshape", [prefix + ".codes", p + ".shape3"], [p + ".q"])]
        zeros = prefix + ".zeros"
    else:
        nodes = unpack_nodes(prefix + ".codes", p + ".q", [rows, blocks, block], edit)
        nodes += unpack_nodes(prefix + ".zeros", p + ".z2", [rows, 2 * q.zeros.shape[1]], edit)
        zeros = p + ".z"  # the packed zero points less the pad of an odd block count
        consts[p + ".end_z"] = np.array([blocks], np.int64)
        nodes.append(
            helper.make_node("Slice", [p + ".z2", p + ".start", p + ".end_z", p + ".last"], [zeros])
        )
    edit.initializers += [numpy_helper.from_array(v, k) for k, v in consts.items()]
    nodes += [
        helper.make_node("Unsqueeze", [zeros, p + ".scale_axes"], [p + ".z3"]),
        helper.make_node("Cast", [p + ".q"], [p + ".qf"], to=f),
        helper.make_node("Cast", [p + ".z3"], [p + ".zf"], to=f),
        helper.make_node("Sub", [p + ".qf", p + ".zf"], [p + ".centred"]),
        helper.make_node("Unsqueeze", [prefix + ".scales", p + ".scale_axes"], [p + ".s3"]),
        helper.make_node("Mul", [p + ".centred", p + ".s3"], [p + ".blocks"]),
        helper.make_node("Reshape", [p + ".blocks", p + ".flat"], [p + ".padded"]),
        helper.make_node("Slice", [p + ".padded", p + ".start", p + ".end", p + ".last"],
                         [p + ".m"]),
    ]  # fmt: skip
    if axis == len(shape) - 1:
        nodes.append(helper.make_node("Reshape", [p + ".m", p + ".moved"], [name]))
    else:
        perm = [*range(axis), len(shape) - 1, *range(axis, len(shape) - 1)]
        nodes.append(helper.make_node("Reshape", [p + ".m", p + ".moved"], [p + ".t"]))
        nodes.append(helper.make_node("Transpose", [p + ".t"], [name], perm=perm))
    edit.decoders += nodes


# ---------------------------------------------------------------- the rewrite


def lookup_rows(init: TensorProto, uses: dict, block: int) -> bool:
    """A 2-D table read only by row lookups (Gather on axis 0) whose rows split into whole
    blocks: its rows cost what an item table's do in 4 bits, whatever its size. LSAN's context
    tables (9 x 32 on Beauty, 20 x 48 on ML-100K) are under `min_elements` and stayed float32,
    3-8 KB of a 80-165 KB file; a 4-bit row is as exact as the encoder's weights already are."""
    shape, block = tuple(init.dims), fitted_block(tuple(init.dims), block)
    readers = uses.get(init.name, [])  # a Gather's axis never depends on the graph's outputs
    return bool(readers) and all(
        n.op_type == "Gather" and kernel_axis(n, s, shape, uses, set(), block) is not None
        for n, s in readers
    )


def keep_reason(
    init: TensorProto, graph: onnx.GraphProto, min_elements: int, uses: dict, block: int
) -> str | None:
    """Why a float32 initializer stays float, or None to quantize it."""
    if init.name in {i.name for i in graph.input}:
        return "also a graph input (can be overridden at run time)"
    if init.name in {o.name for o in graph.output}:
        return "also a graph output"
    if int(np.prod(init.dims)) < min_elements and not lookup_rows(init, uses, block):
        return f"fewer than {min_elements} elements"
    if init.name not in uses:
        return "unused"
    if not np.isfinite(numpy_helper.to_array(init)).all():
        return "holds non-finite values"
    return None


def fitted_block(shape: tuple[int, ...], block: int) -> int:
    """`block`, or 16 (the kernels' smallest) for a tensor with a side that 16 divides but
    `block` does not: a D = 16 table then blocks its rows instead of staying float."""
    return 16 if block > 16 and any(d % block and d % 16 == 0 for d in shape) else block


def rewrite(init: TensorProto, uses: dict, outputs: set[str], block: int, edit: Edit) -> list[str]:
    """Replace every use of float initializer `init` by a 4-bit kernel or a load-time decoder;
    returns how it is now read."""
    x = numpy_helper.to_array(init).astype(np.float32)
    block = fitted_block(x.shape, block)
    stored: dict[int, tuple[Blocks, str]] = {}

    def codes(axis: int) -> tuple[Blocks, str]:
        if axis not in stored:
            stored[axis] = storage(init.name, x, axis, block, edit)
        return stored[axis]

    how, needs_floats = [], False
    for node, slot in uses[init.name]:
        axis = None if slot < 0 else kernel_axis(node, slot, x.shape, uses, outputs, block)
        if axis is None:
            needs_floats = True
        elif node.op_type == "Gather":
            edit.replaced[node.output[0]] = [gather_quantized(node, *codes(axis))]
            how.append("Gather->GatherBlockQuantized")
        elif node.op_type in ("MatMul", "Gemm"):
            edit.replaced[node.output[0]] = nbits(node, *codes(axis), edit)
            how.append(f"{node.op_type}->MatMulNBits")
        else:  # a Transpose read only as MatMul B: those MatMuls read the codes instead
            edit.replaced[node.output[0]] = []
            for matmul, _ in uses[node.output[0]]:
                edit.replaced[matmul.output[0]] = nbits(matmul, *codes(axis), edit)
                how.append("Transpose+MatMul->MatMulNBits")
    if needs_floats:
        axis = next(iter(stored), block_axis(x.shape))
        decoder(init.name, x.shape, axis, *codes(axis), edit)
        how.append("decoded at load")
    return how


def blob_axis(name: str, shape: tuple[int, ...], uses: dict, outputs: set[str], block: int) -> int:
    """The axis to block a decoded-at-load tensor along: the one its first 4-bit kernel would
    use (a MatMul weight along K, so each dot product meets few scales), else the longest axis
    that splits into whole blocks (a (50, D) position table read by a Slice joins the blob; by
    its 50 rows it needed its own padded matrix and decoder, +1 KB), else `block_axis`."""
    for node, slot in uses.get(name, []):
        axis = None if slot < 0 else kernel_axis(node, slot, shape, uses, outputs, block)
        if axis is not None:
            return axis
    whole = [a for a, n in enumerate(shape) if n % block == 0]
    return max(whole, key=lambda a: (shape[a], a)) if whole else block_axis(shape)


def blob_decoders(
    tensors: dict[str, tuple[np.ndarray, int]], block: int, edit: Edit, bits: int = 4
) -> None:
    """Decode-at-load for many tensors from one stored matrix: each tensor (array, blocking
    axis) becomes rows of one block along that axis; the rows of all are quantized as one (R, block)
    matrix with one shared decoder (folded at load), and each tensor is a Slice of it (plus a
    Reshape and, for a leading block axis, a Transpose), folded too. Same bytes of codes, scales
    and zero points as one matrix per tensor, a fraction of the nodes."""
    parts, start = [], 0
    slices: list[tuple[str, int, int, tuple[int, ...], int]] = []
    for name, (x, axis) in tensors.items():
        rows = np.moveaxis(x, axis, -1).reshape(-1, block)
        slices.append((name, start, start + len(rows), x.shape, axis))
        parts.append(rows)
        start += len(rows)
    blob = f"q{bits}blob{block}"
    q, prefix = storage(blob, np.concatenate(parts), 1, block, edit, bits)
    decoder(blob, (start, block), 1, q, prefix, edit)
    zero = numpy_helper.from_array(np.array([0], np.int64), blob + ".axis0")
    edit.initializers.append(zero)
    for name, a, b, shape, axis in slices:
        moved = [*np.delete(shape, axis), shape[axis]]
        consts = {".a": [a], ".b": [b], ".shape": moved}
        edit.initializers += [
            numpy_helper.from_array(np.array(v, np.int64), name + k) for k, v in consts.items()
        ]
        rows = name + ".rows"
        edit.decoders.append(
            helper.make_node("Slice", [blob, name + ".a", name + ".b", zero.name], [rows])
        )
        if axis == len(shape) - 1:
            edit.decoders.append(helper.make_node("Reshape", [rows, name + ".shape"], [name]))
        else:
            perm = [*range(axis), len(shape) - 1, *range(axis, len(shape) - 1)]
            edit.decoders += [
                helper.make_node("Reshape", [rows, name + ".shape"], [name + ".moved"]),
                helper.make_node("Transpose", [name + ".moved"], [name], perm=perm),
            ]


def nbits(node: NodeProto, q: Blocks, prefix: str, edit: Edit) -> list[NodeProto]:
    """MatMul, or Gemm with its optional bias added after, as MatMulNBits reading `prefix` codes."""
    if len(node.input) < 3 or not node.input[2]:
        return [matmul_nbits(node.input[0], node.output[0], q, prefix, edit)]
    product = node.output[0] + ".q4"
    return [
        matmul_nbits(node.input[0], product, q, prefix, edit),
        helper.make_node("Add", [product, node.input[2]], list(node.output)),
    ]


def quantize_int4(
    src: Path, dst: Path, block_size: int = 32, min_elements: int = 1024, accuracy_level: int = 4,
    decode_below: int = 0, decode_bits: int = 4,
) -> dict[str, Any]:  # fmt: skip
    """Write the 4-bit-weight version of fp32 ONNX model `src` to `dst`; returns a report.

    `accuracy_level` is MatMulNBits' compute type: 4 (the default) multiplies with int8
    activations quantized per block of each row (so a row never depends on the rest of the
    batch); measured here it is as fast as fp32 at batch 1 and agrees with fp32 as closely as
    level 0, which dequantizes the weights to fp32 in the kernel and was ~1.5x slower on a
    12k x 64 output layer. Without int8 dot products onnxruntime falls back to fp32 compute.

    `decode_below` > 0: every tensor with fewer elements (an encoder's weights, not an item
    table) whose blocking axis splits into whole blocks is decoded at load instead
    (`blob_decoders`: one stored matrix for all of them, the same bytes): requests then run
    plain fp32 MatMuls on cache-resident weights instead of MatMulNBits with per-call
    activation quantization, and answer exactly as the decoded fp32 graph would. `decode_bits`
    is that stored matrix's width: 4, or 8 (37 bytes a block of 32 instead of 20.5), which no
    kernel reads, so it costs bytes on disk and nothing per request.

    Report: file sizes, the count of each rewrite ("Gather->GatherBlockQuantized",
    "Transpose+MatMul->MatMulNBits", ..., "decoded at load"), each quantized initializer with
    its shape and how it is read now, and each float32 initializer left float with the reason.
    """
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size}")
    if decode_bits not in (4, 8):
        raise ValueError(f"decode_bits must be 4 or 8, got {decode_bits}")
    if accuracy_level not in range(5):
        raise ValueError(f"accuracy_level must be 0..4, got {accuracy_level}")
    model = onnx.load(str(src))
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if opset < 18:
        raise ValueError(f"the decoders need opset >= 18 (BitwiseAnd), the model has {opset}")
    graph = model.graph
    uses = consumers(graph)
    outputs = {o.name for o in graph.output}
    edit = Edit(accuracy_level)
    kept_float: dict[str, str] = {}
    quantized: dict[str, dict[str, Any]] = {}
    small: dict[int, dict[str, np.ndarray]] = {}  # block -> tensors decoded at load from a blob
    for init in graph.initializer:
        if init.data_type in OTHER_FLOATS:
            kept_float[init.name] = "not float32"
        if init.data_type != TensorProto.FLOAT:
            continue  # integer tables, shapes and indices stay as they are
        reason = keep_reason(init, graph, min_elements, uses, block_size)
        if reason:
            kept_float[init.name] = reason
            continue
        shape = tuple(init.dims)
        if int(np.prod(shape)) < decode_below:
            block = fitted_block(shape, block_size)
            axis = blob_axis(init.name, shape, uses, outputs, block)
            if shape[axis] % block == 0:
                x = numpy_helper.to_array(init).astype(np.float32)
                small.setdefault(block, {})[init.name] = (x, axis)
                quantized[init.name] = {"shape": list(shape), "read_as": ["decoded at load (blob)"]}
                continue
        how = rewrite(init, uses, outputs, block_size, edit)
        quantized[init.name] = {"shape": list(init.dims), "read_as": how}
    for block, tensors in small.items():
        blob_decoders(tensors, block, edit, decode_bits)
    apply(model, edit, set(quantized))
    onnx.save(model, str(dst))
    counts = Counter(h for q in quantized.values() for h in q["read_as"])
    return {
        "bytes_before": Path(src).stat().st_size,
        "bytes_after": Path(dst).stat().st_size,
        "block_size": block_size,
        "decode_bits": decode_bits,
        "accuracy_level": accuracy_level,
        "rewritten": dict(sorted(counts.items())),
        "quantized": quantized,
        "kept_float": kept_float,
    }


def apply(model: onnx.ModelProto, edit: Edit, dropped: set[str]) -> None:
    """Swap in the new nodes and initializers; decoders first so the graph stays sorted."""
    graph = model.graph
    if not dropped:
        return
    nodes = [new for node in graph.node for new in edit.replaced.get(node.output[0], [node])]
    kept = [i for i in graph.initializer if i.name not in dropped]
    if any(n.op_type == "BitShift" for n in edit.decoders):  # the unpacking constants
        kept += [
            numpy_helper.from_array(np.array(0x0F, np.uint8), "q4.mask"),
            numpy_helper.from_array(np.array(4, np.uint8), "q4.shift"),
        ]
    del graph.node[:]
    graph.node.extend(edit.decoders + nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept + edit.initializers)
    declare_contrib(model)
