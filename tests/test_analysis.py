"""Attention analysis: the measures on known answers and the paper's properties, then `lsan analyze`
end to end on tiny checkpoints of every attention kind."""

import json
import math

import numpy as np
import pytest
import torch
from conftest import train_tiny

from lsan.analysis.attention import AnalysisConfig, model_attention
from lsan.analysis.measures import (
    distance_mass,
    low_rank,
    normalized_spectrum,
    sparsity,
    threshold_rank,
    truncation_error,
)
from lsan.checkpoint import load_model
from lsan.cli import main
from lsan.data.prepare import load_dataset

# ---------------------------------------------------------------- sparsity


@pytest.mark.parametrize("n", [1, 4, 50])
def test_sparsity_known_answers(n):
    assert sparsity(np.full(n, 0.3)) == pytest.approx(1 / math.sqrt(n))
    assert sparsity(np.eye(n)[0]) == pytest.approx(1 / n)
    assert sparsity(-np.eye(n)[-1] * 7) == pytest.approx(1 / n)  # magnitudes, any scale


def test_sparsity_of_matrices_flattens_each_one():
    uniform = np.full((5, 5), 1 / 5)  # bidirectional, nothing learned
    one_hot = np.eye(5)  # every query on itself only
    s = sparsity(np.stack([uniform, one_hot]), dims=2)
    assert s.shape == (2,)
    assert s == pytest.approx([1 / 5, 5 / 25 / math.sqrt(5)])  # 1/sqrt(25), (L1/25)/L2
    with pytest.raises(ValueError, match="all-zero"):
        sparsity(np.zeros(3))


def test_sparsity_properties_of_the_paper():
    rng = np.random.default_rng(0)
    for _ in range(200):
        x = rng.random(rng.integers(3, 30)) + 1e-3
        order = np.argsort(x)
        i, j = order[-1], order[0]  # x_i > x_j
        # Property 1 (Robin Hood): moving alpha < (x_i - x_j) / 2 from large to small spreads mass
        alpha = rng.uniform(0.01, 0.99) * (x[i] - x[j]) / 2
        spread = x.copy()
        spread[i] -= alpha
        spread[j] += alpha
        assert sparsity(spread) > sparsity(x)
        # Property 2: growing a dominant entry (the largest always is one) makes x sparser
        grown = x.copy()
        grown[i] += rng.uniform(0.01, 5.0)
        assert sparsity(grown) < sparsity(x)


# ---------------------------------------------------------------- rank


def test_threshold_of_eq8_by_hand():
    s = np.array([3.0, 2.0, 1.0] + [0.1] * 17)
    n = len(s)
    tau = math.sqrt(2 * (s**2).sum() / n**2 * math.log(2 * n))  # sigma = 0: Y = A
    assert 0.1 < tau < 1.0  # 0.51: exactly three values clear it
    r = threshold_rank(np.diag(s), 0.0, np.random.default_rng(0))
    assert r.tau == pytest.approx(tau) and r.k == 3
    assert r.error == pytest.approx(math.sqrt((s[3:] ** 2).sum() / (s**2).sum()))


def test_rank_three_matrix_plus_tiny_noise_has_rank_three():
    rng = np.random.default_rng(1)
    for n in (10, 20, 60):
        u, _ = np.linalg.qr(rng.normal(size=(n, 3)))
        v, _ = np.linalg.qr(rng.normal(size=(n, 3)))
        a = (u * [3.0, 2.0, 1.5]) @ v.T  # singular values 3, 2, 1.5 in random directions
        r = threshold_rank(a, 1e-4, rng)
        assert r.k == 3 and r.error == pytest.approx(0.0, abs=1e-9)


def test_identity_like_matrices_have_full_rank():
    rng = np.random.default_rng(2)
    for n in (8, 20, 100):
        a = np.eye(n) + 0.01 * rng.random((n, n))
        a /= a.sum(1, keepdims=True)  # row-stochastic, like attention
        r = threshold_rank(a, 1e-4, rng)
        assert r.k == n and r.error == pytest.approx(0.0, abs=1e-12)


def test_default_noise_adds_no_rank_to_uniform_attention():
    # the claim behind AnalysisConfig.sigma: up to n = 200 the noise alone never clears tau
    for n in (5, 50, 200):
        r = threshold_rank(np.full((n, n), 1 / n), AnalysisConfig.sigma, np.random.default_rng(3))
        assert r.k == 1
    # whereas noise far above the entries' scale does pass for signal
    r = threshold_rank(np.full((50, 50), 1 / 50), 0.05, np.random.default_rng(3))
    assert r.k > 1


def test_reconstruction_error_matches_explicit_svd_and_is_zero_at_full_rank():
    rng = np.random.default_rng(4)
    a = rng.random((3, 12, 12))
    s = np.linalg.svd(a, compute_uv=False)
    for k in (1, 5, 12):
        explicit = np.linalg.norm(a - low_rank(a, k), axis=(1, 2)) / np.linalg.norm(a, axis=(1, 2))
        assert truncation_error(s, np.full(3, k)) == pytest.approx(explicit, abs=1e-9)
    assert np.allclose(low_rank(a, 12), a)
    assert truncation_error(s, np.full(3, 12)) == pytest.approx([0, 0, 0])
    spec = normalized_spectrum(a)
    assert np.allclose(spec[:, 0], 1.0) and np.all(np.diff(spec, axis=1) <= 0)


