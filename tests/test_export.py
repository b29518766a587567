"""Export tiny trained models of each kind and check the artifact against PyTorch."""

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from conftest import REPO, train_tiny

from lsan.artifact import MANIFEST, META, MODEL, NEG, TABLES, feeds, is_artifact, read
from lsan.checkpoint import load_model
from lsan.export import ExportError, graph
from lsan.export.export import export, main
from lsan.export.graph import InferenceGraph, example_inputs
from lsan.export.quantize import AUTO_FORMATS
from lsan.models.layers import NEG as MODEL_NEG

KINDS = {
    "sasrec": {"dim": 16, "layers": 1},
    "lsan": {"dim": 16, "m1": 0},
    # a wider feed-forward than the paper's, the time slots also added to the input
    "lsan_full": {"dim": 16, "ffn_mult": 2, "time_residual": True},
}
FILES = sorted([MANIFEST, META, MODEL, TABLES])


@pytest.fixture(scope="module")
def checkpoints(small_ds, tmp_path_factory):
    out = {}
    for name, cfg in KINDS.items():
        out[name] = train_tiny(name, cfg, small_ds, tmp_path_factory.mktemp(name))
    return out


@pytest.fixture(scope="module")
def artifacts(checkpoints, small_ds, tmp_path_factory):
    root = tmp_path_factory.mktemp("artifacts")
    return {
        name: (root / name, export(ck, root / name, k=20, ds=small_ds, log=lambda *_: None))
        for name, ck in checkpoints.items()
    }


@pytest.mark.parametrize("name", list(KINDS))
def test_artifact_matches_pytorch(name, checkpoints, artifacts):
    path, meta = artifacts[name]
    assert sorted(p.name for p in path.iterdir()) == FILES
    opened = read(path)
    assert opened.meta == meta
    fp32 = meta.parity["fp32"]
    assert fp32.max_abs_score_diff <= 1e-4 and fp32.top10_identical and fp32.batch_invariant
    assert set(meta.parity) == set(AUTO_FORMATS)  # every auto format was tried (int4 too)
    # the shipped artifact reproduces PyTorch's recommendations on a fresh batch
    model, _, info = load_model(checkpoints[name])
    x = example_inputs(info, batch=5, length=9, seed=7)
    with torch.no_grad():
        ref_top, ref_scores, _ = InferenceGraph(model, 20)(*x)
    sess = ort.InferenceSession(str(path / MODEL), providers=["CPUExecutionProvider"])
    top, scores = sess.run(["top_items", "top_scores"], feeds(*x))
    overlap = np.mean(
        [len(set(a[:10]) & set(b[:10])) / 10 for a, b in zip(top, ref_top.numpy(), strict=True)]
    )
    assert overlap >= 0.9
    assert not set(top[0].tolist()) & set(x[3][0].tolist())  # excluded items never come back
    if meta.quantization == "fp32":
        assert np.allclose(scores, ref_scores.numpy(), atol=1e-4)
    # test metrics of this exact artifact are recorded, and close to PyTorch's
    assert meta.test_metrics["NDCG@10"] == pytest.approx(
        meta.test_metrics_pytorch["NDCG@10"], rel=0.02, abs=2e-3
    )
    assert meta.contract.k == 20 and len(opened.tables.raw_item_ids) == info.num_items + 1
    assert meta.batch_invariant == meta.parity[meta.quantization].batch_invariant
    props = {p.key: p.value for p in onnx.load(str(path / MODEL)).metadata_props}
    assert props["lsan.model"] == name and props["lsan.num_items"] == str(info.num_items)


def test_sizes_count_every_file_and_tables_are_binary(artifacts):
    path, meta = artifacts["sasrec"]
    assert meta.artifact_bytes == sum(p.stat().st_size for p in path.iterdir())
    assert meta.model_onnx_bytes == (path / MODEL).stat().st_size
    text = (path / META).read_text()
    assert "raw_item_ids" not in text and "popular_items" not in text  # ids live in tables.npz
    opened = read(path)
    with np.load(path / TABLES) as npz:  # raw ids as differences, in the narrowest type
        assert npz["raw_item_ids_diff"].itemsize <= 2
        assert np.array_equal(np.cumsum(npz["raw_item_ids_diff"]), opened.tables.raw_item_ids)


