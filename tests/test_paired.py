"""Paired comparisons: a real gap is found, the same ranker is no gap, the interval is honest."""

import numpy as np
import pytest

from lsan.metrics import ndcg, user_ndcg
from lsan.paired import paired, user_scores


def ranks(rng: np.random.Generator, users: int, hit: float) -> np.ndarray:
    """Targets ranked 0..9 with probability `hit`, else far down the list."""
    r = rng.integers(0, 10, users)
    return np.where(rng.random(users) < hit, r, 500)


def test_a_clear_gap_is_found_and_its_interval_holds_the_true_difference():
    rng = np.random.default_rng(0)
    b = ranks(rng, 20_000, 0.08)
    better = np.where(rng.random(len(b)) < 0.3, np.minimum(b, rng.integers(0, 10, len(b))), b)
    res = paired(better, b)
    assert res.delta == pytest.approx(ndcg(better, 10) - ndcg(b, 10))
    assert res.ci95[0] > 0 and res.p_value < 1e-6
    assert res.ci95[0] < res.delta < res.ci95[1]
    assert res.relative == pytest.approx(res.delta / ndcg(b, 10))


def test_two_draws_of_the_same_ranker_are_not_called_different():
    rng = np.random.default_rng(1)
    base = ranks(rng, 20_000, 0.08)
    noisy = np.where(rng.random(len(base)) < 0.05, ranks(rng, len(base), 0.08), base)
    res = paired(noisy, base)
    assert res.ci95[0] < 0 < res.ci95[1] or abs(res.delta) < 1e-3
    assert res.p_value > 0.001
    assert paired(base, base).as_dict() == {
        "delta": 0.0,
        "relative": 0.0,
        "ci95": [0.0, 0.0],
        "p_value": 1.0,
        "users": len(base),
    }


def test_unpaired_inputs_are_refused():
    with pytest.raises(ValueError, match="same users"):
        paired(np.zeros(5), np.zeros(6))
    with pytest.raises(ValueError, match="same users"):  # three seeds of 5 users against 6
        paired(np.zeros((3, 5)), np.zeros(6))
    with pytest.raises(ValueError, match="same users"):  # no third axis
        paired(np.zeros((2, 3, 5)), np.zeros((2, 3, 5)))


def test_seeds_are_pooled_user_by_user():
    """Three seeds of each of two recipes (independent draws, hit rates 0.10 and 0.08): each
    user's NDCG@10 is averaged over the seeds before pairing, so the difference is the mean of
    the three single-seed differences and the seeds' noise shrinks the interval."""
    rng = np.random.default_rng(2)
    a = np.stack([ranks(rng, 20_000, 0.10) for _ in range(3)])
    b = np.stack([ranks(rng, 20_000, 0.08) for _ in range(3)])
    assert np.array_equal(user_scores(np.stack([a[0], a[0]]), 10), user_ndcg(a[0], 10))
    pooled = paired(a, b)
    singles = [paired(x, y) for x, y in zip(a, b, strict=True)]
    assert pooled.delta == pytest.approx(np.mean([s.delta for s in singles]), abs=1e-12)
    assert pooled.users == 20_000

    def width(r):
        return r.ci95[1] - r.ci95[0]

    assert width(pooled) < 0.7 * min(width(s) for s in singles)  # about 1 / sqrt(3)
    assert pooled.p_value < max(s.p_value for s in singles)
    # one side pooled, the other a single checkpoint: the same users still pair
    assert paired(a, b[0]).delta == pytest.approx(user_scores(a, 10).mean() - ndcg(b[0], 10))
