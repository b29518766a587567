"""Hugging Face backbones: causality per mode, the AE/AR combinations offered, learning."""

import pytest
import torch

from lsan.config import ConfigError
from lsan.models import build_model, model_config
from lsan.models.layers import NEG
from tests.test_design_space import INFO, TOY, next_id_accuracy, train_batch

pytest.importorskip("transformers")

CASES = [("hf_gpt2", "causal"), ("hf_llama", "causal"), ("hf_bert", "causal"),
         ("hf_bert", "bidirectional"), ("hf_albert", "bidirectional")]  # fmt: skip


def build(name, attention, info=INFO, **values):
    cfg = model_config(name, {"dim": 16, "attention": attention, "dropout": 0.0, **values})
    return build_model(name, cfg, info).eval()


@pytest.mark.parametrize(("name", "attention"), CASES)
def test_shapes_weights_and_mode(name, attention):
    torch.manual_seed(0)
    model = build(name, attention)
    b = train_batch(b=4)
    scores = model.score_all(b.items, b.cats, b.slots)
    assert scores.shape == (4, INFO.num_items + 1) and (scores[:, 0] <= NEG / 2).all()
    h, weights = model(b.items, b.cats, b.slots, return_weights=True)
    assert len(weights) == 2 and weights[0].shape == (4, 2, 12, 12)
    changed = b.items.clone()
    changed[:, 8:] = torch.randint(1, INFO.num_items + 1, (4, 4))
    with torch.no_grad():
        later = model(changed, b.cats, b.slots)
    same = torch.allclose(h[:, :8], later[:, :8], atol=1e-5)
    assert same == (attention == "causal")  # AR never looks ahead; AE does


@pytest.mark.parametrize(("name", "attention"), [c for c in CASES if c[0] != "hf_llama"])
def test_left_padding_is_invisible(name, attention):
    model = build(name, attention)
    b = train_batch(b=3, t=8)
    pad = lambda x: torch.cat([torch.zeros(x.shape[0], 3, dtype=x.dtype), x], 1)
    with torch.no_grad():
        a = model.score_all(b.items, b.cats, b.slots)
        c = model.score_all(pad(b.items), pad(b.cats), pad(b.slots))
    assert torch.allclose(a, c, atol=1e-4)


@pytest.mark.parametrize(
    ("name", "attention", "message"),
    [("hf_gpt2", "bidirectional", "supports attention causal"),
     ("hf_albert", "causal", "supports attention bidirectional"),
     ("hf_bert", "local", "not 'local'")],
)  # fmt: skip
def test_unsupported_combinations_are_clear_errors(name, attention, message):
    with pytest.raises(ConfigError, match=message):
        build(name, attention)
    with pytest.raises(ConfigError, match="unknown backbone"):
        build("hf_gpt2", "causal", backbone="t5")


@pytest.mark.parametrize(
    ("name", "attention"), [("hf_gpt2", "causal"), ("hf_bert", "bidirectional")]
)
def test_backbones_learn_the_next_id(name, attention):
    assert next_id_accuracy(build(name, attention, TOY, dim=32), steps=200) > 0.25  # chance 0.02
