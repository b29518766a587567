"""Low-bit item tables: trained on their grid, shipped at their widths, decoded bit for bit."""

import json
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from conftest import loaded_graph, train_tiny
from onnx import TensorProto, helper, numpy_helper

from lsan import artifact
from lsan.checkpoint import load_model
from lsan.cli import main as lsan_main
from lsan.export import ExportError
from lsan.export.export import export
from lsan.export.lowbit import (
    PackedTable,
    decoder,
    freeze,
    integer_lookups,
    integer_scores,
    pack,
)
from lsan.models import build_model, model_config
from lsan.models.item_tables import LowBitTable
from lsan.models.rowquant import choose_exponents, dequantize_rows, quantize_rows, step_table

LOWBIT = {"dim": 16, "layers": 1, "bits": 2, "hot_rows": 40, "hot_bits": 4}


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_rows_land_on_their_grid_with_the_best_searched_step(bits):
    w = torch.randn(50, 16) * torch.linspace(0.01, 1.0, 50)[:, None]
    b = torch.full((50,), bits, dtype=torch.uint8)
    exps = choose_exponents(w, b)
    codes = quantize_rows(w, b, exps)
    assert int(codes.max()) < 2**bits
    q = dequantize_rows(codes, exps, b)
    err = (q - w).pow(2).sum(1)
    top = torch.round(8 * torch.log2(w.abs().amax(1) / (2 ** (bits - 1) - 0.5)))
    for e in range(-24, 3):  # no other step of the searched window is better
        other = (top + e).to(torch.int8)
        alt = dequantize_rows(quantize_rows(w, b, other), other, b)
        assert torch.all(err <= (alt - w).pow(2).sum(1) * (1 + 1e-6))
    # more bits, less error; the error is far below the rows' own energy
    assert err.sum() < 0.5 * w.pow(2).sum() if bits >= 2 else err.sum() < w.pow(2).sum()


def test_a_zero_row_quantizes_to_almost_zero():
    b = torch.tensor([2], dtype=torch.uint8)
    exps = choose_exponents(torch.zeros(1, 8), b)
    assert int(exps[0]) == -128
    assert dequantize_rows(quantize_rows(torch.zeros(1, 8), b, exps), exps, b).abs().max() < 1e-4


