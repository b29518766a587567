"""Quantized constants cost nothing per request: decoders fold at load, the tied table scores int8."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from conftest import loaded_graph, train_tiny

from lsan.artifact import feeds
from lsan.checkpoint import load_model
from lsan.export.fold import foldable_decoders, integer_scoring, producers, rescaled_products
from lsan.export.graph import example_inputs, export_fp32
from lsan.export.quantize import convert

KINDS = {
    "sasrec": ("sasrec", {"dim": 16, "layers": 1}),
    "lsan": ("lsan", {"dim": 16, "m1": 0}),
    "lsan_full": ("lsan_full", {"dim": 16, "heads": 1}),
    "sasrec-pq": (
        "sasrec",
        {"dim": 16, "layers": 1, "item_table": "pq", "tables": 4, "code_size": 16},
    ),  # fmt: skip
}


@pytest.fixture(scope="module")
def graphs(small_ds, tmp_path_factory):
    out = {}
    for key, (name, cfg) in KINDS.items():
        root = tmp_path_factory.mktemp(key)
        model, _, info = load_model(train_tiny(name, cfg, small_ds, root / "ck"))
        export_fp32(model, info, root / "fp32.onnx", 20)
        convert(root / "fp32.onnx", root / "int8.onnx", "int8", [])
        out[key] = (root, info)
    return out


@pytest.mark.parametrize("key", list(KINDS))
def test_nothing_is_decoded_per_request(key, graphs, tmp_path):
    root, _ = graphs[key]
    m = onnx.load(str(root / "int8.onnx"))
    inits = {i.name for i in m.graph.initializer}
    assert not [n for n in m.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    run = loaded_graph(root / "int8.onnx", tmp_path)
    size = {i.name: int(np.prod(i.dims)) for i in run.graph.initializer}
    constant_only = [n.op_type for n in run.graph.node
                     if n.input and all(i in size for i in n.input if i)
                     and max(size[i] for i in n.input if i) >= 64]  # fmt: skip
    assert constant_only == []  # no tensor is decoded again per request (scalar shape ops aside)


def test_sasrec_tied_table_scores_in_int8(graphs):
    root, info = graphs["sasrec"]
    m = onnx.load(str(root / "int8.onnx"))
    float_matmuls = [n for n in m.graph.node if n.op_type == "MatMul"]
    inits = {i.name: i for i in m.graph.initializer}
    (table,) = [i for i in m.graph.initializer if list(i.dims) == [info.num_items + 1, 16]]
    assert table.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)  # 8-bit, once
    readers = [n.op_type for n in m.graph.node if table.name in n.input]
    assert sorted(readers) == ["Gather", "Transpose"]  # lookup, and the folded scoring weight
    # the only float MatMuls left multiply activations by activations (attention)
    assert all(i not in inits for n in float_matmuls for i in n.input)


@pytest.mark.parametrize("key", list(KINDS))
def test_int8_answers_stay_close_to_fp32(key, graphs):
    root, info = graphs[key]
    x = feeds(*example_inputs(info, batch=6, length=10, seed=5))
    ref = ort.InferenceSession(str(root / "fp32.onnx"), providers=["CPUExecutionProvider"])
    got = ort.InferenceSession(str(root / "int8.onnx"), providers=["CPUExecutionProvider"])
    (rs,) = ref.run(["scores"], x)
    (gs,) = got.run(["scores"], x)
    live = rs > -1e8
    assert np.array_equal(live, gs > -1e8)  # the same items excluded
    spread = rs[live].std()
    assert np.abs(gs[live] - rs[live]).max() < 0.25 * spread
    top_r, top_g = np.argsort(-rs, 1)[:, :10], np.argsort(-gs, 1)[:, :10]
    overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(top_r, top_g, strict=True)])
    assert overlap >= 0.7


def test_rewrites_are_exact_on_a_hand_built_graph():
    """h @ dequant(Wq).T as MatMulInteger equals the float product up to h's int8 rounding."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    wq = rng.integers(-127, 128, (50, 8)).astype(np.int8)
    scale = np.array(0.01, np.float32)
    zero = np.array(0, np.int8)
    f = onnx.TensorProto.FLOAT
    g = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["w"]),
         helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
         helper.make_node("MatMul", ["h", "wt"], ["y"]),
         helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["w2"]),
         helper.make_node("Identity", ["w2"], ["table"])],
        "g", [helper.make_tensor_value_info("h", f, [None, 8])],
        [helper.make_tensor_value_info("y", f, [None, 50]),
         helper.make_tensor_value_info("table", f, [50, 8])],
        [numpy_helper.from_array(wq, "wq"), numpy_helper.from_array(scale, "s"),
         numpy_helper.from_array(zero, "z")],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    assert integer_scoring(m) == 1 and foldable_decoders(m) == 1
    ops = [n.op_type for n in m.graph.node]
    assert "MatMulInteger" in ops and "DequantizeLinear" not in ops and "MatMul" not in ops
    h = rng.normal(size=(3, 8)).astype(np.float32)
    y, table = ort.InferenceSession(m.SerializeToString()).run(None, {"h": h})
    w = wq.astype(np.float32) * scale
    np.testing.assert_allclose(table, w, rtol=0, atol=0)
    step = (h.max() - min(h.min(), 0)) / 255  # the activation's int8 step
    assert np.abs(y - h @ w.T).max() <= step * np.abs(w).sum(1).max()
    assert np.abs(y - h @ w.T).max() > 0  # it is the integer product, not the float one


