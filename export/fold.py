"""Graph passes that make quantized constants cost nothing per request.

onnxruntime does not constant-fold `DequantizeLinear` (it keeps QDQ patterns for its fusions),
so an int8 graph that decodes an initializer with it decodes that whole tensor on every call:
SASRec's tied scoring table, LSAN's per-item weights, every tensor `compact_weights` stored as
uint8. Two rewrites fix that without changing the bytes on disk:

- `foldable_decoders`: DequantizeLinear(initializer) -> Cast, Sub, Mul of the same initializer.
  Standard ops with constant inputs are folded once when a session loads, so the decoded float
  tensor is built once and the request reads it like an fp32 weight.
- `small_lookups`: Gather from a small int8 table then DequantizeLinear of the rows (what the
  quantizer writes for LSAN's category and time-slot tables, 9 x D each on Beauty) -> the table
  decoded once (folded at load) and a float Gather: one node less per table per request, the
  same values, the same bytes on disk. Large tables (the item table) keep the gather of int8
  rows: decoding them at load would hold 4 bytes a value in memory.
- `integer_scoring`: a MatMul whose weight is such a decoded table, reached through an optional
  Transpose (the tied output layer `h @ E.T`), runs on the int8 table itself: DynamicQuantizeLinear
  of the activations, MatMulInteger against the transposed int8 initializer (the Transpose is
  folded at load), one rescale. It reads 1 byte per table entry instead of 4 (the pattern
  onnxruntime fuses into DynamicQuantizeMatMul), the same recipe quantize_dynamic applies to
  every other constant MatMul. Like those, the activation scale is per tensor, so the answer of
  a row depends on its batch (the artifact records that and the server answers row by row).
- `rescaled_products`: MatMulInteger on rows gathered from an int8 table, then Cast, scale and
  bias (LSAN's context fusion) -> one MatMulIntegerToFloat, bit for bit the same.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from lsan.export.int4 import MS, attr, consumers, declare_contrib

FLOAT = onnx.TensorProto.FLOAT


def _inits(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {i.name: i for i in model.graph.initializer}


def producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    """Value name -> the node that writes it."""
    return {o: n for n in model.graph.node for o in n.output}


def sole_reader(graph: onnx.GraphProto) -> Callable[[str, str], onnx.NodeProto | None]:
    """`find(name, op)`: the one node reading value `name` if it is an `op` and `name` is not a
    graph output (so the pair can be fused), else None; the graph's readers indexed once."""
    outputs, uses = {o.name for o in graph.output}, consumers(graph)

    def find(name: str, op: str) -> onnx.NodeProto | None:
        readers = uses.get(name, [])
        if name in outputs or len(readers) != 1 or readers[0][0].op_type != op:
            return None
        return readers[0][0]

    return find