# ---------------------------------------------------------------- locality


def test_distance_mass_by_hand():
    causal = np.array([[1.0, 0.0], [0.5, 0.5]])
    assert distance_mass(causal) == pytest.approx([0.0, 1.5, 0.5])  # d = -1, 0, 1
    eye = np.stack([np.eye(4)] * 3)
    mass = distance_mass(eye)
    assert mass[3] == 12 and mass.sum() == 12  # all of it at d = 0


# ---------------------------------------------------------------- end to end

KINDS = {
    "sasrec": {"dim": 16},
    "bert4rec": {"dim": 16, "heads": 2},
    "local": {"dim": 16, "window": 2},
    "lsan": {"dim": 16, "m1": 0},
}
LAYERS_HEADS = {"sasrec": (2, 1), "bert4rec": (2, 2), "local": (2, 1), "lsan": (1, 2)}  # defaults
USERS = 96


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models train several times faster on one thread when the CPUs are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Tiny checkpoints on the synthetic dataset that `lsan analyze` regenerates by name."""
    ds = load_dataset("synthetic")
    root = tmp_path_factory.mktemp("analysis-ck")
    out = {name: train_tiny(name, cfg, ds, root / name, epochs=1) for name, cfg in KINDS.items()}
    out["pop"] = train_tiny("pop", {}, ds, root / "pop", epochs=1)
    return out


def test_analyze_writes_sane_report(checkpoints, tmp_path, capsys):
    out = tmp_path / "analysis"
    paths = [str(checkpoints[n]) for n in ("sasrec", "bert4rec", "local", "pop", "lsan")]
    argv = ["analyze", *paths, "--out", str(out), "--users", str(USERS), "--device", "cpu"]
    assert main([*argv, "--quiet"]) == 0
    record = json.loads((out / "analysis.json").read_text())
    models = {m["model"]: m for m in record["models"]}
    assert list(models) == ["sasrec", "bert4rec", "local", "lsan"]  # pop skipped, order kept
    t = 12  # train_tiny's max_len
    for name, m in models.items():
        assert m["mode"] == ("AR" if name in ("sasrec", "lsan") else "AE")
        assert m["users"] == USERS and m["dataset"] == "synthetic" and m["seed"] == 0
        assert 0 < m["sparsity_mean"] <= 1 and m["sparsity_std"] >= 0
        assert 1 <= m["rank_k_mean"] <= t and 0 <= m["reconstruction_error_mean"] < 1
        assert m["command"].startswith("lsan analyze") and m["git_commit"]
        assert np.array(m["sparsity_per_layer_head"]).shape == LAYERS_HEADS[name]
        share = np.array(m["locality"]["share"])
        assert share.sum() == pytest.approx(1.0, abs=1e-6) and (share >= 0).all()
        assert len(share) == (t if m["mode"] == "AR" else 2 * t - 1)
    # the local model cannot look further than its window (2) on either side
    local = models["local"]["locality"]
    far = [s for d, s in zip(local["distance"], local["share"], strict=True) if abs(d) > 2]
    assert max(far) < 1e-6
    md = (out / "analysis.md").read_text()
    assert "| Model/Dataset | synthetic | Avg." in md and "| bert4rec (AE) " in md
    for png in record["pictures"]:
        assert (out / png).stat().st_size > 10_000 and f"]({png})" in md
    err = capsys.readouterr().err
    assert "skipped" in err and "'pop'" in err and "Traceback" not in err


def test_real_block_only(checkpoints):
    """n counts the real items (+ [MASK] for AE); the blocks are row-stochastic and causal for AR."""
    ds = load_dataset("synthetic")
    cfg = AnalysisConfig(users=64, seed=5)
    for name in ("sasrec", "bert4rec"):
        model, run, info = load_model(checkpoints[name])
        r = model_attention(model, run.model_name, ds, info.max_len, cfg, torch.device("cpu"))
        users = np.sort(np.random.default_rng(5).choice(ds.num_users, 64, replace=False))
        history = ds.lengths[users] - 2  # validation history
        expected = np.minimum(history + (name == "bert4rec"), info.max_len)
        assert (r.lengths == expected).all() and (r.lengths < info.max_len).any()
        assert r.sparsity.min() >= 1 / r.lengths.max() ** 2
        if name == "sasrec":  # nothing of a causal model's mass lies ahead of the query
            assert r.locality[: info.max_len - 1].max() < 1e-6


def test_user_mistakes_are_one_line(checkpoints, tmp_path, capsys):
    cases = [
        ["analyze", str(tmp_path / "missing"), "--out", str(tmp_path / "a")],
        ["analyze", str(checkpoints["pop"]), "--out", str(tmp_path / "b")],
        ["analyze", str(checkpoints["sasrec"]), "--out", str(tmp_path / "c"), "--users", "0"],
    ]
    for argv in cases:
        assert main([*argv, "--quiet", "--device", "cpu"]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("error: ") and "Traceback" not in "".join(err), (argv, err)
    assert not (tmp_path / "a").exists()
