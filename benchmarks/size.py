"""Size: weights, bytes on disk per format, item-embedding bytes vs the rest, format overhead.

What the device downloads and stores is the artifact (lsan/artifact.py): model.onnx (the
weights and the graph), tables.npz (the raw-id map, categories, popular items: the catalogue,
the same for every model), metadata.json and manifest.json; `artifact_bytes` counts them all. The theoretical minimum is the weight count times the format's bytes per weight; the gap
to the file is the format's overhead (graph, quantization scales, small tensors left in fp32,
and any weight stored twice, e.g. a tied table kept once for the lookup and once, transposed,
for the scoring matmul; `stored_to_weights` > 1 shows it). The item side is every weight that
grows with the catalogue (full tables, LSAN's base tables and per-item weights).
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import numpy_helper
from torch import nn

from lsan.artifact import MANIFEST, META, TABLES
from lsan.benchmarks.artifacts import Artifact
from lsan.info import DataInfo

BYTES_PER_WEIGHT = {"fp32": 4, "fp16": 2, "int8": 1, "int8-static": 1, "int4": 0.5}
ITEM_PREFIXES = ("item_emb.", "items.")


def table_sizes_of(model: nn.Module) -> list[int]:
    items = getattr(model, "items", None)
    return list(items.sizes) if items is not None else []


def weights(model: nn.Module, info: DataInfo) -> tuple[int, int]:
    """(all stored weights, those on the item side): the numbers model.pt holds."""
    total = item = 0
    for name, t in model.state_dict().items():
        total += t.numel()
        if name.startswith(ITEM_PREFIXES) or (t.dim() and t.shape[0] == info.num_items + 1):
            item += t.numel()
    return total, item


def onnx_breakdown(path, info: DataInfo, sizes: list[int]) -> dict[str, int]:
    """Initializer elements and bytes in the ONNX file, split into item side and the rest.

    Exported initializers keep the PyTorch names (with suffixes such as `_quantized`), but
    constant folding makes anonymous ones (a transposed table, LSAN's per-item weights laid out
    on the code grid), so shapes are checked too: a |V|+1 axis or the trailing code-grid shape.
    """
    grid = list(reversed(sizes))
    out = {"stored_elements": 0, "onnx_item_bytes": 0, "onnx_other_bytes": 0}
    for init in onnx.load(str(path)).graph.initializer:
        arr = numpy_helper.to_array(init)
        dims = list(init.dims)
        is_item = (
            "item_emb" in init.name
            or "items." in init.name
            or info.num_items + 1 in dims
            or (len(grid) > 1 and dims[-len(grid) :] == grid)
        )
        out["stored_elements"] += int(arr.size)
        out["onnx_item_bytes" if is_item else "onnx_other_bytes"] += int(arr.nbytes)
    return out


def artifact_size(a: Artifact) -> dict[str, Any]:
    total, item = weights(a.ckpt.model, a.ckpt.info)
    bpw = BYTES_PER_WEIGHT[a.format]
    model_bytes = a.meta.model_onnx_bytes
    onnx_split = onnx_breakdown(a.path / "model.onnx", a.ckpt.info, table_sizes_of(a.ckpt.model))
    return {
        **a.key,
        "num_items": a.ckpt.info.num_items,
        "weights": total,
        "item_weights": item,
        "other_weights": total - item,
        "model_bytes": model_bytes,  # model.onnx
        "tables_bytes": (a.path / TABLES).stat().st_size,
        "metadata_bytes": (a.path / META).stat().st_size + (a.path / MANIFEST).stat().st_size,
        "artifact_bytes": a.meta.artifact_bytes,  # every file shipped
        "theoretical_bytes": int(total * bpw),
        "theoretical_item_bytes": int(item * bpw),
        "overhead_bytes": model_bytes - int(total * bpw),
        **onnx_split,
        "stored_to_weights": round(onnx_split["stored_elements"] / max(total, 1), 3),
    }
