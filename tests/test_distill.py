"""Item tables behind one interface, data-driven codes, and distillation from a teacher."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from lsan.checkpoint import load_model
from lsan.config import DataConfig, RunConfig, TrainConfig
from lsan.distill import TeacherError, init_from_checkpoint
from lsan.models import DataInfo, build_model, model_config
from lsan.models.codes import assign, popularity_rank, residual_kmeans
from lsan.models.item_tables import CodeTable, QRTable, TableConfig, build_item_table
from lsan.train import train

INFO = DataInfo(num_items=97, num_categories=7, num_slots=26, max_len=10)


def naive_scores(table, h):
    bias = table.item_bias if getattr(table, "item_bias", None) is not None else 0
    return h @ table.matrix().T + bias


@pytest.mark.parametrize(
    "kw",
    [
        {"item_table": "full"},
        {"item_table": "qr", "m1": 3, "item_weights": True},
        {"item_table": "qr", "tables": 3},
        {"item_table": "codes", "code_size": 8},
        {"item_table": "codes", "code_size": 8, "own_rows": 5, "item_weights": True},
    ],
)
def test_every_table_scores_equal_its_explicit_matrix(kw):
    torch.manual_seed(0)
    table = build_item_table(TableConfig(**kw), INFO.num_items, 16)
    table.reset(0.5)
    if getattr(table, "item_weights", None) is not None:
        with torch.no_grad():
            table.item_weights.uniform_(0.5, 1.5)
            table.item_bias.normal_()
    h = torch.randn(5, 16)
    ids = torch.randint(1, INFO.num_items + 1, (5, 7))
    full = table.scores(h)
    assert full.shape == (5, INFO.num_items + 1)
    assert torch.allclose(full, naive_scores(table, h), atol=1e-5)
    assert torch.allclose(table.score_ids(h, ids), full.gather(1, ids), atol=1e-5)
    items = torch.tensor([[0, 3, 97]])
    emb = table(items)
    assert emb.shape == (1, 3, 16) and torch.all(emb[0, 0] == 0)
    assert torch.allclose(emb[0, 1:].sum(-1), table.base(items)[0, 1:].sum((-1, -2)), atol=1e-5)


def test_codes_are_a_stored_small_integer_table_and_validated():
    table = CodeTable(INFO.num_items, 8, [8, 8])
    assert table.codes.dtype == torch.uint8 and table.codes.shape == (INFO.num_items + 1, 2)
    assert "codes" in table.state_dict()
    with pytest.raises(ValueError, match="out of range"):
        table.set_codes(torch.full((INFO.num_items + 1, 2), 8))
    with pytest.raises(ValueError, match="must be"):
        table.set_codes(torch.zeros(3, 2, dtype=torch.long))
    assert CodeTable(10, 4, [300]).codes.dtype == torch.int16


def test_popularity_codes_separate_the_popular_items_and_give_them_own_rows():
    counts = np.zeros(INFO.num_items + 1)
    counts[1:] = np.arange(INFO.num_items)[::-1] + 1  # item 1 most popular
    counts[50] = 1000  # item 50 is the most popular of all
    rank = popularity_rank(counts)
    assert rank[50] == 0 and rank[1] == 1 and rank[0] == INFO.num_items
    table = build_item_table(
        TableConfig(item_table="codes", code_size=8, own_rows=4), INFO.num_items, 8
    )
    assign(table, "popularity", 4, counts)
    codes = table.codes.long()
    top8 = np.argsort(rank[1:])[:8] + 1
    assert len(set(codes[top8, 0].tolist())) == 8  # the 8 most popular differ in book 1
    own = codes[:, -1]
    assert sorted(own[own > 0].tolist()) == [1, 2, 3, 4] and own[50] == 1 and own[0] == 0


def test_teacher_codes_put_similar_items_together():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(4, 16)) * 5
    group = np.arange(INFO.num_items + 1) % 4
    vectors = torch.as_tensor(centres[group] + rng.normal(size=(INFO.num_items + 1, 16)) * 0.1)
    table = build_item_table(
        TableConfig(item_table="codes", code_size=4, tables=1), INFO.num_items, 16
    )
    summary = assign(table, "teacher", 0, np.ones(INFO.num_items + 1), vectors, seed=0)
    first = table.codes.long()[1:, 0].numpy()
    for g in range(4):  # every group is one cluster, and clusters are distinct
        assert len(set(first[group[1:] == g])) == 1
    assert len(set(first)) == 4 and summary["kmeans_relative_error"] < 0.05
    # codebooks start at the centroids: the composed vectors approximate the teacher's
    assert torch.allclose(table.matrix()[1:].double(), vectors[1:], atol=0.5)


def test_residual_levels_reduce_the_error():
    x = np.random.default_rng(1).normal(size=(300, 8))
    _, _, one = residual_kmeans(x, [16], 0)
    _, _, two = residual_kmeans(x, [16, 16], 0)
    assert np.linalg.norm(two) < 0.9 * np.linalg.norm(one)


@pytest.mark.parametrize("name", ["sasrec", "lsan"])
@pytest.mark.parametrize("table", ["full", "qr", "codes"])
def test_sasrec_and_lsan_take_every_item_table(name, table):
    model = build_model(
        name, model_config(name, {"dim": 16, "item_table": table, "code_size": 8}), INFO
    )
    items = torch.randint(1, INFO.num_items + 1, (3, 6))
    targets = torch.randint(1, INFO.num_items + 1, (3, 6))
    loss = model.loss(items, items % 5 + 2, items % 7 + 2, targets)
    loss.backward()
    assert torch.isfinite(loss)
    assert model.score_all(items, items % 5 + 2, items % 7 + 2).shape == (3, INFO.num_items + 1)


def test_a_codes_table_is_far_smaller_than_the_full_one():
    def size(table):
        m = build_model("sasrec", model_config("sasrec", {"dim": 32, "item_table": table}), INFO)
        return sum(p.numel() for p in m.item_emb.parameters())

    assert size("codes") < size("full") * 10  # 2 x 256 x 32 vs 98 x 32 on this tiny catalogue
    big = DataInfo(num_items=20_000, num_categories=3, num_slots=3, max_len=10)
    full = build_item_table(TableConfig(), big.num_items, 64)
    codes = build_item_table(TableConfig(item_table="codes"), big.num_items, 64)
    assert sum(p.numel() for p in codes.parameters()) < 0.03 * full.weight.numel()


# ---------------------------------------------------------------- distillation


def run_cfg(model_values, epochs, **train_kw):
    return RunConfig(
        data=DataConfig(dataset="synthetic", max_len=12),
        model_name="sasrec",
        model=model_config("sasrec", model_values),
        train=TrainConfig(
            epochs=epochs,
            batch_size=64,
            patience=100,
            device="cpu",
            lr=3e-3,
            eval_every=epochs,
            **train_kw,
        ),  # fmt: skip
    )


@pytest.fixture(scope="module")
def teacher(small_ds, tmp_path_factory):
    out = tmp_path_factory.mktemp("teacher")
    train(run_cfg({"dim": 32, "layers": 1, "dropout": 0.1}, 15), out, progress=False, ds=small_ds)
    return out


STUDENT = {"dim": 16, "layers": 1, "dropout": 0.1, "item_table": "codes", "code_size": 8,
           "tables": 2, "codes_from": "popularity"}  # fmt: skip


SMALL = {"dim": 16, "layers": 1, "dropout": 0.1}


def test_distillation_makes_a_small_student_better(small_ds, teacher, tmp_path):
    """Same student, same epochs, two seeds: with the teacher it ranks better on test.

    Measured when written (teacher NDCG@10 0.24): plain 0.151 / 0.153, distilled 0.169 / 0.173.
    """
    plain, kd = [], []
    for seed in (1, 2):
        plain.append(train(run_cfg(SMALL, 5, seed=seed), tmp_path / f"plain{seed}",
                           progress=False, ds=small_ds)["test"]["NDCG@10"])  # fmt: skip
        res = train(run_cfg(SMALL, 5, seed=seed, teacher=str(teacher), kd_weight=0.9),
                    tmp_path / f"kd{seed}", progress=False, ds=small_ds)  # fmt: skip
        kd.append(res["test"]["NDCG@10"])
    assert all(k > p for k, p in zip(kd, plain, strict=True))
    assert np.mean(kd) > 1.04 * np.mean(plain)
    assert res["teacher"]["path"] == str(teacher) and len(res["teacher"]["sha256"]) == 64
    stored = json.loads((tmp_path / "kd2" / "config.json").read_text())["run"]["train"]
    assert stored["teacher_sha256"] == res["teacher"]["sha256"]
    assert "teacher" not in "".join(torch.load(tmp_path / "kd2" / "model.pt").keys())


def test_an_ensemble_of_teachers_teaches_its_normalised_geometric_mean(small_ds, teacher, tmp_path):
    """Two teachers: the student learns from log_softmax(mean of their log-probabilities); both
    digests are recorded; settings that copy one teacher's weights refuse two; a resume with
    other teachers is refused."""
    from lsan.data.batching import train_tensors
    from lsan.distill import load_teachers
    from lsan.models.layers import PAD, mask_padding

    second = tmp_path / "second"
    train(run_cfg({"dim": 8, "layers": 1}, 3), second, progress=False, ds=small_ds)
    spec = f"{teacher},{second}"
    both, digests, names = load_teachers(spec, load_model(teacher)[2], torch.device("cpu"))
    assert len(digests.split(",")) == 2 and names == "sasrec,sasrec"
    b = train_tensors(small_ds, 12).rows(torch.arange(8))
    keep = b.targets != PAD
    got = both.log_probs(b, keep, 2.0)
    logs = []
    for m in both.members:
        with torch.no_grad():
            t = mask_padding(m.item_scores(m(b.items, b.cats, b.slots)[keep]))
        logs.append(torch.log_softmax(t / 2.0, -1))
    assert torch.allclose(got, torch.log_softmax((logs[0] + logs[1]) / 2, -1), atol=1e-6)
    assert torch.allclose(got.exp().sum(-1), torch.ones(int(keep.sum())), atol=1e-5)
    one, _, _ = load_teachers(str(teacher), load_model(teacher)[2], torch.device("cpu"))
    assert torch.equal(one.log_probs(b, keep, 2.0), logs[0])  # one teacher: as before

    res = train(run_cfg(SMALL, 1, teacher=spec), tmp_path / "s", progress=False, ds=small_ds)
    assert res["teacher"]["path"] == spec and res["teacher"]["sha256"] == digests
    with pytest.raises(TeacherError, match="needs one teacher"):
        train(run_cfg(SMALL, 1, teacher=spec, teacher_init=True), tmp_path / "t",
              progress=False, ds=small_ds)  # fmt: skip
    with pytest.raises(TeacherError, match="same teachers"):
        train(run_cfg(SMALL, 2, teacher=str(teacher)), tmp_path / "s", resume=True,
              progress=False, ds=small_ds)  # fmt: skip


def test_teacher_codes_are_saved_with_the_checkpoint(small_ds, teacher, tmp_path):
    values = {**STUDENT, "codes_from": "teacher", "own_rows": 10}
    res = train(run_cfg(values, 1, teacher=str(teacher)), tmp_path, progress=False, ds=small_ds)
    assert res["codes"]["source"] == "teacher" and res["codes"]["distinct_codes"] > 30
    model, _, _ = load_model(tmp_path)
    fresh = build_model("sasrec", model_config("sasrec", values), model.info)
    assert not torch.equal(model.item_emb.codes, fresh.item_emb.codes)  # loaded, not re-derived


def test_resume_refuses_a_changed_teacher(small_ds, teacher, tmp_path):
    train(run_cfg(STUDENT, 1, teacher=str(teacher)), tmp_path / "s", progress=False, ds=small_ds)
    weights = torch.load(teacher / "model.pt")
    weights[next(iter(weights))] += 1.0
    torch.save(weights, teacher / "model.pt.changed")
    other = tmp_path / "other-teacher"
    other.mkdir()
    for f in teacher.iterdir():
        if f.is_file() and f.name != "model.pt.changed":
            (other / f.name).write_bytes(f.read_bytes())
    (other / "model.pt").write_bytes((teacher / "model.pt.changed").read_bytes())
    (teacher / "model.pt.changed").unlink()
    with pytest.raises(TeacherError, match="changed"):
        train(run_cfg(STUDENT, 2, teacher=str(other)), tmp_path / "s", resume=True,
              progress=False, ds=small_ds)  # fmt: skip


def test_a_teacher_from_another_catalogue_is_refused(small_ds, tmp_path):
    bad = tmp_path / "t"
    other = DataInfo(num_items=5, num_categories=3, num_slots=3, max_len=12)
    from lsan.checkpoint import save_config, save_tensors

    cfg = run_cfg({"dim": 8}, 1)
    save_config(bad, cfg, other)
    save_tensors(bad / "model.pt", build_model("sasrec", cfg.model, other).state_dict())
    with pytest.raises(TeacherError, match="items"):
        train(run_cfg(STUDENT, 1, teacher=str(bad)), tmp_path / "s", progress=False, ds=small_ds)


def test_qr_is_the_lsan_default_and_codes_table_is_compact_in_bytes():
    m = build_model("lsan", model_config("lsan", {"dim": 16}), INFO)
    assert isinstance(m.item_emb, QRTable) and m.item_emb.sizes[0] == 2


@pytest.mark.parametrize(
    "name,values",
    [("sasrec", {}), ("sasrec", {"layers": 1}), ("bert4rec", {}), ("lsan", {}),
     ("lsan", {"conv": False, "layers": 2}), ("lsan", {"attention": "local"}), ("gru4rec", {})],
)  # fmt: skip
def test_last_position_inference_equals_the_full_forward(name, values):
    """score_all runs the final layer for the last position only: the same scores."""
    torch.manual_seed(0)
    model = build_model(name, model_config(name, {"dim": 16, **values}), INFO).eval()
    items = torch.randint(1, INFO.num_items + 1, (3, 8))
    items[0, :5] = 0
    cats, slots = items % 5 + 2, items % 7 + 2
    from lsan.models.objectives import inference_inputs

    with torch.no_grad():
        full = model(*inference_inputs(model, items, cats, slots))[:, -1]
        fast = model(*inference_inputs(model, items, cats, slots), last_only=True)
    assert fast.shape == (3, 1, 16)
    assert torch.allclose(full, fast[:, 0], atol=1e-5)


def test_teacher_init_copies_the_encoder_but_not_the_table():
    from lsan.distill import init_from_teacher

    teacher = build_model("sasrec", model_config("sasrec", {"dim": 16}), INFO)
    student = build_model("sasrec", model_config("sasrec", {"dim": 16, "item_table": "codes",
                                                             "code_size": 8}), INFO)  # fmt: skip
    taken = init_from_teacher(student, teacher)
    assert taken and not any(k.startswith("item_emb") for k in taken)
    assert torch.equal(student.blocks[0].attn.qkv.weight, teacher.blocks[0].attn.qkv.weight)
    assert student.item_emb.tables[0].shape == (8, 16)
    small = build_model("sasrec", model_config("sasrec", {"dim": 8}), INFO)
    assert init_from_teacher(small, teacher) == []  # nothing fits a different width


def test_time_slots_are_taught_and_taken_only_by_the_same_rule(small_ds, teacher, tmp_path):
    """hour and gap both have 26 slots: an LSAN teacher of the other rule is refused, a SASRec
    teacher (no slots) is not, and a start from a checkpoint of the other rule takes everything
    but its slot embedding."""
    lsan_cfg = {"dim": 16, "dropout": 0.1}

    def lsan_run(rule, epochs, **kw):
        run = run_cfg({}, epochs, **kw)
        return dataclasses.replace(
            run, data=dataclasses.replace(run.data, slot_rule=rule), model_name="lsan_full",
            model=model_config("lsan_full", lsan_cfg),
        )  # fmt: skip

    hourly = tmp_path / "hourly"
    train(lsan_run("auto", 1), hourly, progress=False, ds=small_ds)
    with pytest.raises(TeacherError, match="rule 'hour', the student's data by 'gap'"):
        train(lsan_run("gap", 1, teacher=str(hourly)), tmp_path / "a", progress=False, ds=small_ds)
    train(lsan_run("gap", 1, teacher=str(teacher)), tmp_path / "b", progress=False, ds=small_ds)
    assert json.loads((tmp_path / "b" / "dataset.json").read_text())["slot_rule"] == "gap"
    source, _, info = load_model(hourly)
    for rule, slots_taken in (("gap", False), ("hour", True)):
        fresh = build_model("lsan_full", model_config("lsan_full", lsan_cfg), info)
        own = {k: v.clone() for k, v in fresh.state_dict().items()}
        record = init_from_checkpoint(fresh, str(hourly), rule)
        got, theirs = fresh.state_dict(), source.state_dict()
        assert torch.equal(got["fusion.cur_cat.weight"], theirs["fusion.cur_cat.weight"])
        want = theirs if slots_taken else own
        assert torch.equal(got["fusion.slot.weight"], want["fusion.slot.weight"])
        assert ("not_taken" in record) is not slots_taken
    res = train(lsan_run("gap", 1, init=str(hourly)), tmp_path / "c", progress=False, ds=small_ds)
    assert res["init"]["not_taken"] == "fusion.slot.weight: trained by slot rule 'hour'"
