"""The classic baselines (GRU4Rec, Caser, FPMC) and SSE-PT: API, receptive fields, users, SSE,
hand-checked FPMC scores, losses, tiny training runs against popularity, and export."""

import json
import math
import shutil

import pytest
import torch
import torch.nn.functional as F
from conftest import train_tiny

import tests.test_models as test_models
from lsan.checkpoint import load_model, read_config
from lsan.config import EvalConfig
from lsan.data.batching import SeqTensors, eval_tensors
from lsan.evaluate import rank_users, target_ranks
from lsan.export import ExportError
from lsan.export.export import export, main
from lsan.models import DataInfo, build_model, model_config
from lsan.models.layers import NEG
from lsan.models.objectives import batch_loss, uses_users

INFO = DataInfo(num_items=40, num_categories=6, num_slots=26, max_len=12, num_users=4)
BASELINES = ["gru4rec", "caser", "fpmc", "ssept"]
WITH_USERS = ["caser", "fpmc", "ssept"]
SMALL = {  # tiny configs for the unit tests
    "gru4rec": {"dim": 8, "layers": 2},
    "caser": {"dim": 8, "n_h": 4, "n_v": 2},
    "fpmc": {"dim": 8},
    "ssept": {"dim": 8, "user_dim": 4, "layers": 1, "heads": 2},
}
HIDDEN = {"gru4rec": 8, "caser": 16, "fpmc": 16, "ssept": 12}  # width of forward's output


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One torch thread: the models are tiny, and more threads only contend on a shared CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make(name, info=INFO, **cfg):
    """A small model in eval mode; init std 0.3 makes scores O(1), so tolerances mean something."""
    torch.manual_seed(0)
    values = {"init_std": 0.3, **SMALL[name], **cfg}
    return build_model(name, model_config(name, values), info).eval()


def batch(b=3, t=12, seed=0):
    return test_models.batch(b, t, seed, info=INFO)


def user_kw(model, users=(0, 1, 2)):
    return {"users": torch.tensor(users)} if uses_users(model) else {}


# ---------------------------------------------------------------- the shared API


@pytest.mark.parametrize("name", BASELINES)
def test_shapes_and_pad_column(name):
    model = make(name)
    items, cats, slots = batch()
    with torch.no_grad():
        h = model(items, cats, slots, **user_kw(model))
        scores = model.score_all(items, cats, slots, **user_kw(model))
    assert h.shape == (3, 12, HIDDEN[name])
    assert model.item_scores(h).shape == (3, 12, INFO.num_items + 1)
    assert scores.shape == (3, INFO.num_items + 1)
    assert torch.all(scores[:, 0] == NEG) and torch.isfinite(scores).all()
    # score_all is the last position's item_scores (caser and fpmc read only its window)
    assert torch.allclose(scores[:, 1:], model.item_scores(h[:, -1])[:, 1:], atol=1e-5)


# positions whose output depends on the item at position 6 (of 12): the receptive field
REACH = {
    "gru4rec": range(6, 12),
    "ssept": range(6, 12),
    "caser": range(6, 11),  # its window of L = 5 items
    "fpmc": range(6, 7),  # the last item only
}


@pytest.mark.parametrize("name", BASELINES)
def test_receptive_field_is_causal(name):
    model = make(name)
    items, cats, slots = batch()
    changed = items.clone()
    changed[:, 6] = changed[:, 6] % INFO.num_items + 1  # another real item
    with torch.no_grad():
        a = model(items, cats, slots, **user_kw(model))
        b = model(changed, cats, slots, **user_kw(model))
    moved = [t for t in range(12) if not torch.allclose(a[:, t], b[:, t], atol=1e-6)]
    assert moved == list(REACH[name])


def test_gru_state_stays_zero_on_left_padding():
    """No GRU biases: padding keeps the state at zero, so extra left padding changes nothing."""
    model = make("gru4rec")
    items, _, _ = batch()
    with torch.no_grad():
        out, _ = model.gru(model.item_emb(items))
    assert torch.all(out[0, :5] == 0) and torch.all(out[0, 5:].abs().sum(-1) > 0)


