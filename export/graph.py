"""The PyTorch model -> fp32 ONNX graph of the device contract (lsan.artifact INPUTS -> OUTPUTS).

The graph is the model's inference path: left-padded history ids, their categories and time
slots, and the ids to exclude (the user's seen items; PAD entries are ignored) in; the top-K item
ids and scores (and the full masked score vector) out. Batch, history length and exclude length
are dynamic. Exported with the dynamo exporter at a pinned opset, as one file.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from lsan.artifact import INPUTS, NEG, OUTPUTS
from lsan.export import ExportError
from lsan.info import DataInfo

OPSET = 18


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
    # the exporter's per-node stack traces would be ~40% of a small model, and they name files
    # of the exporting machine
    for node in m.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    m.graph.doc_string = m.doc_string = ""
    compact_integers(m)
    onnx.save(m, str(path))


def compact_integers(m: onnx.ModelProto, min_elements: int = 256) -> None:
    """Store large int64 constants in the smallest type that holds them, cast back at load.

    The exporter folds index tables (a `codes` item table's rows, stored as uint8 in the model)
    into int64 initializers: 8 bytes per entry, most of a small artifact's bytes. A Cast of an
    initializer is folded by onnxruntime when the session loads, so only the file shrinks.
    """
    from onnx import helper, numpy_helper

    kept, casts = [], []
    for init in m.graph.initializer:
        if init.data_type != onnx.TensorProto.INT64 or int(np.prod(init.dims)) < min_elements:
            kept.append(init)
            continue
        x = numpy_helper.to_array(init)
        small = next((t for t in (np.uint8, np.int8, np.uint16, np.int16, np.int32)
                      if x.min() >= np.iinfo(t).min and x.max() <= np.iinfo(t).max), None)  # fmt: skip
        if small is None:
            kept.append(init)
            continue
        kept.append(numpy_helper.from_array(x.astype(small), init.name + "_small"))
        casts.append(helper.make_node("Cast", [init.name + "_small"], [init.name],
                                      to=onnx.TensorProto.INT64))  # fmt: skip
    del m.graph.initializer[:]
    m.graph.initializer.extend(kept)
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(casts + nodes)
    merge_identical(m)


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


def embed_properties(path: Path, props: dict[str, str]) -> None:
    """Replace model.onnx's metadata properties (what lsan.artifact.read checks the meta by)."""
    m = onnx.load(str(path))
    del m.metadata_props[:]
    for key, value in props.items():
        m.metadata_props.add(key=key, value=value)
    onnx.save(m, str(path))
