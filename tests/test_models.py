import pytest
import torch

from lsan.models import MODELS, DataInfo, build_model, model_config
from lsan.models.layers import NEG, attention_mask
from lsan.models.objectives import uses_users

INFO = DataInfo(num_items=40, num_categories=6, num_slots=26, max_len=12, num_users=5)
NEURAL = [name for name in MODELS if name != "pop"]
CAUSAL = [n for n in NEURAL if getattr(model_config(n), "attention", "causal") == "causal"]
BIDIRECTIONAL = [n for n in NEURAL if getattr(model_config(n), "attention", "") == "bidirectional"]


def batch(b=3, t=12, seed=0, info=INFO):
    g = torch.Generator().manual_seed(seed)
    items = torch.randint(1, info.num_items + 1, (b, t), generator=g)
    items[0, :5] = 0  # left padding in one row
    cats = torch.randint(2, info.num_categories, (b, t), generator=g) * (items != 0)
    slots = torch.randint(2, info.num_slots, (b, t), generator=g) * (items != 0)
    return items, cats, slots


def user_kw(model, b=3):
    """users= for models with user embeddings (rows get distinct user ids), else nothing."""
    return {"users": torch.arange(b) % INFO.num_users} if uses_users(model) else {}


def test_attention_mask_never_empty_and_causal():
    items = torch.tensor([[0, 0, 3, 4]])
    m = attention_mask(items, "causal").additive
    assert m.shape == (1, 1, 4, 4)
    assert torch.all((m == 0).any(-1))  # every row has somewhere to look
    assert m[0, 0, 2, 3] == NEG and m[0, 0, 3, 2] == 0 and m[0, 0, 3, 0] == NEG
    local = attention_mask(torch.tensor([[1, 2, 3, 4, 5]]), "local", window=1).additive
    assert local[0, 0, 2].tolist() == [NEG, 0, 0, 0, NEG]
    with pytest.raises(ValueError, match="unknown attention mode"):
        attention_mask(items, "sideways")


@pytest.mark.parametrize("name", NEURAL)
def test_shapes_and_pad_column(name):
    model = build_model(name, model_config(name), INFO).eval()
    items, cats, slots = batch()
    kw = user_kw(model)
    h = model(items, cats, slots, **kw)
    assert h.shape[:2] == items.shape
    scores = model.score_all(items, cats, slots, **kw)
    assert scores.shape == (3, INFO.num_items + 1)
    assert torch.all(scores[:, 0] <= NEG / 2) and torch.isfinite(scores).all()
    targets = torch.roll(items, -1, 1)
    loss = model.loss(items, cats, slots, targets, **kw)
    assert loss.ndim == 0 and torch.isfinite(loss)


def outputs_before_after_change(name):
    """Hidden states of a batch, and of the same batch with the items from position 8 on changed."""
    torch.manual_seed(0)
    model = build_model(name, model_config(name), INFO).eval()
    items, cats, slots = batch()
    changed = items.clone()
    changed[:, 8:] = torch.randint(1, INFO.num_items + 1, changed[:, 8:].shape)
    kw = user_kw(model)
    with torch.no_grad():
        return model(items, cats, slots, **kw), model(changed, cats, slots, **kw)


@pytest.mark.parametrize("name", CAUSAL)
def test_causal_outputs_ignore_later_items(name):
    a, b = outputs_before_after_change(name)
    assert torch.allclose(a[:, :8], b[:, :8], atol=1e-5)
    assert not torch.allclose(a[:, 8:], b[:, 8:], atol=1e-5)


@pytest.mark.parametrize("name", NEURAL)
def test_extra_left_padding_changes_nothing(name):
    model = build_model(name, model_config(name), INFO).eval()
    items, cats, slots = batch(t=8)
    pad = lambda x: torch.cat([torch.zeros(x.shape[0], 4, dtype=x.dtype), x], 1)
    with torch.no_grad():
        a = model.score_all(items, cats, slots, **user_kw(model))
        b = model.score_all(pad(items), pad(cats), pad(slots), **user_kw(model))
    # positions are absolute from the right, so padding on the left is invisible
    assert torch.allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("name", BIDIRECTIONAL)
def test_bidirectional_outputs_see_later_items(name):
    a, b = outputs_before_after_change(name)
    assert not torch.allclose(a[:, 5:8], b[:, 5:8], atol=1e-5)


@pytest.mark.parametrize("name", ["sasrec", "bert4rec"])
def test_sasrec_reads_time_slots_only_with_use_time(name):
    """model.use_time: each position's slot embedding joins its input (causal: a slot changes
    that position and later ones only); off, the published model ignores the slots. A model
    that reads slots and is given none says so."""
    items, cats, slots = batch()
    other = slots.clone()
    other[:, 8:] = torch.where(other[:, 8:] > 0, (other[:, 8:] + 5) % (INFO.num_slots - 2) + 2, 0)
    for use_time in (False, True):
        torch.manual_seed(0)
        cfg = model_config(name, {"use_time": use_time})
        model = build_model(name, cfg, INFO).eval()
        with torch.no_grad():
            a, b = model(items, cats, slots), model(items, cats, other)
        assert torch.allclose(a, b) != use_time
        if use_time and name == "sasrec":
            assert torch.allclose(a[:, :8], b[:, :8], atol=1e-6)
            assert "slot.weight" in model.state_dict()
            with pytest.raises(ValueError, match="reads the time slots"):
                model(items)