def test_nothing_shipped_names_the_exporting_machine(artifacts, checkpoints):
    """No absolute path of the exporting machine (checkpoint, repo, home, temp) in any file."""
    roots = {str(Path(checkpoints["sasrec"]).resolve().parent), str(REPO), os.path.expanduser("~"),
             "/tmp/", str(Path(artifacts["sasrec"][0]).resolve().parent)}  # fmt: skip
    for name in KINDS:
        path, meta = artifacts[name]
        assert meta.source.checkpoint == Path(checkpoints[name]).name
        for f in path.iterdir():
            data = f.read_bytes()
            for root in roots:
                assert root.encode() not in data, (f.name, root)


def test_shipped_graph_writes_nothing_onnxruntime_does_not_read(artifacts):
    """No node name or doc string (cleared, not set empty: proto2 writes an empty string), no
    exporter notes on the graph's inputs and outputs; the model-level contract stays."""
    for name in KINDS:
        m = onnx.load(str(artifacts[name][0] / MODEL))
        assert not [n for n in m.graph.node if n.HasField("name") or n.HasField("doc_string")]
        assert not [v.name for v in (*m.graph.input, *m.graph.output) if v.metadata_props]
        assert {p.key for p in m.metadata_props} >= {"lsan.model", "lsan.k", "lsan.max_len"}


def test_graph_and_models_agree_on_the_masked_score():
    assert NEG == MODEL_NEG


def test_dynamic_batch_and_length(artifacts, checkpoints):
    path, _ = artifacts["lsan"]
    _, _, info = load_model(checkpoints["lsan"])
    sess = ort.InferenceSession(str(path / MODEL), providers=["CPUExecutionProvider"])
    for b, t in [(1, 1), (1, info.max_len), (7, 3)]:
        top = sess.run(["top_items"], feeds(*example_inputs(info, batch=b, length=t)))[0]
        assert top.shape == (b, 20)


def test_lsan_graph_never_holds_a_full_item_matrix(artifacts, checkpoints):
    """No |V| x D initializer or intermediate anywhere in the compositional LSAN graph."""
    _, _, info = load_model(checkpoints["lsan"])
    v, d = info.num_items + 1, KINDS["lsan"]["dim"]
    for name in ("lsan", "lsan_full"):
        model = onnx.shape_inference.infer_shapes(onnx.load(str(artifacts[name][0] / MODEL)))
        g = model.graph
        shapes = [list(i.dims) for i in g.initializer]
        shapes += [[dim.dim_value for dim in vi.type.tensor_type.shape.dim] for vi in g.value_info]
        full = [s for s in shapes if v in s and d in s]
        if name == "lsan":
            assert not full, full
        else:  # the check can fail: the full-table variant does hold one
            assert full


def test_only_a_compositional_lsan_exports_the_fusion_softmax(artifacts):
    """Two base vectors are fused by a softmax; one (LSAN_full) needs none (lsan/models/lsan.py).
    The self-attention runs fused, so any Softmax left is the fusion's."""
    for name, fused in (("lsan", True), ("lsan_full", False)):
        ops = [n.op_type for n in onnx.load(str(artifacts[name][0] / MODEL)).graph.node]
        assert ("Softmax" in ops) == fused, name


def test_missing_parent_folders_are_made(checkpoints, tmp_path):
    """The README's `lsan export ... --out artifacts/x` on a fresh clone, where artifacts/ is not."""
    out = tmp_path / "artifacts" / "deeper" / "a"
    assert main([str(checkpoints["lsan"]), "--out", str(out), "--no-eval"]) == 0
    assert is_artifact(out)


