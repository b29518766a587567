"""The AE/AR switch, Cloze masking, the sampled losses and `lsan compare`."""

import json
import math

import pytest
import torch

from lsan.cli import main
from lsan.data.batching import SeqTensors
from lsan.data.slots import UNKNOWN
from lsan.models import DataInfo, build_model, model_config
from lsan.models.layers import NEG, PAD
from lsan.models.objectives import (
    batch_loss,
    cloze_batch,
    inference_inputs,
    is_autoencoding,
    sampled_loss,
)

INFO = DataInfo(num_items=40, num_categories=6, num_slots=26, max_len=12)
MASK = INFO.num_items + 1


def train_batch(b=64, t=12, seed=0, full_out=False):
    """A next-item batch laid out like lsan.data.batching.train_tensors (from full sequences)."""
    g = torch.Generator().manual_seed(seed)
    full = torch.randint(1, INFO.num_items + 1, (b, t + 1), generator=g)
    full[0, :7] = PAD
    full[1, :11] = PAD  # two items: one input, one target
    cats = (full % 4 + 2) * (full != PAD)
    slots = (full % 7 + 2) * (full != PAD)
    targets = torch.where(full[:, :-1] != PAD, full[:, 1:], PAD)  # the first item is no target
    batch = SeqTensors(full[:, :-1], cats[:, :-1], slots[:, :-1], targets=targets,
                       next_cats=cats[:, 1:] * (targets != PAD), next_slots=slots[:, 1:] * (targets != PAD))  # fmt: skip
    return (batch, full, cats, slots) if full_out else batch


def test_cloze_masks_real_items_only_and_at_least_one_per_row():
    torch.manual_seed(0)
    b, full, cats, slots = train_batch(full_out=True)
    c = cloze_batch(b, 0.3, MASK)
    seq = full[:, 1:]  # the whole training part, first item included, last max_len of it
    assert (b.targets[0] != seq[0]).any()  # the first item is no next-item target ...
    masked = c.items == MASK
    assert not (masked & (seq == PAD)).any()  # padding is never masked
    assert masked.any(1).all()  # every row predicts something (row 1 has two items)
    assert torch.equal(c.targets != PAD, masked)  # targets exactly at masked positions
    assert torch.equal(c.targets[masked], seq[masked])  # ... holding the original items
    assert torch.equal(c.items[~masked], seq[~masked])  # ... but Cloze sees and predicts it
    assert (c.cats[masked] == UNKNOWN).all()  # a masked item's category would give it away
    assert torch.equal(c.cats[~masked], cats[:, 1:][~masked])
    previous = torch.cat([slots[:, 1:2], slots[:, 1:-1]], dim=1)
    assert torch.equal(c.slots[masked], previous[masked])  # the mask's slot: the one before
    rate = masked.sum() / (seq != PAD).sum()
    assert 0.25 < rate < 0.4


def test_cloze_rate_follows_mask_prob():
    torch.manual_seed(1)
    b = train_batch(b=256)
    real = (cloze_batch(b, 0.0, MASK).items != PAD).sum()
    low = (cloze_batch(b, 0.1, MASK).items == MASK).sum() / real
    high = (cloze_batch(b, 0.6, MASK).items == MASK).sum() / real
    assert low < 0.2 < 0.5 < high


def test_ae_inference_appends_mask_and_drops_oldest_only_at_max_len():
    ar = build_model("sasrec", model_config("sasrec", {"dim": 16}), INFO)
    ae = build_model("bert4rec", model_config("bert4rec", {"dim": 16}), INFO)
    assert not is_autoencoding(ar) and is_autoencoding(ae)
    items = torch.arange(1, 13)[None]
    cats = torch.full_like(items, 3)
    slots = torch.full_like(items, 5)
    assert inference_inputs(ar, items, cats, slots)[0] is items
    i, c, s = inference_inputs(ae, items, cats, slots)
    assert i[0].tolist() == [*range(2, 13), MASK] and c[0, -1] == UNKNOWN and s[0, -1] == 5
    i, _, _ = inference_inputs(ae, items[:, 4:], cats[:, 4:], slots[:, 4:])
    assert i[0].tolist() == [*range(5, 13), MASK]  # shorter than max_len: nothing dropped