def test_caser_matches_the_papers_convolutions_window_by_window():
    """Each position's hidden state from its own zero-padded L x D image and Conv2d filters."""
    model = make("caser", window=3)
    items, _, _ = batch()
    users = torch.tensor([2, 0, 1])
    with torch.no_grad():
        h = model(items, users=users)
        e = model.item_emb(items)
        for b, t in [(0, 0), (0, 5), (0, 6), (1, 0), (1, 1), (2, 11)]:
            image = torch.zeros(3, 8)  # L x D, rows before the sequence stay zero
            rows = e[b, max(t - 2, 0) : t + 1]
            image[3 - len(rows) :] = rows
            feats = []
            for height, lin in enumerate(model.horizontal, start=1):
                w = lin.weight.view(-1, 1, height, 8)  # (n_h, 1, h, D)
                out = F.conv2d(image[None, None], w, lin.bias)  # (1, n_h, L-h+1, 1)
                feats.append(F.relu(out).amax(2).flatten())
            vert = F.conv2d(image[None, None], model.vertical.weight.view(-1, 1, 3, 1))
            vert = vert + model.vertical.bias.view(1, -1, 1, 1)  # (1, n_v, 1, D)
            feats.append(vert[0, :, 0].T.flatten())  # D-major, the model's layout
            z = F.relu(model.fc(torch.cat(feats)))
            assert torch.allclose(
                h[b, t], torch.cat([z, model.user_emb.weight[users[b]]]), atol=1e-5
            )


# ---------------------------------------------------------------- users


@pytest.mark.parametrize("name", WITH_USERS)
def test_users_matter_and_are_required(name):
    model = make(name)
    items, cats, slots = batch()
    with torch.no_grad():
        a = model.score_all(items, cats, slots, users=torch.tensor([0, 1, 2]))
        b = model.score_all(items, cats, slots, users=torch.tensor([3, 1, 3]))
    assert not torch.allclose(a[0], b[0]) and not torch.allclose(a[2], b[2])
    assert torch.equal(a[1], b[1])  # the same user scores the same
    with pytest.raises(ValueError, match="users="):
        model.score_all(items, cats, slots)
    with pytest.raises(ValueError, match="num_users"):
        make(name, DataInfo(num_items=40, num_categories=6, num_slots=26, max_len=12))


def test_sse_replaces_users_and_items_in_training_only():
    model = make("ssept", dropout=0.0, sse_user=1.0, sse_item=1.0)
    items, cats, slots = batch()
    users = torch.tensor([0, 1, 2])
    # the replacement itself: every real item and user resampled in range, padding kept
    torch.manual_seed(1)
    new_items, new_users = model.shared_embeddings(items.repeat(20, 1), users.repeat(20))
    real = items.repeat(20, 1) != 0
    assert torch.all(new_items[~real] == 0)
    assert new_items[real].min() >= 1 and new_items[real].max() <= INFO.num_items
    assert (new_items[real] != items.repeat(20, 1)[real]).float().mean() > 0.9
    assert new_users.max() < INFO.num_users and (new_users != users.repeat(20)).any()
    # eval is deterministic and ignores SSE; train mode with dropout 0 differs only through SSE
    with torch.no_grad():
        ev1, ev2 = (model.score_all(items, cats, slots, users=users) for _ in range(2))
        assert torch.equal(ev1, ev2)
        model.train()
        trained = model.score_all(items, cats, slots, users=users)
        off = make("ssept", dropout=0.0, sse_user=0.0, sse_item=0.0).train()
        plain = off.score_all(items, cats, slots, users=users)
    assert not torch.allclose(trained, ev1, atol=1e-4)
    assert torch.allclose(plain, ev1, atol=1e-5)  # same weights (same seed), no SSE


# ---------------------------------------------------------------- FPMC by hand


def test_fpmc_scores_and_loss_match_the_formula():
    """dim 1: score(v | u, l) = U_u V_v + L_l I_v, with hand-set factors."""
    info = DataInfo(num_items=3, num_categories=3, num_slots=3, max_len=4, num_users=2)
    model = build_model("fpmc", {"dim": 1}, info).eval()
    with torch.no_grad():
        model.user_emb.weight.copy_(torch.tensor([[1.0], [2.0]]))  # U
        model.last_emb.weight.copy_(torch.tensor([[0.0], [0.5], [-1.0], [3.0]]))  # L
        # rows [V_v, I_v] for v = 0 (padding), 1, 2, 3
        model.item_out.weight.copy_(torch.tensor([[0, 0], [1, 0], [0, 1], [-1, 0.5]]))
        scores = model.score_all(torch.tensor([[0, 2, 3]]), users=torch.tensor([1]))
    # user 1 (U = 2) after item 3 (L = 3): 2 V_v + 3 I_v
    assert scores.tolist() == [[NEG, 2.0, 3.0, -0.5]]
    # user 0 (U = 1) reads 3 then 1 and should predict 2 then 3; column 0 scores 0 in the softmax
    loss = model.loss(
        torch.tensor([[0, 3, 1]]), None, None, torch.tensor([[0, 2, 3]]), users=torch.tensor([0])
    )
    after_3 = [0.0, 1.0, 3.0, -1.0 + 1.5]  # V_v + 3 I_v
    after_1 = [0.0, 1.0, 0.5, -1.0 + 0.25]  # V_v + 0.5 I_v
    nll = lambda s, t: -s[t] + math.log(sum(math.exp(x) for x in s))
    assert loss.item() == pytest.approx((nll(after_3, 2) + nll(after_1, 3)) / 2, rel=1e-6)


