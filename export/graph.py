"""The PyTorch model -> fp32 ONNX graph of the device contract (lsan.artifact INPUTS -> OUTPUTS).

The graph is the model's inference path: left-padded history ids, their categories and time
slots, and the ids to exclude (the user's seen items; PAD entries are ignored) in; the top-K item
ids and scores (and the full masked score vector) out. Batch, history length and exclude length
are dynamic. Exported with the dynamo exporter at a pinned opset, as one file.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import helper, numpy_helper
from torch import nn

from lsan.artifact import INPUTS, NEG, OUTPUTS
from lsan.export import ExportError
from lsan.export.fold import producers, prune
from lsan.export.int4 import attr
from lsan.info import DataInfo

OPSET = 18


class InferenceGraph(nn.Module):
    """The exported path: history -> masked scores -> top-K. Works for every model's score_all."""

    def __init__(self, model: nn.Module, k: int, two_stage: bool = True):
        super().__init__()
        # a model may offer an inference form: a copy with the same numbers in fewer nodes
        form = getattr(model, "inference_form", None)
        self.model, self.k = (form() if form is not None else model), k
        self.two_stage = two_stage  # False: one TopK at any width (benchmarks/topk.py's baseline)

    def forward(self, items, cats, slots, exclude):
        scores = self.model.score_all(items, cats, slots)  # (B, |V|+1)
        # the padding column is masked here, as one more excluded id, not by score_all's copy
        # of the scores (mask_padding is a no-op under export: two passes over |V| saved); one
        # Pad node appends it (a zeros column built and concatenated took four)
        scores = scores.scatter(1, F.pad(exclude, (0, 1)), NEG)
        if self.two_stage:
            top_scores, top_items = top_k(scores, self.k)
        else:
            top_scores, top_items = torch.topk(scores, self.k, dim=1)
        return top_items, top_scores, scores


BLOCKED_FROM = 1 << 15  # catalogues from here on are ranked in two stages (see `top_k`)
# onnxruntime's costs on one core (profiled at 1M scores, us): a TopK per score, a ReduceMax per
# block row (beyond its 0.32 ns a score, paid at any block size), a Pad per score (the copy)
TOPK_US, ROW_US, COPY_US = 0.0024, 0.033, 0.00078