def unpack(packed: np.ndarray, bits: int, d: int) -> np.ndarray:
    """pack's inverse in numpy, value j of a byte at bit j * bits (the decoder's order)."""
    shifts = (np.arange(8 // bits) * bits).astype(np.uint8)
    return ((packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)).reshape(len(packed), -1)[
        :, :d
    ]


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_pack_then_unpack_is_the_identity(bits):
    codes = np.random.default_rng(bits).integers(0, 2**bits, size=(7, 16)).astype(np.uint8)
    packed = pack(codes, bits)
    assert packed.shape == (7, 16 * bits // 8)
    np.testing.assert_array_equal(unpack(packed, bits, 16), codes)


def _decoder_model(t: PackedTable, **kw) -> onnx.ModelProto:
    nodes, inits = decoder(t, "table", "d_", **kw)
    out = helper.make_tensor_value_info("table", TensorProto.FLOAT, list(t.values.shape))
    graph = helper.make_graph(nodes, "decode", [], [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    return model


def _decode_with_onnxruntime(t: PackedTable, **kw) -> np.ndarray:
    model = _decoder_model(t, **kw)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(["table"], {})[0]


@pytest.mark.parametrize("hot", [0, 1, 17, 64])
def test_the_onnx_decoder_rebuilds_pytorchs_table_bit_for_bit(hot):
    table = LowBitTable(63, 16, bits=2, hot_rows=hot, hot_bits=4)
    table.reset(0.05)
    counts = np.random.default_rng(hot).random(64).astype(np.float32)
    assert table.assign_hot(counts) == min(hot, 63)
    table.eval()
    with torch.no_grad():
        expected = table.matrix().clone()
    t = freeze(torch.nn.ModuleDict({"item_emb": table}))  # anything with an item_emb
    assert t is not None
    np.testing.assert_array_equal(t.values, expected.numpy())
    np.testing.assert_array_equal(_decode_with_onnxruntime(t), expected.numpy())


@pytest.mark.parametrize("hot", [0, 300])
def test_exponents_stored_as_nibbles_decode_bit_for_bit_outliers_included(hot):
    """Rows spanning 12 octaves: most exponents fall in their width's 16-step window, the rest
    (1%) are stored whole; the decoder must rebuild every row, in far fewer bytes than one
    exponent byte a row."""
    rng = np.random.default_rng(hot)
    rows = 8000
    wide = rng.random(rows) < 0.01
    scale = np.where(wide, 2.0 ** rng.uniform(-8, 4, rows), rng.uniform(0.8, 1.25, rows))
    w = torch.as_tensor(rng.standard_normal((rows, 16)) * scale[:, None], dtype=torch.float32)
    bits = torch.full((rows,), 2, dtype=torch.uint8)
    bits[rng.permutation(rows)[:hot]] = 4
    exps = choose_exponents(w, bits)
    t = PackedTable(quantize_rows(w, bits, exps).numpy(), exps.numpy(), bits.numpy())
    for group in [t.bits == b for b in np.unique(t.bits)]:  # outliers exist in every width
        counts = np.bincount(t.exps[group].astype(int) + 128)
        assert np.convolve(counts, np.ones(16, int), "valid").max() < group.sum()
    np.testing.assert_array_equal(_decode_with_onnxruntime(t, nibbles=True), t.values)
    as_bytes, as_nibbles = (_decoder_model(t, nibbles=x).ByteSize() for x in (False, True))
    assert as_bytes - as_nibbles > rows / 4
    assert _decoder_model(t).ByteSize() == as_nibbles  # the default takes the smaller
    small = _hot_table(4)  # 64 rows: the nibbles' decoder costs more than it saves
    assert _decoder_model(small).ByteSize() == _decoder_model(small, nibbles=False).ByteSize()
    np.testing.assert_array_equal(_decode_with_onnxruntime(small, nibbles=True), small.values)


def _hot_table(hot_bits: int) -> PackedTable:
    """A frozen 63-item table: 2-bit rows and 9 hot rows (the highest ids) at `hot_bits`."""
    table = LowBitTable(63, 16, bits=2, hot_rows=9, hot_bits=hot_bits)
    table.reset(0.05)
    table.assign_hot(np.arange(64, dtype=np.float32))
    t = freeze(torch.nn.ModuleDict({"item_emb": table}))
    assert t is not None
    return t


def _model(nodes, inits, graph_in, graph_out) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [graph_in], [graph_out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _dynamic_uint8(h: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """onnxruntime's DynamicQuantizeLinear of a whole tensor: (q - zero point, scale)."""
    lo, hi = min(0.0, float(h.min())), max(0.0, float(h.max()))
    scale = np.float32((hi - lo) / 255)
    zero = np.clip(np.round(-lo / scale), 0, 255)
    return np.clip(np.round(h / scale) + zero, 0, 255) - zero, scale


@pytest.mark.parametrize("hot_bits", [4, 8])
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_tied_output_layer_scores_the_integer_grid_in_one_product(hot_bits, with_bias):
    """h @ table.T [+ bias] becomes h rounded to uint8 (one scale for the tensor) times the
    table's exact integer grid, rescaled by h's scale and each item's half step, the bias
    folded into the product: exactly that arithmetic, in one DynamicQuantizeMatMul and one Mul.
    A table with 8-bit rows keeps the float path (its grid does not fit a byte)."""
    t = _hot_table(hot_bits)
    nodes, inits = decoder(t, "table", "d_")
    nodes += [helper.make_node("Transpose", ["table"], ["table_t"], perm=[1, 0]),
              helper.make_node("MatMul", ["h", "table_t"], ["mm" if with_bias else "scores"])]  # fmt: skip
    bias = np.random.default_rng(2).normal(size=64).astype(np.float32)
    if with_bias:
        inits.append(numpy_helper.from_array(bias, "bias"))
        nodes.append(helper.make_node("Add", ["mm", "bias"], ["scores"]))
    h_in = helper.make_tensor_value_info("h", TensorProto.FLOAT, ["b", 16])
    out = helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["b", 64])
    model = _model(nodes, inits, h_in, out)
    assert integer_scores(model, "table", "bias" if with_bias else None) == (hot_bits == 4)
    ops = [n.op_type for n in model.graph.node]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    h = np.random.default_rng(0).normal(size=(3, 16)).astype(np.float32)
    got = sess.run(["scores"], {"h": h})[0]
    exact = h @ t.values.T + (bias if with_bias else 0)
    if hot_bits == 8:
        assert "DynamicQuantizeMatMul" not in ops
        np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-5)
        return
    assert ops.count("DynamicQuantizeMatMul") == 1 and "Add" not in ops[-3:]
    q, scale = _dynamic_uint8(h)
    steps = step_table().numpy()[t.exps.astype(np.int64) + 128]
    lv = 2.0 ** (t.bits.astype(np.float32) - 1)
    grid = 2 * (t.codes.astype(np.float32) - lv[:, None]) + 1  # odd integers, |.| <= 15
    np.testing.assert_allclose(grid * steps[:, None] / 2, t.values, rtol=1e-6)
    want = (q @ grid.T) * scale * steps / 2 + (bias if with_bias else 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, exact, atol=np.abs(exact).max() / 50)


@pytest.mark.parametrize("hot_bits", [4, 8])
def test_row_lookups_decode_the_grid_per_request_and_no_float_table_is_left(hot_bits):
    """Gather(table, ids) becomes the gathered uint8 rows times their half steps: the float
    table's rows bit for bit, and the float table itself is pruned (1 byte a value in memory).
    A table with 8-bit rows has no grid and keeps its float lookup."""
    t = _hot_table(hot_bits)
    nodes, inits = decoder(t, "table", "d_")
    nodes.append(helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0))
    ids_in = helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "t"])
    out = helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["b", "t", 16])
    model = _model(nodes, inits, ids_in, out)
    assert integer_lookups(model, "table") == (1 if hot_bits == 4 else 0)
    made = {o for node in model.graph.node for o in node.output}
    assert ("table" in made) == (hot_bits == 8)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(1).integers(0, 64, size=(3, 7))
    np.testing.assert_array_equal(sess.run(["rows"], {"ids": ids})[0], t.values[ids])


def test_hot_rows_are_the_most_popular_items_and_cost_more_bits():
    table = LowBitTable(9, 8, bits=1, hot_rows=3, hot_bits=8)
    counts = np.array([100, 1, 5, 9, 0, 7, 2, 3, 4, 8], np.float32)  # index 0 = padding
    table.assign_hot(counts)
    assert sorted(np.flatnonzero(table.row_bits.numpy() == 8).tolist()) == [3, 5, 9]


def test_training_moves_the_float_weights_through_the_grid():
    table = LowBitTable(20, 8, bits=2)
    table.reset(0.1)
    table.train()
    before = table.weight.detach().clone()
    opt = torch.optim.SGD(table.parameters(), lr=0.5)
    loss = table.scores(torch.randn(4, 8)).logsumexp(-1).mean() - table(torch.tensor([[3]])).sum()
    loss.backward()
    assert table.weight.grad is not None and table.weight.grad.abs().sum() > 0
    opt.step()
    assert not torch.equal(before, table.weight.detach())
    table.eval()
    with torch.no_grad():  # evaluation reads the grid values, nothing else
        q = table.matrix()
    codes = quantize_rows(table.weight, table.row_bits, table.row_exps)
    torch.testing.assert_close(
        q, dequantize_rows(codes, table.row_exps, table.row_bits), rtol=0, atol=0
    )


def test_steps_are_exact_powers_of_two_on_an_eighth_octave_grid():
    s = step_table()
    assert s.shape == (256,) and s[128] == 1.0 and s[136] == 2.0 and s[120] == 0.5


@pytest.mark.parametrize("bad", [{"bits": 2, "item_table": "qr"}, {"hot_rows": 10}])
def test_low_bit_settings_that_do_not_fit_the_table_are_refused_clearly(bad):
    from lsan.models import DataInfo

    with pytest.raises(ValueError, match="model\\.(bits|hot_rows)"):
        build_model("sasrec", model_config("sasrec", {"dim": 16, **bad}), DataInfo(30, 2, 2, 8))


@pytest.fixture(scope="module")
def lowbit_ckpt(small_ds, tmp_path_factory):
    root = tmp_path_factory.mktemp("lowbit")
    return train_tiny("sasrec", LOWBIT, small_ds, root / "ck", epochs=3)


def test_a_low_bit_model_learns_and_records_its_widths(lowbit_ckpt, small_ds, tmp_path):
    metrics = json.loads((lowbit_ckpt / "metrics.json").read_text())
    assert metrics["codes"] == {"bits": 2, "hot_rows": 40, "hot_bits": 4}
    model, _, _ = load_model(lowbit_ckpt)
    bits = model.item_emb.row_bits
    assert int((bits == 4).sum()) == 40 and int(bits[0]) == 2
    # as accurate as the same model with a float table, at the same epochs: the grid costs little
    full = {k: v for k, v in LOWBIT.items() if "bits" not in k and k != "hot_rows"}
    ref = json.loads(
        (train_tiny("sasrec", full, small_ds, tmp_path / "f", 3) / "metrics.json").read_text()
    )
    assert metrics["test"]["NDCG@10"] > 0.9 * ref["test"]["NDCG@10"] > 0.05  # random: ~0.015


def test_the_lowbit_artifact_is_smaller_than_int4_and_ranks_like_pytorch(
    lowbit_ckpt, small_ds, tmp_path
):
    out = tmp_path / "art"
    meta = export(lowbit_ckpt, out, quant="auto", ds=small_ds, log=lambda *a: None,
                  formats=("fp32", "int4"), every_format=tmp_path / "all")  # fmt: skip
    checks = meta.parity
    assert {"fp32", "int4", "lowbit"} <= set(checks)
    low, int4 = checks["lowbit"], checks["int4"]
    # the table is exact; the tied output layer rounds h to uint8 (one scale for the batch, so
    # answers depend on it and are served row by row) and multiplies the table's integer grid
    assert low.error is None and low.top10_identical and not low.batch_invariant
    assert low.max_abs_score_diff < 5e-3 and low.ops.get("DynamicQuantizeMatMul") == 1
    assert low.bytes < 0.6 * checks["fp32"].bytes and int4.error is None
    assert low.test["NDCG@10"] == pytest.approx(checks["fp32"].test["NDCG@10"], rel=5e-3)
    art = artifact.read(tmp_path / "all-lowbit")
    assert art.meta.quantization == "lowbit"
    # a benchmark's copy of one format records that format's checks, as `--quant lowbit` does,
    # so the frontier measures the bytes a user's export writes (timings differ by a few digits)
    solo = export(lowbit_ckpt, tmp_path / "solo", quant="lowbit", ds=small_ds, log=lambda *a: None)
    assert set(art.meta.parity) == set(solo.parity) == {"lowbit"}
    assert abs(art.meta.artifact_bytes - solo.artifact_bytes) < 32
    # the table is stored packed: no float initializer of |V|+1 rows is left in the file
    m = onnx.load(str(tmp_path / "all-lowbit" / artifact.MODEL))
    rows = small_ds.num_items + 1
    assert not [i for i in m.graph.initializer
                if i.data_type == TensorProto.FLOAT and i.dims and i.dims[0] == rows]  # fmt: skip
    # what stores the table: 2-bit codes of the cold rows, 4-bit codes of the 40 hot ones, one
    # exponent byte a row, one mask bit a row (and a few scalars and the steps the rows use)
    dim, hot = LOWBIT["dim"], LOWBIT["hot_rows"]
    budget = (rows - hot) * dim * 2 // 8 + hot * dim // 2 + rows + rows // 8 + 1
    tensors = [onnx.numpy_helper.to_array(i) for i in m.graph.initializer]
    stored = sum(
        t.nbytes for t in tensors if t.dtype in (np.uint8, np.int8) and t.size >= rows // 8
    )
    assert budget - 64 <= stored <= budget + 64
    # decoding at load never materialises the table in int32 or float (a 10 MB peak at Beauty's
    # size): the widest intermediates of R x D values are the byte grid and its transpose
    inferred = onnx.shape_inference.infer_shapes(m).graph.value_info
    wide = [v.name for v in inferred
            if v.type.tensor_type.elem_type != TensorProto.UINT8
            and all(d.HasField("dim_value") for d in v.type.tensor_type.shape.dim)
            and np.prod([d.dim_value for d in v.type.tensor_type.shape.dim]) >= rows * dim]  # fmt: skip
    assert wide == []
    steps = [t for t in tensors if t.dtype == np.float32 and t.ndim == 1 and t.size > 1]
    assert max(t.size for t in steps) < 64  # only the steps used, not all 256
    # the scores take onnxruntime's u8u8 kernel (a uint8 grid around its zero point): an int8
    # grid takes the u8s8 one, 1.7-2.2x slower on an AVX-512 / AMX Xeon (export/lowbit.py)
    (dq,) = [n for n in m.graph.node if n.op_type == "DynamicQuantizeMatMul"]
    consts = {i.name: onnx.numpy_helper.to_array(i) for i in m.graph.initializer}
    zero = consts[dq.input[3]]
    assert zero.dtype == np.uint8 and zero.item() == 128


def test_lowbit8_is_the_same_table_and_requests_with_the_encoder_in_8_bits(small_ds, tmp_path):
    """`lowbit8` stores the encoder's one decoded-at-load matrix in 8 bits (LSAN's student at
    D = 32, whose matrices are big enough to be quantized at all): a byte and a half more for
    each two of its values, closer to PyTorch, and the same graph at run time."""
    cfg = {**LOWBIT, "dim": 32, "heads": 1}
    ck = train_tiny("lsan_full", cfg, small_ds, tmp_path / "ck", epochs=1)
    metas = {
        q: export(ck, tmp_path / q, quant=q, ds=small_ds, log=lambda *a: None)
        for q in ("lowbit", "lowbit8")
    }
    low, low8 = metas["lowbit"].parity["lowbit"], metas["lowbit8"].parity["lowbit8"]
    assert metas["lowbit8"].quantization == "lowbit8"
    assert low8.error is None and low8.top10_identical
    assert low8.max_abs_score_diff < 0.5 * low.max_abs_score_diff

    def stored(q: str) -> Counter:
        m = onnx.load(str(tmp_path / q / artifact.MODEL))
        return Counter((i.data_type, tuple(i.dims), numpy_helper.to_array(i).tobytes())
                       for i in m.graph.initializer)  # fmt: skip

    four, eight = stored("lowbit"), stored("lowbit8")
    only8 = sorted((t, d) for t, d, _ in eight - four)  # the table's tensors are in both files
    rows = only8[0][1][0]
    assert only8 == [(TensorProto.FLOAT, (rows, 1)), (TensorProto.UINT8, (rows, 1)),
                     (TensorProto.UINT8, (rows, 32))]  # scales, zero points, a byte a code  # fmt: skip
    assert {(TensorProto.UINT8, (rows, 16)), (TensorProto.FLOAT, (rows, 1))} <= {
        (t, d) for t, d, _ in four - eight
    }  # 4-bit: two codes a byte
    grown = metas["lowbit8"].model_onnx_bytes - metas["lowbit"].model_onnx_bytes
    assert 16 * rows - 600 <= grown <= 16 * rows  # less the nibble-unpacking nodes (~500 B)
    runs = [loaded_graph(tmp_path / q / artifact.MODEL, tmp_path).graph.node for q in metas]
    assert [n.op_type for n in runs[0]] == [n.op_type for n in runs[1]]


def test_a_student_with_time_on_the_residual_path_exports_to_lowbit8(small_ds, tmp_path):
    """`model.time_residual` adds a slot table to LSAN's input: the low-bit export carries it
    (stored with the encoder's weights) and ranks as PyTorch does, up to the near-ties of a
    one-epoch model (on Beauty, stop 55: top-10 overlap 1.000 in lowbit8, 0.900 in lowbit)."""
    cfg = {**LOWBIT, "dim": 32, "heads": 1, "time_residual": True}
    ck = train_tiny("lsan_full", cfg, small_ds, tmp_path / "ck", epochs=1)
    model, _, _ = load_model(ck)
    assert model.slot is not None  # the table the export must carry
    meta = export(ck, tmp_path / "art", quant="lowbit8", ds=small_ds, log=lambda *a: None)
    got = meta.parity["lowbit8"]
    assert got.error is None and got.top10_overlap >= 0.95 and got.max_abs_score_diff < 0.01
    graph = onnx.load(str(tmp_path / "art" / artifact.MODEL)).graph
    assert any(n.op_type == "Gather" and "slot" in "".join(n.input) for n in graph.node)


def test_an_export_with_nibble_exponents_scores_exactly_as_with_exponent_bytes(
    lowbit_ckpt, small_ds, tmp_path, monkeypatch
):
    """The nibbles pay only on large tables; forced on this small one, through export(), the
    file must hold no exponent byte a row and score exactly as the default one."""

    def run(name: str):
        meta = export(
            lowbit_ckpt, tmp_path / name, quant="lowbit", ds=small_ds, log=lambda *a: None
        )
        m = onnx.load(str(tmp_path / name / artifact.MODEL))
        exps = [i for i in m.graph.initializer
                if i.data_type == TensorProto.INT8 and list(i.dims) == [small_ds.num_items + 1]]  # fmt: skip
        return meta.parity["lowbit"], exps

    default, default_exps = run("bytes")
    monkeypatch.setattr("lsan.export.lowbit.NIBBLE_COST_BYTES", -(10**9))
    forced, forced_exps = run("nibbles")
    assert len(default_exps) == 1 and forced_exps == []
    assert forced.error is None and forced.top10_identical
    assert forced.max_abs_score_diff == default.max_abs_score_diff
    assert forced.test == default.test


def test_lowbit_is_refused_for_a_float_table(small_ds, tmp_path):
    ck = train_tiny("sasrec", {"dim": 16, "layers": 1}, small_ds, tmp_path / "ck", epochs=1)
    with pytest.raises(Exception, match="model.bits"):
        export(ck, tmp_path / "art", quant="lowbit", ds=small_ds, log=lambda *a: None)


def test_lowbit8_is_refused_where_it_would_be_the_lowbit_file(lowbit_ckpt, small_ds, tmp_path):
    """At D = 16 with one layer every encoder weight stays float: no second file to ship."""
    with pytest.raises(ExportError, match="lowbit8 would equal lowbit"):
        export(lowbit_ckpt, tmp_path / "art", quant="lowbit8", ds=small_ds, log=lambda *a: None)
    assert not (tmp_path / "art").exists()


def test_init_starts_from_a_checkpoint_and_a_bad_one_is_a_clear_error(
    lowbit_ckpt, small_ds, tmp_path, capsys
):
    from lsan.config import DataConfig, RunConfig, TrainConfig
    from lsan.train import train

    def run(init: str) -> RunConfig:
        return RunConfig(data=DataConfig(dataset="synthetic", max_len=12), model_name="sasrec",
                         model=model_config("sasrec", LOWBIT),
                         train=TrainConfig(epochs=1, batch_size=64, device="cpu", init=init, lr=1e-9))  # fmt: skip

    # a near-zero learning rate: the student ends where the checkpoint it started from ended
    result = train(run(str(lowbit_ckpt)), tmp_path / "again", progress=False, ds=small_ds)
    assert result["init"]["tensors"] == result["init"]["of"] - 1  # all but the row widths
    start = json.loads((lowbit_ckpt / "metrics.json").read_text())["valid"]["NDCG@10"]
    assert result["valid"]["NDCG@10"] == pytest.approx(start, abs=0.01)
    code = lsan_main(["train", "--dataset", "synthetic", "--init", str(tmp_path / "missing"),
                      "--out", str(tmp_path / "x"), "--quiet", "--set", "train.epochs=1"])  # fmt: skip
    err = capsys.readouterr().err
    assert code != 0 and "train.init" in err and "Traceback" not in err


def test_freeze_holds_the_named_parameters_and_a_prefix_naming_none_is_a_clear_error(
    lowbit_ckpt, small_ds, tmp_path, capsys
):
    """train.freeze: the table held while the encoder fine-tunes, and the reverse."""
    from lsan.checkpoint import load_model
    from lsan.config import DataConfig, RunConfig, TrainConfig
    from lsan.train import train

    start = load_model(str(lowbit_ckpt))[0].state_dict()

    def tuned(freeze: str, only: str = "") -> dict[str, torch.Tensor]:
        run = RunConfig(data=DataConfig(dataset="synthetic", max_len=12), model_name="sasrec",
                        model=model_config("sasrec", LOWBIT),
                        train=TrainConfig(epochs=2, batch_size=64, device="cpu", lr=1e-2,
                                          init=str(lowbit_ckpt), freeze=freeze, train_only=only))  # fmt: skip
        out = tmp_path / ((freeze + "-" + only).replace(",", "-").strip("-") or "none")
        train(run, out, progress=False, ds=small_ds)
        return load_model(str(out))[0].state_dict()

    def moved(sd: dict[str, torch.Tensor]) -> set[str]:
        return {k for k, v in sd.items() if v.is_floating_point() and not torch.equal(v, start[k])}

    everything = moved(tuned(""))
    assert "item_emb.weight" in everything and any(k.startswith("blocks") for k in everything)
    encoder_only = moved(tuned("item_emb"))
    assert "item_emb.weight" not in encoder_only and any(
        k.startswith("blocks") for k in encoder_only
    )
    table_only = moved(tuned("pos_emb,blocks,ln"))
    assert table_only == {"item_emb.weight"}
    assert moved(tuned("", only="ln")) == {"ln.weight", "ln.bias"}  # train.train_only
    code = lsan_main(["train", "--dataset", "synthetic", "--set", "train.freeze=blocks,nope",
                      "--out", str(tmp_path / "x"), "--quiet", "--set", "train.epochs=1"])  # fmt: skip
    err = capsys.readouterr().err
    assert code != 0 and "train.freeze: 'nope' names no parameter" in err and "Traceback" not in err
    code = lsan_main(["train", "--dataset", "synthetic", "--set", "train.train_only=nope",
                      "--out", str(tmp_path / "only"), "--quiet"])  # fmt: skip
    err = capsys.readouterr().err
    assert code != 0 and "train.train_only: 'nope' names no parameter" in err
    code = lsan_main(["train", "--dataset", "synthetic", "--set", "train.train_only=ln",
                      "--set", "train.freeze=blocks", "--out", str(tmp_path / "both"), "--quiet"])  # fmt: skip
    assert code != 0 and "set one of them" in capsys.readouterr().err


def test_a_fixed_grid_keeps_its_steps_across_epochs_and_a_refreshing_one_follows_the_weights():
    fixed, moving = LowBitTable(30, 8, 2, refresh_steps=False), LowBitTable(30, 8, 2)
    for t in (fixed, moving):
        t.reset(0.1)
        before = t.row_exps.clone()
        with torch.no_grad():
            t.weight.mul_(4.0)  # rows four times larger want steps two octaves up
        t.train()
        moved = (t.row_exps.long() - before.long())[1:]
        if t is fixed:
            assert torch.equal(t.row_exps, before)
            t.refresh()  # what a start from a checkpoint calls
            assert torch.all((t.row_exps.long() - before.long())[1:] == 16)
        else:
            assert torch.all(moved == 16)


def test_an_output_bias_trains_on_its_own_grid_and_ships_in_half_a_byte_an_item(small_ds, tmp_path):
    ck = train_tiny("sasrec", {**LOWBIT, "item_bias": True}, small_ds, tmp_path / "ck", epochs=3)
    model, _, _ = load_model(ck)
    t = model.item_emb
    four = torch.tensor([4], dtype=torch.uint8)
    on_grid = dequantize_rows(t.bias_codes()[None], t.bias_exp, four)[0]
    assert on_grid.abs().max() > 1e-3  # it learned something, on 16 levels of one step
    h = torch.randn(3, LOWBIT["dim"])
    with torch.no_grad():  # evaluation's reads (with gradients on, the straight-through sum)
        torch.testing.assert_close(t.output_bias(), on_grid, rtol=0, atol=0)
        torch.testing.assert_close(t.scores(h) - h @ t.matrix().T, on_grid.expand(3, -1))
        ids = torch.tensor([[1, 5, 9]] * 3)
        torch.testing.assert_close(t.score_ids(h, ids), t.scores(h).gather(1, ids))
    meta = export(ck, tmp_path / "art", quant="lowbit", ds=small_ds, log=lambda *a: None)
    low = meta.parity["lowbit"]
    assert low.error is None and low.top10_identical and low.max_abs_score_diff < 5e-3
    m = onnx.load(str(tmp_path / "art" / artifact.MODEL))
    rows = small_ds.num_items + 1
    assert not [i for i in m.graph.initializer
                if i.data_type == TensorProto.FLOAT and i.dims and rows in i.dims]  # fmt: skip


def test_the_bias_decoder_rebuilds_pytorchs_values_bit_for_bit():
    from lsan.export.lowbit import replace_bias

    bias = torch.randn(31) * 0.3
    four = torch.tensor([4], dtype=torch.uint8)
    exp = choose_exponents(bias[None], four)
    codes = quantize_rows(bias[None], four, exp)[0]
    t = PackedTable(np.zeros((31, 8), np.uint8), np.zeros(31, np.int8), np.full(31, 2, np.uint8),
                    codes.numpy(), int(exp[0]))  # fmt: skip
    values = dequantize_rows(codes[None], exp, four)[0].numpy()
    np.testing.assert_array_equal(t.bias_values, values)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [31])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [31])
    graph = helper.make_graph([helper.make_node("Add", ["x", "b"], ["y"])], "g", [x], [y],
                              [onnx.numpy_helper.from_array(values, "b")])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert replace_bias(model, t) == "b"
    assert not [i for i in model.graph.initializer if i.data_type == TensorProto.FLOAT and i.dims]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = sess.run(None, {"x": np.zeros(31, np.float32)})
    np.testing.assert_array_equal(out, values)