# ---------------------------------------------------------------- losses


@pytest.mark.parametrize("name", BASELINES)
def test_score_items_agrees_and_every_loss_is_finite(name):
    model = make(name)
    items, cats, slots = batch()
    with torch.no_grad():
        h = model(items, cats, slots, **user_kw(model))[items != 0]  # (N, D')
    ids = torch.randint(1, INFO.num_items + 1, (h.shape[0], 7))
    assert torch.allclose(model.score_items(h, ids), model.item_scores(h).gather(1, ids), atol=1e-5)
    targets = torch.roll(items, -1, 1)
    targets[:, -1] = 0
    b = SeqTensors(items, cats, slots, targets=targets, users=torch.tensor([0, 1, 2]))
    model.train()
    for kind in ("ce", "bpr", "sampled"):
        loss = batch_loss(model, b, kind, negatives=5)
        assert loss.ndim == 0 and torch.isfinite(loss), kind


# ---------------------------------------------------------------- training against popularity

# Larger inits than the defaults and short windows: train_tiny gives ~100 Adam steps at lr 1e-3
# with patience 10, and at N(0, 0.02) the models without a final layer norm sit on the
# popularity plateau for longer than that.
TINY = {
    "gru4rec": ({"dim": 32, "dropout": 0.1, "init_std": 0.3}, 20),
    "caser": ({"dim": 32, "window": 3, "dropout": 0.2, "init_std": 0.15}, 25),
    "fpmc": ({"dim": 32}, 8),
    "ssept": ({"dim": 32, "user_dim": 16, "layers": 1, "dropout": 0.1}, 20),
}


@pytest.fixture(scope="module")
def trained(small_ds, tmp_path_factory):
    root = tmp_path_factory.mktemp("baselines")
    out = {"pop": train_tiny("pop", {}, small_ds, root / "pop")}
    for name, (cfg, epochs) in TINY.items():
        out[name] = train_tiny(name, cfg, small_ds, root / name, epochs=epochs)
    return out


def ndcg10(ckpt):
    return json.loads((ckpt / "metrics.json").read_text())["test"]["NDCG@10"]


@pytest.mark.parametrize("name", list(TINY))
def test_tiny_run_beats_popularity(name, trained):
    assert ndcg10(trained[name]) > 1.1 * ndcg10(trained["pop"]) > 0


@pytest.mark.parametrize("name", WITH_USERS)
def test_evaluation_scores_each_row_with_its_own_user(name, trained, small_ds):
    model, _, info = load_model(trained[name])
    assert info.num_users == small_ds.num_users  # filled by train.resolve, saved in config.json
    cfg = EvalConfig(mask_seen=False)
    ranks = rank_users(model, small_ds, "test", info.max_len, cfg, torch.device("cpu"))
    data = eval_tensors(small_ds, "test", info.max_len)
    users = torch.arange(small_ds.num_users)

    def manual(users):
        with torch.no_grad():
            scores = model.score_all(data.items, data.cats, data.slots, users=users)
        scores[:, 0] = -torch.inf
        return target_ranks(scores, data.target).numpy()

    assert (ranks == manual(users)).all()
    assert (ranks != manual(users.roll(1))).any()  # another user's embedding ranks differently


def test_old_checkpoints_without_user_count_still_load(trained, tmp_path):
    ckpt = tmp_path / "old"
    shutil.copytree(trained["gru4rec"], ckpt)
    raw = json.loads((ckpt / "config.json").read_text())
    del raw["info"]["num_users"]
    (ckpt / "config.json").write_text(json.dumps(raw))
    assert read_config(ckpt)[1].num_users == 0
    load_model(ckpt)


# ---------------------------------------------------------------- export


def test_gru4rec_exports_with_parity(trained, small_ds, tmp_path):
    meta = export(trained["gru4rec"], tmp_path / "a", quant="fp32", k=20, ds=small_ds,
                  log=lambda *_: None)  # fmt: skip
    fp32 = meta.parity["fp32"]
    assert fp32.max_abs_score_diff <= 1e-4 and fp32.top10_identical
    assert meta.test_metrics["NDCG@10"] == pytest.approx(ndcg10(trained["gru4rec"]), abs=1e-6)


@pytest.mark.parametrize("name", WITH_USERS)
def test_export_refuses_models_that_need_a_user(name, trained, tmp_path, capsys):
    with pytest.raises(ExportError, match="user embedding"):
        export(trained[name], tmp_path / "a", log=lambda *_: None)
    assert main([str(trained[name]), "--out", str(tmp_path / "b"), "--no-eval"]) == 1
    assert f"model '{name}' scores with a user embedding" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