def test_pq_table_scores_like_its_matrix():
    from lsan.models.item_tables import TableConfig, build_item_table

    t = build_item_table(TableConfig(item_table="pq", tables=4, code_size=8), 60, 16)
    t.reset(0.1)
    h = torch.randn(5, 16)
    m = t.matrix()
    torch.testing.assert_close(t.scores(h), h @ m.T)
    ids = torch.randint(1, 61, (5, 7))
    torch.testing.assert_close(t.score_ids(h, ids), (h @ m.T).gather(1, ids))
    items = torch.randint(0, 61, (2, 6))
    torch.testing.assert_close(t(items), m[items] * (items != 0)[..., None])
    assert [p.shape[1] for p in t.tables] == [4, 4, 4, 4]  # each book is D / N wide
    with pytest.raises(ValueError, match="multiple of tables"):
        build_item_table(TableConfig(item_table="pq", tables=3), 60, 16)


@pytest.mark.parametrize("layout", ["books x items int64", "items x books int16"])
def test_code_tables_are_stored_row_by_row_and_sparse(layout):
    """uint8 books beside an int16 own-rows book that is mostly zero: each book in its own form."""
    from onnx import helper, numpy_helper

    from lsan.export.graph import compact_integers

    rng = np.random.default_rng(0)
    v = 5000
    own = np.where(rng.random(v) < 0.1, rng.integers(1, 1001, v), 0)
    codes = np.stack([rng.integers(0, 256, v), rng.integers(0, 256, v), own]).astype(np.int64)
    if layout.startswith("items"):  # the model's own buffer: (|V|+1, N) int16
        codes = codes.T.astype(np.int16)
    elem = onnx.helper.np_dtype_to_tensor_dtype(codes.dtype)
    out = helper.make_tensor_value_info("y", elem, list(codes.shape))
    g = helper.make_graph([helper.make_node("Identity", ["c"], ["y"])], "g", [], [out],
                          [numpy_helper.from_array(codes, "c")])  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    compact_integers(m)
    stored = sum(len(i.raw_data) for i in m.graph.initializer)
    assert stored <= 2 * v + 4 * int((own > 0).sum()) + 64  # uint8 rows + (int16, int16) pairs
    (y,) = ort.InferenceSession(m.SerializeToString()).run(None, {})
    assert y.dtype == codes.dtype
    np.testing.assert_array_equal(y, codes)