def test_bad_inputs_are_clear_and_leave_nothing(checkpoints, tmp_path, capsys):
    assert main([str(tmp_path / "nope"), "--out", str(tmp_path / "a")]) == 1
    assert "not a checkpoint" in capsys.readouterr().err
    (tmp_path / "file").write_text("not a folder")
    assert main([str(checkpoints["lsan"]), "--out", str(tmp_path / "file" / "a"), "--no-eval"]) == 1
    assert "cannot make the output folder" in capsys.readouterr().err
    with pytest.raises(ExportError, match="unknown quantization"):
        export(checkpoints["lsan"], tmp_path / "b", quant="int3")
    assert not (tmp_path / "a").exists() and not list(tmp_path.glob(".*.export-*"))


def test_failed_check_refuses_unless_forced(checkpoints, small_ds, tmp_path):
    # a max-drop below zero cannot be met by a quantized format: the export must refuse
    with pytest.raises(ExportError, match="verification failed"):
        export(checkpoints["sasrec"], tmp_path / "a", quant="int8", max_drop=-1.0, ds=small_ds,
               log=lambda *_: None)  # fmt: skip
    assert not (tmp_path / "a").exists() and not list(tmp_path.glob(".*"))
    meta = export(checkpoints["sasrec"], tmp_path / "a", quant="int8", max_drop=-1.0, force=True,
                  ds=small_ds, log=lambda *_: None)  # fmt: skip
    assert meta.verification_problems and read(tmp_path / "a").meta == meta


def test_ae_artifact_matches_pytorch_at_every_length(small_ds, tmp_path):
    """An AE model appends [MASK] and drops the oldest item only at max_len: in ONNX too."""
    ck = train_tiny("bert4rec", {"dim": 16, "layers": 1}, small_ds, tmp_path / "ck", epochs=1)
    export(ck, tmp_path / "art", quant="fp32", k=20, ds=small_ds, log=lambda *_: None)
    model, _, info = load_model(ck)
    sess = ort.InferenceSession(str(tmp_path / "art" / MODEL), providers=["CPUExecutionProvider"])
    for length in (5, info.max_len):
        x = example_inputs(info, batch=4, length=length, seed=length)
        with torch.no_grad():
            _, ref, _ = InferenceGraph(model, 20)(*x)
        (scores,) = sess.run(["top_scores"], feeds(*x))
        assert np.allclose(scores, ref.numpy(), atol=1e-4), length


@pytest.mark.parametrize(
    ("name", "cfg", "fused"),
    [
        ("sasrec", {"dim": 16, "layers": 2, "heads": 2}, 2),  # one causal, one last-query node
        ("lsan", {"dim": 16, "m1": 0, "layers": 2}, 2),  # 2 full-width heads beside the conv
        # the context switched off: all of it folded into the injection's bias, nothing added
        ("lsan", {"dim": 16, "item_table": "full", "use_category": False, "use_time": False}, 1),
        ("local", {"dim": 16, "layers": 2}, 0),  # a window onnxruntime cannot express
    ],
)
def test_attention_runs_fused_in_onnx_and_matches_pytorch(name, cfg, fused, small_ds, tmp_path):
    """Causal and bidirectional attention export as onnxruntime's MultiHeadAttention (no T x T
    mask left), a local window as the written-out chain; both match PyTorch at every
    length, left padding and an empty history (a row whose queries are all padding) included."""
    ck = train_tiny(name, cfg, small_ds, tmp_path / "ck", epochs=1)
    export(ck, tmp_path / "art", quant="fp32", k=20, ds=small_ds, log=lambda *_: None)
    ops = [n.op_type for n in onnx.load(str(tmp_path / "art" / MODEL)).graph.node]
    assert ops.count("MultiHeadAttention") == fused
    assert ("LessOrEqual" in ops) == (fused == 0)  # the T x T mask's test of positions
    assert "Gelu" in ops and "Erf" not in ops  # one node onnxruntime fuses with its bias
    if name == "lsan":  # integer qr codes, no context constant broadcast, no conv size sums
        assert "Floor" not in ops and "Expand" not in ops and "Max" not in ops
    model, _, info = load_model(ck)
    sess = ort.InferenceSession(str(tmp_path / "art" / MODEL), providers=["CPUExecutionProvider"])
    for length in (1, 4, info.max_len):
        x = example_inputs(info, batch=4, length=length, seed=length)
        x[0][1] = 0  # an empty history
        with torch.no_grad():
            _, ref, ref_scores = InferenceGraph(model, 20)(*x)
        scores, all_scores = sess.run(["top_scores", "scores"], feeds(*x))
        assert np.isfinite(all_scores).all()
        assert np.allclose(scores, ref.numpy(), atol=1e-4), length
        assert np.allclose(all_scores, ref_scores.numpy(), atol=1e-4), length


