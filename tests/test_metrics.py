import math

import numpy as np
import pytest

from lsan.metrics import all_metrics, hit_rate, mrr, ndcg


def test_hand_computed_values():
    ranks = np.array([0, 1, 4, 9, 30])  # 0-based ranks of the target
    assert hit_rate(ranks, 1) == pytest.approx(1 / 5)
    assert hit_rate(ranks, 5) == pytest.approx(3 / 5)
    assert hit_rate(ranks, 10) == pytest.approx(4 / 5)
    expected = (1 + 1 / math.log2(3) + 1 / math.log2(6)) / 5
    assert ndcg(ranks, 5) == pytest.approx(expected)
    assert ndcg(ranks, 10) == pytest.approx(expected + (1 / math.log2(11)) / 5)
    assert mrr(ranks, 5) == pytest.approx((1 + 1 / 2 + 1 / 5) / 5)


def test_all_metrics_keys_and_bounds():
    m = all_metrics(np.array([0, 0]), (5, 10))
    assert m == {
        "HR@5": 1.0,
        "NDCG@5": 1.0,
        "MRR@5": 1.0,
        "HR@10": 1.0,
        "NDCG@10": 1.0,
        "MRR@10": 1.0,
    }
    assert all_metrics(np.array([100]), (10,))["NDCG@10"] == 0.0
    assert hit_rate(np.array([], dtype=int), 10) == 0.0
