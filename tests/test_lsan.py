import math

import pytest
import torch

from lsan.models import DataInfo, build_model, model_config
from lsan.models.item_tables import QRTable as CompositionalEmbedding
from lsan.models.item_tables import mixed_radix, table_sizes

INFO = DataInfo(num_items=97, num_categories=7, num_slots=26, max_len=10)


@pytest.mark.parametrize(("tables", "m1"), [(2, 2), (2, 3), (2, 8), (2, 0), (3, 0), (3, 4)])
def test_every_item_has_a_unique_code(tables, m1):
    sizes = table_sizes(INFO.num_items + 1, tables, m1)
    assert len(sizes) == tables and math.prod(sizes) >= INFO.num_items + 1
    if m1:
        assert sizes[0] == m1 and sizes[1] >= math.ceil(
            (INFO.num_items + 1) / m1 / max(sizes[2:] or [1])
        )
    codes = mixed_radix(torch.arange(INFO.num_items + 1), sizes)
    assert codes.shape == (INFO.num_items + 1, tables)
    assert len({tuple(c) for c in codes.tolist()}) == INFO.num_items + 1
    for n, m in enumerate(sizes):
        assert int(codes[:, n].max()) < m


def test_balanced_tables_are_small():
    assert table_sizes(12102, 2) == [111, 110]
    assert max(table_sizes(1_000_001, 3)) <= 101


def test_padding_vector_is_zero_and_codes_match_formula():
    emb = CompositionalEmbedding(INFO.num_items, 8, 2, m1=3, item_weights=True)
    emb.reset(0.1)
    items = torch.tensor([[0, 1, 5, 97]])
    base = emb.base(items)
    assert torch.all(base[0, 0] == 0)
    v = 5
    assert torch.equal(base[0, 2, 0], emb.tables[0][v % 3]) and torch.equal(
        base[0, 2, 1], emb.tables[1][v // 3]
    )


@pytest.mark.parametrize("tables,m1", [(2, 2), (2, 0), (3, 0)])
def test_factorised_scores_equal_naive_matrix(tables, m1):
    torch.manual_seed(0)
    emb = CompositionalEmbedding(INFO.num_items, 16, tables, m1, item_weights=True)
    emb.reset(0.5)
    with torch.no_grad():
        emb.item_weights.uniform_(0.5, 1.5)
        emb.item_bias.normal_()
    h = torch.randn(5, 16)
    naive = h @ emb.matrix().T + emb.item_bias
    assert torch.allclose(emb.scores(h), naive, atol=1e-5)


def lsan(**kw):
    name = "lsan_full" if kw.pop("full", False) else "lsan"
    return build_model(name, model_config(name, {"dim": 16, "dropout": 0.0, **kw}), INFO).eval()


def batch(seed=0, b=3, t=10):
    g = torch.Generator().manual_seed(seed)
    items = torch.randint(1, INFO.num_items + 1, (b, t), generator=g)
    items[0, :4] = 0
    cats = torch.randint(2, INFO.num_categories, (b, t), generator=g) * (items != 0)
    slots = torch.randint(2, INFO.num_slots, (b, t), generator=g) * (items != 0)
    return items, cats, slots


@pytest.mark.parametrize(
    "variant", [{}, {"conv": False}, {"heads": 1, "kernel": 5}, {"full": True}]
)
def test_outputs_at_t_ignore_items_after_t(variant):
    torch.manual_seed(1)
    model = lsan(**variant)
    items, cats, slots = batch()
    late = items.clone(), cats.clone(), slots.clone()
    late[0][:, 6:] = torch.randint(1, INFO.num_items + 1, (3, 4))
    late[1][:, 6:] = 3
    late[2][:, 6:] = 9
    with torch.no_grad():
        a, b = model(items, cats, slots), model(*late)
    assert torch.allclose(a[:, :6], b[:, :6], atol=1e-5)
    assert not torch.allclose(a[:, 6:], b[:, 6:], atol=1e-4)


def test_conv_branch_alone_is_causal():
    from lsan.models.layers import CausalDepthwiseConv

    conv = CausalDepthwiseConv(4, 2, 3)
    x = torch.randn(2, 8, 4)
    y = x.clone()
    y[:, 5:] += 1.0
    assert torch.allclose(conv(x)[:, :5], conv(y)[:, :5]) and not torch.allclose(
        conv(x)[:, 5:], conv(y)[:, 5:]
    )


def test_left_padding_invariance():
    model = lsan()
    items, cats, slots = batch(t=6)
    pad = lambda x: torch.cat([torch.zeros(x.shape[0], 4, dtype=x.dtype), x], 1)
    with torch.no_grad():
        assert torch.allclose(
            model.score_all(items, cats, slots),
            model.score_all(pad(items), pad(cats), pad(slots)),
            atol=1e-4,
        )


def test_context_changes_the_prediction_and_ablation_ignores_it():
    items, cats, slots = batch()
    other = torch.where(slots > 0, (slots + 5) % 24 + 2, slots)
    with torch.no_grad():
        full = lsan()
        assert not torch.allclose(
            full.score_all(items, cats, slots), full.score_all(items, cats, other)
        )
        torch.manual_seed(0)
        no_time = lsan(use_time=False)
        assert torch.allclose(
            no_time.score_all(items, cats, slots), no_time.score_all(items, cats, other)
        )
        # model.time_residual reads the slots outside the fusion: they count again
        residual = lsan(use_time=False, time_residual=True)
        assert not torch.allclose(
            residual.score_all(items, cats, slots), residual.score_all(items, cats, other)
        )


def expected_params(cfg, info):
    d, h, n_items = cfg.dim, cfg.heads, info.num_items + 1
    if cfg.full_table:
        emb = n_items * d
    else:
        emb = sum(table_sizes(n_items, cfg.tables, cfg.m1)) * d + (
            n_items * (cfg.tables + 1) if cfg.item_weights else 0
        )
    ctx = (
        (2 * info.num_categories * d if cfg.use_category else 0)
        + (info.num_slots * d if cfg.use_time else 0)
        + (info.num_slots * d if cfg.time_residual else 0)
    )
    fusion = ctx + d + (d * d + d) + (2 * d * d + d)  # const, query, inject
    branches = 2 if cfg.conv else 1
    twin = (
        (d * 3 * h * d + 3 * h * d)
        + (branches * h * d * d + d)
        + ((h * d * cfg.kernel + h * d) if cfg.conv else 0)
    )
    f = cfg.ffn_mult * d
    block = twin + 2 * (2 * d) + (d * f + f) + (f * d + d)  # two layer norms, FFN (D -> fD -> D)
    return emb + fusion + info.max_len * d + cfg.layers * block + 2 * d


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"m1": 0},
        {"tables": 3, "m1": 0},
        {"conv": False},
        {"use_time": False, "use_category": False},
        {"item_weights": False},
        {"full": True},
        {"layers": 2, "heads": 1},
        {"ffn_mult": 4},
        {"time_residual": True},
        {"full": True, "use_time": False, "time_residual": True},
    ],
)
def test_parameter_count_matches_formula(kw):
    model = lsan(**kw)
    assert sum(p.numel() for p in model.parameters()) == expected_params(model.cfg, INFO)