def test_small_lookup_tables_are_decoded_at_load(graphs, tmp_path):
    """LSAN's context tables (categories, time slots) are gathered as floats decoded once at
    load, not as int8 rows dequantized on every request; the item table keeps its int8 rows."""
    root, _ = graphs["lsan"]
    run = loaded_graph(root / "int8.onnx", tmp_path)
    size = {i.name: int(np.prod(i.dims)) for i in run.graph.initializer}
    gathered = {
        n.output[0]: size.get(n.input[0], 0) for n in run.graph.node if n.op_type == "Gather"
    }
    dequantized = [gathered[n.input[0]] for n in run.graph.node
                   if n.op_type == "DequantizeLinear" and n.input[0] in gathered]  # fmt: skip
    assert all(s > 4096 for s in dequantized)  # only an item table's rows (none this small here)
    small = [s for s in gathered.values() if 0 < s <= 4096]
    assert len(small) >= 2  # the category and time-slot tables, now float lookups


def test_the_positions_start_is_negated_as_a_vector():
    """Shape -> Squeeze -> Neg -> Reshape([1]) before a Slice becomes Shape -> Neg: the same
    rows at every history length, two nodes fewer."""
    from onnx import TensorProto, helper, numpy_helper

    from lsan.export.graph import vector_negations

    table = np.arange(50 * 4, dtype=np.float32).reshape(50, 4)
    nodes = [
        helper.make_node("Shape", ["x"], ["t"], start=1, end=2),
        helper.make_node("Squeeze", ["t"], ["ts"]),
        helper.make_node("Neg", ["ts"], ["nt"]),
        helper.make_node("Reshape", ["nt", "one"], ["start"]),
        helper.make_node("Slice", ["table", "start", "big", "zero"], ["y"]),
    ]
    inits = [numpy_helper.from_array(table, "table"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([2**62], np.int64), "big"),
             numpy_helper.from_array(np.array([0], np.int64), "zero")]  # fmt: skip
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.INT64, ["b", "t"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], inits,
    )  # fmt: skip
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    before = m.SerializeToString()
    assert vector_negations(m) == 1
    assert [n.op_type for n in m.graph.node] == ["Shape", "Neg", "Slice"]
    onnx.checker.check_model(m, full_check=True)
    for t in (1, 7, 50):
        x = np.zeros((2, t), np.int64)
        (want,) = ort.InferenceSession(before).run(None, {"x": x})
        (got,) = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})
        np.testing.assert_array_equal(got, table[-t:])
        np.testing.assert_array_equal(got, want)


def test_exported_graphs_have_no_scalar_detour(graphs):
    """Every exported graph reads the positions' start from the Shape directly."""
    for root, _ in graphs.values():
        m = onnx.load(str(root / "fp32.onnx"))
        made = producers(m)
        negs = [n for n in m.graph.node if n.op_type == "Neg"]
        assert negs and all(made[n.input[0]].op_type == "Shape" for n in negs)


def _rescaled_chain(p: str, a: str, bias: bool) -> list[onnx.NodeProto]:
    """MatMulInteger(a, wq) -> Cast -> Mul(sa * sw) [-> Add(b)] as quantize_dynamic writes it."""
    from onnx import helper

    out = p + "y" if bias else p + "out"
    nodes = [helper.make_node("MatMulInteger", [a, "wq", p + "az", "wz"], [p + "i"]),
             helper.make_node("Cast", [p + "i"], [p + "f"], to=onnx.TensorProto.FLOAT),
             helper.make_node("Mul", [p + "as", "ws"], [p + "s"]),
             helper.make_node("Mul", [p + "f", p + "s"], [out])]  # fmt: skip
    if bias:
        nodes.append(helper.make_node("Add", [out, "b"], [p + "out"]))
    return nodes