def _per_tensor_params(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> bool:
    """A DequantizeLinear with one constant scale (and zero point) for the whole tensor."""
    rest = [x for x in node.input[1:] if x]
    return node.op_type == "DequantizeLinear" and all(
        x in inits and int(np.prod(inits[x].dims)) == 1 for x in rest
    )


def _per_tensor(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> bool:
    """A DequantizeLinear of an initializer with one scale (and zero point) for the tensor."""
    return bool(node.input) and node.input[0] in inits and _per_tensor_params(node, inits)


def integer_scoring(model: onnx.ModelProto) -> int:
    """Rewrite float MatMuls against a decoded int8 table to MatMulInteger; the count rewritten."""
    inits, made = _inits(model), producers(model)
    graph, done = model.graph, 0
    new_nodes: list[onnx.NodeProto] = []
    for node in list(graph.node):
        if node.op_type != "MatMul":
            new_nodes.append(node)
            continue
        b = made.get(node.input[1])
        transpose = b if b is not None and b.op_type == "Transpose" else None
        dq = made.get(transpose.input[0]) if transpose is not None else b
        if dq is None or not _per_tensor(dq, inits):
            new_nodes.append(node)
            continue
        q = inits[dq.input[0]]
        if q.data_type not in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8) or len(q.dims) != 2:
            new_nodes.append(node)
            continue
        p = node.output[0] + "_int"
        weight = q.name
        if transpose is not None:  # Transpose of the int8 initializer itself: folded at load
            weight = p + "_wT"
            new_nodes.append(helper.make_node("Transpose", [q.name], [weight], perm=[1, 0]))
        zero_w = dq.input[2] if len(dq.input) > 2 and dq.input[2] else ""
        if not zero_w:
            zero_w = p + "_wz"
            graph.initializer.append(numpy_helper.from_array(np.array(0, np.int8), zero_w))
        new_nodes += [
            helper.make_node(
                "DynamicQuantizeLinear", [node.input[0]], [p + "_a", p + "_as", p + "_az"]
            ),
            helper.make_node("MatMulInteger", [p + "_a", weight, p + "_az", zero_w], [p + "_i"]),
            helper.make_node("Cast", [p + "_i"], [p + "_f"], to=FLOAT),
            helper.make_node("Mul", [p + "_as", dq.input[1]], [p + "_s"]),
            helper.make_node("Mul", [p + "_f", p + "_s"], [node.output[0]]),
        ]
        done += 1
    return _replaced(model, new_nodes, done)


def foldable_decoders(model: onnx.ModelProto) -> int:
    """DequantizeLinear of per-tensor-quantized initializers -> Cast, Sub, Mul; the count."""
    inits = _inits(model)
    graph, done = model.graph, 0
    new_nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if not _per_tensor(node, inits):
            new_nodes.append(node)
            continue
        x, scale = node.input[0], node.input[1]
        zero = node.input[2] if len(node.input) > 2 and node.input[2] else ""
        out = node.output[0]
        if zero:
            z = numpy_helper.to_array(inits[zero]).astype(np.float32)
            graph.initializer.append(numpy_helper.from_array(z, out + "_zf"))
        new_nodes += decode(x, scale, out + "_zf" if zero else "", out)
        done += 1
    return _replaced(model, new_nodes, done)


def small_lookups(model: onnx.ModelProto, max_elements: int = 4096) -> int:
    """Gather(int8 table) -> DequantizeLinear, table under `max_elements` -> DequantizeLinear of
    the table (for `foldable_decoders` to fold) -> Gather of floats; the count."""
    inits, graph, done = _inits(model), model.graph, 0
    only_reader = sole_reader(graph)
    moved: dict[str, list[onnx.NodeProto]] = {}  # a Gather's output -> its replacement
    decoded_tables: set[str] = set()
    for node in graph.node:
        if node.op_type != "Gather" or node.input[0] not in inits:
            continue
        dq = only_reader(node.output[0], "DequantizeLinear")
        table = inits[node.input[0]]
        if dq is None or int(np.prod(table.dims)) > max_elements:
            continue
        if dq.input[0] != node.output[0] or not _per_tensor_params(dq, inits):
            continue
        floats = f"{table.name}_f{'_'.join(dq.input[1:])}"  # one decode per table and scale
        new = [] if floats in decoded_tables else [
            helper.make_node("DequantizeLinear", [table.name, *dq.input[1:]], [floats])
        ]  # fmt: skip
        decoded_tables.add(floats)
        new.append(helper.make_node("Gather", [floats, node.input[1]], list(dq.output),
                                    axis=attr(node, "axis", 0)))  # fmt: skip
        moved[node.output[0]] = new
        moved[dq.output[0]] = []
        done += 1
    nodes = [new for node in graph.node for new in moved.get(node.output[0], [node])]
    return _replaced(model, nodes, done)


def _scalar(name: str, inits: dict[str, onnx.TensorProto], made: dict[str, onnx.NodeProto]) -> bool:
    """A one-element constant, stored or the Mul of two stored ones (folded at load)."""
    if name in inits:
        return int(np.prod(inits[name].dims)) == 1
    node = made.get(name)
    return (
        node is not None
        and node.op_type == "Mul"
        and all(_scalar(i, inits, {}) for i in node.input)
    )


def rescaled_products(model: onnx.ModelProto) -> int:
    """MatMulInteger -> Cast -> Mul(scalar scale) [-> Add(bias)] on an input that is not quantized
    per request -> one MatMulIntegerToFloat (com.microsoft); the count rewritten.

    quantize_dynamic writes this chain where a MatMul reads rows gathered from an int8 table
    (LSAN's context fusion multiplies the history's item rows by a matrix): onnxruntime fuses the
    chain only behind a DynamicQuantizeLinear, so it ran as three or four nodes per request. The
    fused kernel multiplies the same int32 products by the same float scale and adds the same
    bias: the outputs are bit for bit those of the chain."""
    inits, made, graph = _inits(model), producers(model), model.graph
    only_reader = sole_reader(graph)
    moved: dict[str, list[onnx.NodeProto]] = {}  # first output of a replaced node -> its nodes
    done = 0
    for node in graph.node:
        a = made.get(node.input[0]) if node.op_type == "MatMulInteger" else None
        if a is None or a.op_type == "DynamicQuantizeLinear" or node.input[1] not in inits:
            continue
        cast = only_reader(node.output[0], "Cast")
        mul = only_reader(cast.output[0], "Mul") if cast is not None else None
        if cast is None or attr(cast, "to", 0) != FLOAT or mul is None:
            continue
        scale = next(i for i in mul.input if i != cast.output[0])
        if list(mul.input).count(cast.output[0]) != 1 or not _scalar(scale, inits, made):
            continue
        add = only_reader(mul.output[0], "Add")
        cols = list(inits[node.input[1]].dims)[-1:]
        bias = next((i for i in add.input if i != mul.output[0]), "") if add is not None else ""
        if not (bias in inits and list(inits[bias].dims) == cols):
            add, bias = None, ""
        one = node.output[0] + "_one"
        graph.initializer.append(numpy_helper.from_array(np.array(1.0, np.float32), one))
        zeros = [node.input[i] if len(node.input) > i else "" for i in (2, 3)]
        fused = helper.make_node(
            "MatMulIntegerToFloat", [*node.input[:2], scale, one, *zeros, *([bias] if bias else [])],
            list((add or mul).output), domain=MS,
        )  # fmt: skip
        chain = [n for n in (node, cast, mul, add) if n is not None]
        for gone in chain:  # the fused node where the chain ends: every input exists by then
            moved[gone.output[0]] = [fused] if gone is chain[-1] else []
        done += 1
    nodes = [new for node in graph.node for new in moved.get(node.output[0], [node])]
    done = _replaced(model, nodes, done)
    declare_contrib(model)
    return done


def decode(q: str, scale: str, zero: str, out: str) -> list[onnx.NodeProto]:
    """float `out` = (float(q) - zero) * scale in standard ops (zero: a float initializer, or
    "" for none), which onnxruntime folds at load when q, zero and scale are constants."""
    nodes = [helper.make_node("Cast", [q], [out + "_q"], to=FLOAT)]
    if zero:
        nodes.append(helper.make_node("Sub", [out + "_q", zero], [out + "_c"]))
    nodes.append(helper.make_node("Mul", [nodes[-1].output[0], scale], [out]))
    return nodes


def _replaced(model: onnx.ModelProto, nodes: list[onnx.NodeProto], count: int) -> int:
    """Install the rewritten node list (if anything was rewritten) and drop what became unused."""
    if count:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        prune(model)
    return count


def prune(model: onnx.ModelProto) -> None:
    """Drop nodes whose outputs nothing reads and initializers no node reads."""
    graph = model.graph
    wanted = {o.name for o in graph.output}
    kept: list[onnx.NodeProto] = []
    for node in reversed(list(graph.node)):
        if any(o in wanted for o in node.output):
            kept.append(node)
            wanted.update(i for i in node.input if i)
    kept.reverse()
    del graph.node[:]
    graph.node.extend(kept)
    used = wanted
    inits = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(inits)