def test_a_bias_fitted_alone_keeps_the_students_grid_and_everything_else(
    lowbit_ckpt, small_ds, tmp_path
):
    """The recipe's last stage (configs/device-beauty-bias.toml): `--init STUDENT` with
    model.item_bias, model.refresh_steps=false and train.train_only=item_emb.bias."""
    from lsan.config import DataConfig, RunConfig, TrainConfig
    from lsan.train import train

    run = RunConfig(
        data=DataConfig(dataset="synthetic", max_len=12), model_name="sasrec",
        model=model_config("sasrec", {**LOWBIT, "item_bias": True, "refresh_steps": False}),
        train=TrainConfig(epochs=2, batch_size=64, device="cpu", lr=1e-2, init=str(lowbit_ckpt),
                          train_only="item_emb.bias"),
    )  # fmt: skip
    train(run, tmp_path / "bias", progress=False, ds=small_ds)
    student, _, _ = load_model(lowbit_ckpt)
    fitted, _, _ = load_model(tmp_path / "bias")
    mine, theirs = fitted.state_dict(), student.state_dict()
    assert set(mine) - set(theirs) == {"item_emb.bias", "item_emb.bias_exp"}
    for name, value in theirs.items():  # the grid too: the rows' steps as the student chose them
        torch.testing.assert_close(mine[name], value, rtol=0, atol=0, msg=name)
    assert fitted.item_emb.bias.abs().max() > 1e-3


@pytest.mark.parametrize("table", ["qr", "codes"])
def test_an_output_bias_is_refused_for_a_compositional_table(table):
    from lsan.models import DataInfo

    with pytest.raises(ValueError, match="model.item_bias needs model.item_table=full"):
        build_model("sasrec", model_config("sasrec", {"dim": 16, "item_table": table,
                                                      "item_bias": True}), DataInfo(30, 2, 2, 8))  # fmt: skip


def test_a_float_tables_output_bias_learns_and_exports_in_every_format(small_ds, tmp_path):
    cfg = {"dim": 16, "layers": 1, "item_bias": True}
    ck = train_tiny("sasrec", cfg, small_ds, tmp_path / "ck", epochs=3)
    model, _, _ = load_model(ck)
    assert model.item_emb.bias.abs().max() > 1e-3
    meta = export(ck, tmp_path / "art", quant="auto", ds=small_ds, log=lambda *a: None,
                  formats=("fp32", "int8", "int4"))  # fmt: skip
    fp32 = meta.parity["fp32"]
    assert fp32.max_abs_score_diff < 1e-4 and fp32.top10_identical
    assert all(c.error is None for c in meta.parity.values())