def test_compositional_is_much_smaller_than_full():
    big = DataInfo(num_items=12101, num_categories=9, num_slots=9, max_len=50)
    count = lambda name, **kw: sum(
        p.numel() for p in build_model(name, model_config(name, kw), big).parameters()
    )
    full, m2, bal = count("lsan_full"), count("lsan", m1=2), count("lsan", m1=0)
    assert m2 < 0.65 * full and bal < 0.25 * full


def test_matrix_training_scores_give_the_factorised_loss():

    info = DataInfo(num_items=97, num_categories=5, num_slots=9, max_len=10)
    torch.manual_seed(0)
    fact = build_model("lsan", model_config("lsan", {"dim": 16, "m1": 3}), info).eval()
    mat = build_model(
        "lsan", model_config("lsan", {"dim": 16, "m1": 3, "train_scores": "matrix"}), info
    ).eval()
    mat.load_state_dict(fact.state_dict())
    with torch.no_grad():
        for p in fact.parameters():
            p.add_(0.05 * torch.randn_like(p))
        mat.load_state_dict(fact.state_dict())
    items = torch.randint(1, 98, (4, 10))
    items[0, :4] = 0
    targets = torch.roll(items, -1, 1).masked_fill(items == 0, 0)
    a = fact.loss(items, items % 5, items % 9, targets)
    b = mat.loss(items, items % 5, items % 9, targets)
    assert torch.allclose(a, b, atol=1e-5)
    with pytest.raises(ValueError, match="train_scores"):
        build_model("lsan", model_config("lsan", {"dim": 16, "train_scores": "dense"}), info)


def test_one_base_vector_skips_the_fusion_query_with_the_same_numbers():
    """LSAN_full fuses one base vector: softmax over one logit is exactly 1, so the skipped
    query changes nothing (test_export checks that it leaves the graph)."""
    model = lsan(full=True)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    items, cats, slots = batch()
    fusion = model.fusion
    base = model.base(items)
    c = fusion.context(cats, slots)
    q = fusion.query(c)
    logits = (base @ q.unsqueeze(-1)).squeeze(-1) / q.shape[-1] ** 0.5
    e = (torch.softmax(logits, dim=-1).unsqueeze(-1) * base).sum(-2)
    written_out = e + torch.nn.functional.gelu(fusion.inject(torch.cat([e, c], dim=-1)))
    with torch.no_grad():
        assert torch.equal(fusion(base, cats, slots), written_out)
    model.train()
    model.loss(items, cats, slots, torch.roll(items, -1, 1)).backward()
    assert fusion.query.weight.grad is None  # not in the computation at all


@pytest.mark.parametrize(
    "variant",
    [{"full": True}, {}, {"full": True, "heads": 1, "kernel": 5}, {"full": True, "conv": False},
     {"full": True, "use_category": False, "use_time": False}, {"full": True, "ffn_mult": 3},
     {"full": True, "time_residual": True}, {"time_residual": True}],
)  # fmt: skip
@pytest.mark.parametrize("t", [1, 2, 10])
def test_the_inference_form_scores_like_the_model(variant, t):
    """Export's copy (convolution folded into the output projection at the last position,
    context tables projected through the injection for one base vector) gives the model's
    scores, also for histories shorter than the convolution window, and leaves it untouched."""
    model = lsan(**variant)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    form = model.inference_form()
    items, cats, slots = (x[:, -t:] for x in batch())
    with torch.no_grad():
        want, got = model.score_all(items, cats, slots), form.score_all(items, cats, slots)
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.equal(got.topk(10).indices, want.topk(10).indices)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    twin = form.blocks[-1].twin
    assert (twin.last_out is None) == (variant.get("conv") is False)
    assert form.fusion.projected == variant.get("full", False)
    assert (form.fusion.temperature == 1.0) != form.fusion.projected