@functools.cache  # PyTorch runs the graph eagerly too (parity, benchmarks): once per width
def block_size(width: int, k: int) -> int:
    """Scores per block for `top_k` over `width` scores, the cheapest by the costs above: a
    divisor of the width makes the blocks a free Reshape, any other size pads the row first (a
    copy of it), so a divisor wins unless it makes the blocks very short or very long."""

    def cost(block: int) -> float:
        rows = -(-width // block)
        return rows * ROW_US + k * block * TOPK_US + (rows * block != width) * width * COPY_US

    sizes = [b for b in range(16, 4097) if width % b == 0] + [256, 512, 1024, 2048]
    return min((b for b in sizes if width >= 2 * k * b), key=cost, default=16)


def top_k_block(width: int, k: int) -> int | None:
    """The block size `top_k` ranks `width` scores with; None where it runs one TopK."""
    if width < BLOCKED_FROM:
        return None
    block = block_size(width, k)
    return block if width >= 2 * k * block else None


def top_k(scores: torch.Tensor, k: int, block: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk(scores, k, dim=1), in two stages for catalogues of `BLOCKED_FROM` ids or more.

    onnxruntime's TopK scans a 1M-score row at about 2 ns a score, over twice the time of the
    pass that computes the scores. The k best scores lie in the k blocks with the largest
    maxima (each of them is at least its block's maximum, and no block outside the k best can
    hold one: k other blocks each hold a larger score), so a ReduceMax over blocks, a TopK over
    the block maxima and one over the k chosen blocks' scores give the same items and scores.
    The chosen blocks are taken in id order, so ties break to the lower id as TopK's do. The
    width is fixed at export, so this is chosen once per artifact; below `BLOCKED_FROM` the one
    TopK is as fast or faster (an A/B on Beauty's 12,102 scores: 36 against 38 us), above it
    the ten more nodes pay for themselves (at 1M scores 2.4 ms of TopK became 0.75 ms).
    """
    batch, width = scores.shape
    block = block or top_k_block(width, k) or width
    if width < BLOCKED_FROM or width < 2 * k * block:
        return torch.topk(scores, k, dim=1)
    rows = -(-width // block)
    if rows * block != width:
        scores = F.pad(scores, (0, rows * block - width), value=-torch.inf)
    maxima = scores.reshape(batch, rows, block).amax(-1)
    # the k best blocks in id order (a TopK of the smallest ids: one node, where sort is four)
    best = maxima.topk(k, dim=1).indices.topk(k, dim=1, largest=False).values
    ids = (best.unsqueeze(-1) * block + torch.arange(block)).reshape(batch, k * block)
    top_scores, at = scores.gather(1, ids).topk(k, dim=1)
    return top_scores, ids.gather(1, at)


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


def export_fp32(
    model: nn.Module, info: DataInfo, path: Path, k: int, two_stage: bool = True
) -> None:
    graph = InferenceGraph(model, k, two_stage).eval()
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
    # the exporter's per-node stack traces would be ~40% of a small model, and they name files
    # of the exporting machine (cleared, not set empty: proto2 writes an empty string)
    for node in m.graph.node:
        del node.metadata_props[:]
        node.ClearField("doc_string")
    m.graph.ClearField("doc_string")
    m.ClearField("doc_string")
    compact_integers(m)
    vector_negations(m)
    onnx.save(m, str(path))


def _one_element(shape: onnx.NodeProto) -> bool:
    """A Shape node that returns one dimension (start and end attributes one apart)."""
    start, end = attr(shape, "start", None), attr(shape, "end", None)
    return shape.op_type == "Shape" and None not in (start, end) and end - start == 1


def vector_negations(m: onnx.ModelProto) -> int:
    """Reshape(Neg(Squeeze(Shape(x)[i:i+1])), [1]) -> Neg(Shape(x)[i:i+1]); the count rewritten.

    The exporter turns the slice start `-T` (the positions of a T-long history, see
    `layers.last_positions`) into a scalar and back into the 1-element vector Slice reads: two
    nodes per request that negate nothing the one-element Shape could not negate itself."""
    made = producers(m)
    vectors = {i.name for i in m.graph.initializer
               if list(i.dims) == [1] and abs(int(numpy_helper.to_array(i)[0])) == 1}  # fmt: skip
    done = 0
    for node in m.graph.node:
        neg = made.get(node.input[0]) if node.op_type == "Reshape" else None
        squeeze = made.get(neg.input[0]) if neg is not None and neg.op_type == "Neg" else None
        if squeeze is None or squeeze.op_type != "Squeeze" or node.input[1] not in vectors:
            continue
        shape = made.get(squeeze.input[0])
        if shape is None or not _one_element(shape):
            continue
        node.op_type = "Neg"
        node.input[:] = [shape.output[0]]
        del node.attribute[:]
        done += 1
    if done:
        prune(m)
    return done


SMALL_INTS = (np.uint8, np.int8, np.uint16, np.int16, np.int32)
INT_TYPES = (onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16)


def smallest_int(x: np.ndarray):
    """The narrowest integer type holding every value of x, or None."""
    lo, hi = (int(x.min()), int(x.max())) if x.size else (0, 0)
    return next((t for t in SMALL_INTS if lo >= np.iinfo(t).min and hi <= np.iinfo(t).max), None)


def compact_integers(m: onnx.ModelProto, min_elements: int = 256) -> None:
    """Store large integer constants in the fewest bytes that hold them, rebuilt at load.

    The exporter folds index tables (a `codes` item table's rows, stored as uint8 in the model)
    into int64 initializers: 8 bytes per entry, most of a small artifact's bytes. Each is stored
    in the smallest integer type and cast back; a 2-D table is stored row by row when that is
    smaller (a hybrid own-rows book needs int16 codes, the other books uint8), and a row that is
    mostly zero (the own-rows book: popular items only) as its nonzero positions and values,
    scattered into zeros. Every rebuilding node reads constants only, so onnxruntime folds it
    when the session loads: only the file shrinks.
    """
    kept, built = [], []
    for init in m.graph.initializer:
        if init.data_type not in INT_TYPES or int(np.prod(init.dims)) < min_elements:
            kept.append(init)
            continue
        x = numpy_helper.to_array(init)
        whole = smallest_int(x)
        if whole is None:
            kept.append(init)
            continue
        rows = _short_rows(x)
        plans = [_row_plan(r) for r in rows] if rows is not None else []
        if rows is not None and sum(b for _, b in plans) < x.size * np.dtype(whole).itemsize:
            inits, nodes = _by_rows(rows, plans, init.name, init.data_type, rows is not x)
        elif np.dtype(whole).itemsize < x.dtype.itemsize:
            inits, nodes = (
                [numpy_helper.from_array(x.astype(whole), init.name + "_small")],
                [_cast(init.name + "_small", init.name, init.data_type)],
            )
        else:
            kept.append(init)
            continue
        kept += inits
        built += nodes
    del m.graph.initializer[:]
    m.graph.initializer.extend(kept)
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(built + nodes)
    merge_identical(m)
    merge_transposed(m)


def _cast(src: str, dst: str, to: int = onnx.TensorProto.INT64) -> onnx.NodeProto:
    return helper.make_node("Cast", [src], [dst], to=to)


def _row_plan(row: np.ndarray) -> tuple[str, int]:
    """How one row is stored (dense or sparse) and its bytes."""
    dense = row.size * np.dtype(smallest_int(row)).itemsize
    nz = np.flatnonzero(row)
    if nz.size == 0:
        return "sparse", 0
    sparse = nz.size * (
        np.dtype(smallest_int(nz)).itemsize + np.dtype(smallest_int(row[nz])).itemsize
    )
    return ("sparse", sparse) if sparse < dense else ("dense", dense)


def _short_rows(x: np.ndarray) -> np.ndarray | None:
    """A 2-D table as rows along its short axis (<= 16: the books of a code table), or None."""
    if x.ndim != 2:
        return None
    return x if x.shape[0] <= 16 else x.T if x.shape[1] <= 16 else None


def _by_rows(
    x: np.ndarray, plans: list[tuple[str, int]], name: str, to: int, transposed: bool
) -> tuple[list[onnx.TensorProto], list[onnx.NodeProto]]:
    """Initializers and load-time nodes rebuilding `name` (R, C) row by row as `plans` say
    (type `to`; with `transposed`, x is the transpose of the tensor)."""
    inits, nodes, parts = [], [], []
    for r, (row, (plan, _)) in enumerate(zip(x, plans, strict=True)):
        p = f"{name}_r{r}"
        if plan == "dense":
            inits.append(numpy_helper.from_array(row[None].astype(smallest_int(row)), p + "_small"))
            nodes.append(_cast(p + "_small", p, to))
        else:
            nz = np.flatnonzero(row)
            inits += [
                numpy_helper.from_array(np.array([1, row.size], np.int64), p + "_shape"),
                numpy_helper.from_array(nz[None].astype(smallest_int(nz) or np.int32), p + "_at"),
                numpy_helper.from_array(row[nz][None].astype(smallest_int(row[nz]) or np.int32),
                                        p + "_values"),
            ]  # fmt: skip
            zeros = helper.make_node(
                "ConstantOfShape", [p + "_shape"], [p + "_zeros"],
                value=numpy_helper.from_array(np.zeros(1, helper.tensor_dtype_to_np_dtype(to))),
            )  # fmt: skip
            nodes += [zeros, _cast(p + "_at", p + "_at64"), _cast(p + "_values", p + "_v64", to),
                      helper.make_node("ScatterElements", [p + "_zeros", p + "_at64", p + "_v64"],
                                       [p], axis=1)]  # fmt: skip
        parts.append(p)
    whole = name + "_rows" if transposed else name
    nodes.append(helper.make_node("Concat", parts, [whole], axis=0))
    if transposed:
        nodes.append(helper.make_node("Transpose", [whole], [name], perm=[1, 0]))
    return inits, nodes


def merge_identical(m: onnx.ModelProto, min_bytes: int = 1024) -> None:
    """Keep one copy of initializers with equal type, shape and bytes (the exporter folds the
    same constant once per use, e.g. a code table read by the lookup and by the scoring)."""
    seen: dict[tuple, str] = {}
    rename: dict[str, str] = {}
    kept = []
    for init in m.graph.initializer:
        key = (init.data_type, tuple(init.dims), init.raw_data)
        if len(init.raw_data) >= min_bytes and key in seen:
            rename[init.name] = seen[key]
            continue
        seen.setdefault(key, init.name)
        kept.append(init)
    if not rename:
        return
    del m.graph.initializer[:]
    m.graph.initializer.extend(kept)
    for node in m.graph.node:
        node.input[:] = [rename.get(i, i) for i in node.input]


def merge_transposed(m: onnx.ModelProto, min_elements: int = 1024) -> None:
    """Store a matrix once when the exporter also folded its transpose (a tied table's `E.T`).

    For small catalogues the exporter folds the output layer's Transpose of the item table into
    a second initializer, so the table ships twice (and int8 quantizes it twice); the copy
    becomes a Transpose of the original (the one a Gather reads), which onnxruntime folds when
    the session loads.
    """
    mats = {i.name: i for i in m.graph.initializer
            if len(i.dims) == 2 and int(np.prod(i.dims)) >= min_elements}  # fmt: skip
    by_bytes = {(i.data_type, tuple(i.dims), numpy_helper.to_array(i).tobytes()): i.name
                for i in mats.values()}  # fmt: skip
    looked_up = {n.input[0] for n in m.graph.node if n.op_type == "Gather"}
    copies: dict[str, str] = {}
    for name, init in mats.items():
        if name in looked_up:  # the lookup table stays an initializer (quantizers need it so)
            continue
        key = (init.data_type, tuple(reversed(init.dims)), numpy_helper.to_array(init).T.tobytes())
        original = by_bytes.get(key)
        if original is not None and original != name and original not in copies:
            copies[name] = original
    if not copies:
        return
    kept = [i for i in m.graph.initializer if i.name not in copies]
    del m.graph.initializer[:]
    m.graph.initializer.extend(kept)
    nodes: list[onnx.NodeProto] = []
    for node in list(m.graph.node):  # each Transpose just before its first reader
        for i in node.input:
            if i in copies:
                nodes.append(helper.make_node("Transpose", [copies.pop(i)], [i], perm=[1, 0]))
        nodes.append(node)
    del m.graph.node[:]
    m.graph.node.extend(nodes)


def embed_properties(path: Path, props: dict[str, str]) -> None:
    """Replace model.onnx's metadata properties (what lsan.artifact.read checks the meta by)."""
    m = onnx.load(str(path))
    del m.metadata_props[:]
    for key, value in props.items():
        m.metadata_props.add(key=key, value=value)
    onnx.save(m, str(path))