def test_bpr_and_sampled_softmax_hand_checked():
    scores = torch.tensor([[2.0, 0.0, 1.0], [0.5, 0.5, -1.0]])
    positives = torch.tensor([7, 3])
    negatives = torch.tensor([[1, 2], [3, 9]])  # row 1's first negative is its positive
    bpr = sampled_loss("bpr", scores, positives, negatives)
    pairs = [2.0 - 0.0, 2.0 - 1.0, 0.5 - (-1.0)]  # the accidental hit is left out
    expected = sum(math.log1p(math.exp(-d)) for d in pairs) / 3
    assert bpr.item() == pytest.approx(expected, rel=1e-6)
    soft = sampled_loss("sampled", scores, positives, negatives)
    row0 = -2.0 + math.log(math.exp(2.0) + math.exp(0.0) + math.exp(1.0))
    row1 = -0.5 + math.log(math.exp(0.5) + math.exp(-1.0))  # hit masked, not a negative
    assert soft.item() == pytest.approx((row0 + row1) / 2, rel=1e-6)
    with pytest.raises(ValueError, match="unknown loss"):
        sampled_loss("hinge", scores, positives, negatives)


@pytest.mark.parametrize("name", ["sasrec", "bert4rec", "lsan", "lsan_full"])
def test_score_items_agree_with_full_scores(name):
    torch.manual_seed(0)
    model = build_model(name, model_config(name, {"dim": 16}), INFO).eval()
    with torch.no_grad():
        for p in model.parameters():  # per-item weights and bias away from their init
            p.add_(0.1 * torch.randn_like(p))
        h = torch.randn(5, 16)
        ids = torch.randint(1, INFO.num_items + 1, (5, 7))
        full = model.item_scores(h).gather(1, ids)
        assert torch.allclose(model.score_items(h, ids), full, atol=1e-5)


@pytest.mark.parametrize("loss", ["ce", "bpr", "sampled"])
@pytest.mark.parametrize("name", ["sasrec", "bert4rec", "lsan"])
def test_every_loss_trains_every_mode(name, loss):
    torch.manual_seed(0)
    model = build_model(name, model_config(name, {"dim": 16}), INFO).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    b = train_batch(b=32)
    first = None
    for _ in range(20):
        torch.manual_seed(1)  # the same masks and negatives each step: the loss must fall
        value = batch_loss(model, b, loss, negatives=8)
        assert torch.isfinite(value)
        first = value.item() if first is None else first
        opt.zero_grad()
        value.backward()
        opt.step()
    assert value.item() < first


def next_id_accuracy(model, steps: int = 250, lr: float = 5e-3) -> float:
    """Train on runs of consecutive ids (Cloze or next item, as the model's mode says), then
    the share of 9-item runs whose next id the model ranks first (chance: 1/50)."""
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    const = lambda x: torch.full_like(x, 2)
    model.train()
    for _ in range(steps):
        seq = torch.randint(1, 41, (64, 1)) + torch.arange(10)[None]
        b = SeqTensors(seq[:, :-1], const(seq[:, :-1]), const(seq[:, :-1]), targets=seq[:, 1:],
                       next_cats=const(seq[:, 1:]), next_slots=const(seq[:, 1:]))  # fmt: skip
        loss = batch_loss(model, b)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    seq = torch.arange(1, 41)[:, None] + torch.arange(9)[None]  # 9 items, the 10th is due
    with torch.no_grad():
        top = model.score_all(seq, const(seq), const(seq)).argmax(1)
    return (top == seq[:, -1] + 1).float().mean().item()


TOY = DataInfo(num_items=50, num_categories=4, num_slots=4, max_len=10)


@pytest.mark.parametrize("name", ["bert4rec", "local"])
def test_ae_models_learn_to_fill_the_appended_mask(name):
    values = {"dim": 32, "dropout": 0.0, "mask_prob": 0.3}
    model = build_model(name, model_config(name, values), TOY)
    assert is_autoencoding(model)
    assert next_id_accuracy(model) > 0.5