def test_padding_column_is_masked_without_a_pad_in_exclude(artifacts, checkpoints):
    """The graph masks item 0 itself (one more excluded id, no copy of the scores): an exclude
    list without a 0 still never gets item 0 back, and its score is NEG."""
    for name in ("sasrec", "lsan"):
        path, _ = artifacts[name]
        _, _, info = load_model(checkpoints[name])
        items, cats, slots, _ = example_inputs(info, batch=3, length=6)
        exclude = items[:, -1:].clone()  # one real item each, no PAD
        sess = ort.InferenceSession(str(path / MODEL), providers=["CPUExecutionProvider"])
        top, scores = sess.run(["top_items", "scores"], feeds(items, cats, slots, exclude))
        assert (scores[:, 0] == NEG).all() and (top != 0).all()
        assert (scores[np.arange(3), exclude[:, 0].numpy()] == NEG).all()
        ops = [n.op_type for n in onnx.load(str(path / MODEL)).graph.node]
        assert ops.count("ScatterElements") == 1


class TopK(torch.nn.Module):
    """graph.top_k alone, for exporting it with a chosen block size."""

    def __init__(self, k: int, block: int):
        super().__init__()
        self.k, self.block = k, block

    def forward(self, scores):
        return graph.top_k(scores, self.k, self.block)


@pytest.mark.parametrize("width, block", [(2400, 48), (2413, 64)])  # a divisor; a padded row
def test_blocked_top_k_finds_what_one_topk_finds(width, block, monkeypatch, tmp_path):
    monkeypatch.setattr(graph, "BLOCKED_FROM", 1)
    g = torch.Generator().manual_seed(width)
    scores = torch.randperm(3 * width, generator=g).float().reshape(3, width)  # no ties
    scores[:, ::5] = NEG  # excluded items
    values, items = graph.top_k(scores, 10, block)
    ref_values, ref_items = torch.topk(scores, 10, dim=1)
    assert torch.equal(values, ref_values) and torch.equal(items, ref_items)
    # in onnxruntime, with ties: the same order as its one TopK (the lower id first)
    tied = torch.round(torch.rand(3, width, generator=g) * 300)  # a tie or two in each top-10
    tied[1] = NEG  # a row with nothing left to rank
    blocked, plain = tmp_path / "blocked.onnx", tmp_path / "plain.onnx"
    for module, path in ((TopK(10, block), blocked), (TopK(10, width), plain)):
        torch.onnx.export(module.eval(), (tied,), str(path), dynamo=True, opset_version=18,
                          input_names=["scores"], verbose=False)  # fmt: skip
    ops = {p: [n.op_type for n in onnx.load(str(p)).graph.node] for p in (blocked, plain)}
    assert "ReduceMax" in ops[blocked] and ops[plain] == ["TopK"]
    x = {"scores": tied.numpy()}
    got, want = (ort.InferenceSession(str(p)).run(None, x) for p in (blocked, plain))
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    order = np.lexsort((np.arange(width)[None].repeat(3, 0), -tied.numpy()), axis=1)[:, :10]
    assert np.array_equal(want[1], order)  # ties broken to the lower id, as the spec says


