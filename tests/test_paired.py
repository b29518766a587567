"""Paired comparisons: a real gap is found, the same ranker is no gap, the interval is honest."""

import numpy as np
import pytest

from lsan.metrics import ndcg
from lsan.paired import paired


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