def test_compare_writes_ar_vs_ae_table(small_ds, tmp_path, monkeypatch, capsys):
    import lsan.compare

    real_train = __import__("lsan.train", fromlist=["train"]).train
    # the CLI loads datasets by name; hand it the small generated one instead
    monkeypatch.setattr(
        "lsan.train.train", lambda run, out, **kw: real_train(run, out, **{**kw, "ds": small_ds})
    )
    code = main([
        "compare", "--dataset", "synthetic", "--models", "sasrec", "bert4rec", "ar2=sasrec",
        "--set", "model.dim=16", "--set", "train.epochs=1", "--set", "data.max_len=12",
        "--set", "ar2:model.layers=1", "--out", str(tmp_path / "runs"),
        "--results", str(tmp_path / "res"), "--quiet",
    ])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "AR over AE (best vs best)" in out and "sasrec over bert4rec" in out
    assert "ar2 over" not in out  # a different depth is not the same architecture
    record = json.loads((tmp_path / "res" / "compare-synthetic.json").read_text())
    assert [r["run"] for r in record["rows"]] == ["sasrec", "bert4rec", "ar2"]
    assert (tmp_path / "res" / "compare-synthetic.md").read_text().count("**") >= 12
    # a second call reuses the finished checkpoints instead of training again
    assert main(["compare", "--dataset", "synthetic", "--models", "sasrec", "--set",
                 "model.dim=16", "--out", str(tmp_path / "runs"), "--results",
                 str(tmp_path / "res"), "--quiet"]) == 0  # fmt: skip
    assert "reusing" in capsys.readouterr().out
    # every cell is its checkpoint's own test metric, and "AR over AE" is the ratio of two of them
    tests = {run: json.loads((tmp_path / "runs" / run / "metrics.json").read_text())["test"]
             for run in ("sasrec", "bert4rec", "ar2")}  # fmt: skip
    for row in record["rows"]:
        assert {m: row[m] for m in lsan.compare.METRICS} == {
            m: tests[row["run"]][m] for m in lsan.compare.METRICS
        }
    (pair,) = [row for row in record["table"] if row["run"] == "sasrec over bert4rec"]
    (best,) = [row for row in record["table"] if row["run"] == "AR over AE (best vs best)"]
    for m in lsan.compare.METRICS:
        ar, ae, ar2 = tests["sasrec"][m], tests["bert4rec"][m], tests["ar2"][m]
        assert pair[m] == (f"{ar / ae - 1:+.1%}" if ae > 0 else "-")
        assert best[m] == (f"{max(ar, ar2) / ae - 1:+.1%}" if ae > 0 else "-")


def test_compare_rejects_settings_for_unknown_runs(capsys):
    code = main(["compare", "--dataset", "synthetic", "--models", "sasrec",
                 "--set", "nosuch:model.dim=8"])  # fmt: skip
    assert code == 2 and "nosuch" in capsys.readouterr().err


def test_score_all_pad_column_for_ae():
    model = build_model("local", model_config("local", {"dim": 16}), INFO).eval()
    b = train_batch(b=4)
    scores = model.score_all(b.items, b.cats, b.slots)
    assert scores.shape == (4, INFO.num_items + 1) and (scores[:, 0] <= NEG / 2).all()


def test_ssept_switches_to_cloze_with_users():
    info = DataInfo(num_items=40, num_categories=6, num_slots=26, max_len=12, num_users=64)
    model = build_model("ssept", model_config("ssept", {"dim": 8, "user_dim": 8,
                                                        "attention": "bidirectional"}), info)  # fmt: skip
    assert is_autoencoding(model)
    b = train_batch(b=64)
    b.users = torch.arange(64)
    torch.manual_seed(0)
    assert torch.isfinite(batch_loss(model, b))
    model.eval()
    scores = model.score_all(b.items, b.cats, b.slots, users=b.users)
    assert scores.shape == (64, 41) and (scores[:, 0] <= NEG / 2).all()