def test_block_size_prefers_a_divisor_and_always_fits():
    assert graph.block_size(1_000_001, 20) == 101  # 101 x 9,901: no padding copy
    for width in (32_768, 100_001, 999_983, 2_000_001):  # 999,983 is prime: padded
        block = graph.block_size(width, 20)
        assert block >= 16 and width >= 40 * block
    assert graph.block_size(999_983, 20) in (256, 512, 1024, 2048)


def test_blocked_export_answers_as_the_one_topk_export(checkpoints, monkeypatch, tmp_path):
    model, _, info = load_model(checkpoints["sasrec"])
    plain, blocked = tmp_path / "plain.onnx", tmp_path / "blocked.onnx"
    graph.export_fp32(model, info, plain, 5)
    monkeypatch.setattr(graph, "BLOCKED_FROM", 1)  # the tiny catalogue in two stages
    graph.export_fp32(model, info, blocked, 5)
    assert "ReduceMax" in {n.op_type for n in onnx.load(str(blocked)).graph.node}
    x = feeds(*example_inputs(info, batch=4, length=9, seed=3))
    got, want = (ort.InferenceSession(str(p)).run(None, x) for p in (blocked, plain))
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("rule", ["gap", "ahead"])
def test_a_gap_rule_checkpoint_ships_its_rule_and_answers_as_trained(small_ds, tmp_path, rule):
    """A checkpoint trained with data.slot_rule=gap (or ahead): the artifact names the rule,
    passes export's checks on those slots, and the runtime, computing the slots itself from raw
    timestamps (under "ahead" and the request's time, `at`: here the time of the user's last
    interaction, whose history is the rest), ranks a user's history as PyTorch does on the
    training data's slots."""
    from lsan.config import DataConfig, RunConfig, TrainConfig
    from lsan.data.prepare import with_slot_rule
    from lsan.models import model_config
    from lsan.serving.runtime import load_artifact
    from lsan.train import train

    run = RunConfig(data=DataConfig(dataset="synthetic", max_len=12, slot_rule=rule),
                    model_name="lsan_full", model=model_config("lsan_full", {"dim": 16}),
                    train=TrainConfig(epochs=2, batch_size=64, device="cpu"))  # fmt: skip
    train(run, tmp_path / "ck", progress=False, ds=small_ds)
    export(tmp_path / "ck", tmp_path / "a", quant="fp32", k=20, ds=small_ds, log=lambda *_: None)
    art = load_artifact(tmp_path / "a")
    assert art.slot_rule == rule and art.meta.info.num_slots == 26
    ds = with_slot_rule(small_ds, rule)
    model = load_model(tmp_path / "ck")[0].eval()
    u = int(np.argmax(ds.lengths))  # longer than max_len: the first kept entry has a gap
    lo, hi = ds.offsets[u], ds.offsets[u + 1] - (rule == "ahead")
    hist = [(int(ds.raw_item_ids[i]), float(t))
            for i, t in zip(ds.items[lo:hi], ds.timestamps[lo:hi], strict=True)]  # fmt: skip
    at = [float(ds.timestamps[hi])] if rule == "ahead" else []
    got = art.recommend([hist], k=10, exclude_seen=False, at=at)[0].items
    items, cats = ds.items[hi - 12 : hi], ds.item_category[ds.items[hi - 12 : hi]]
    slots = ds.slots[hi - 12 : hi]
    assert rule != "ahead" or slots[-1] > 1  # the last slot read the request's time
    as_t = [torch.as_tensor(a[None]) for a in (items, cats, slots)]
    with torch.no_grad():
        scores = model.score_all(*as_t)[0, 1:]
    top = torch.topk(scores, 10)
    assert [i for i, _ in got] == ds.raw_item_ids[1 + top.indices.numpy()].tolist()
    assert [s for _, s in got] == pytest.approx(top.values.tolist(), abs=1e-5)