def test_rescaled_products_are_bit_exact_on_a_hand_built_graph():
    """Gathered int8 rows times an int8 matrix, with and without a bias, fuse into one kernel
    each with the same bits; a product behind DynamicQuantizeLinear is left to onnxruntime."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    f, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    consts = {"tq": rng.integers(-127, 128, (20, 8)).astype(np.int8),
              "wq": rng.integers(-127, 128, (8, 6)).astype(np.int8),
              "gaz": np.array(3, np.int8), "hgaz": np.array(3, np.int8), "wz": np.array(0, np.int8),
              "gas": np.array(0.013, np.float32), "hgas": np.array(0.017, np.float32),
              "ws": np.array(0.021, np.float32), "b": rng.normal(size=6).astype(np.float32)}  # fmt: skip
    nodes = [helper.make_node("Gather", ["tq", "ids"], ["rows"], axis=0),
             *_rescaled_chain("g", "rows", bias=True), *_rescaled_chain("hg", "rows", bias=False),
             helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "dqs", "dqz"]),
             helper.make_node("MatMulInteger", ["xq", "wq", "dqz", "wz"], ["di"]),
             helper.make_node("Cast", ["di"], ["df"], to=f),
             helper.make_node("Mul", ["dqs", "ws"], ["ds"]),
             helper.make_node("Mul", ["df", "ds"], ["dout"])]  # fmt: skip
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("ids", i64, [None, 5]),
         helper.make_tensor_value_info("x", f, [None, 8])],
        [helper.make_tensor_value_info("gout", f, [None, 5, 6]),
         helper.make_tensor_value_info("hgout", f, [None, 5, 6]),
         helper.make_tensor_value_info("dout", f, [None, 6])],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 9
    feeds_ = {"ids": rng.integers(0, 20, (3, 5)), "x": rng.normal(size=(3, 8)).astype(np.float32)}
    before = ort.InferenceSession(m.SerializeToString()).run(None, feeds_)
    assert rescaled_products(m) == 2
    ops = [n.op_type for n in m.graph.node]
    assert ops.count("MatMulIntegerToFloat") == 2 and ops.count("MatMulInteger") == 1
    assert "Add" not in ops  # the bias went into the fused kernel
    onnx.checker.check_model(m, full_check=True)
    after = ort.InferenceSession(m.SerializeToString()).run(None, feeds_)
    for want, got in zip(before, after, strict=True):
        np.testing.assert_array_equal(got, want)


def test_lsan_int8_context_product_is_one_kernel(graphs, tmp_path):
    """LSAN_full's context fusion multiplies gathered int8 item rows (LSAN as published
    combines float rows first): that product runs as MatMulIntegerToFloat, and no MatMulInteger
    -> Cast chain is left outside a dynamic quantization (int8 file and the graph onnxruntime
    runs)."""
    root, _ = graphs["lsan_full"]
    for m in (onnx.load(str(root / "int8.onnx")), loaded_graph(root / "int8.onnx", tmp_path)):
        made = producers(m)
        ops = [n.op_type for n in m.graph.node]
        left = [n for n in m.graph.node if n.op_type == "MatMulInteger"
                and made[n.input[0]].op_type != "DynamicQuantizeLinear"]  # fmt: skip
        assert "MatMulIntegerToFloat" in ops and left == []


def test_lsan_injection_bias_runs_inside_the_gelu(graphs, tmp_path):
    """LSAN_full's context injection adds its bias last, beside the GeLU, so onnxruntime runs
    the pair as one BiasGelu. fp32: the injection's and the FFN's, no plain Gelu left; int8: the
    injection's (the FFN's bias is inside its DynamicQuantizeMatMul, so its Gelu stays plain)."""
    root, _ = graphs["lsan_full"]
    for name, fused in (("fp32.onnx", 2), ("int8.onnx", 1)):
        ops = [n.op_type for n in loaded_graph(root / name, tmp_path).graph.node]
        assert ops.count("BiasGelu") == fused and ops.count("Gelu") == 2 - fused, (name, ops)
