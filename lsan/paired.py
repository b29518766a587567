"""Is a gap in NDCG@10 more than noise? Two rankers compared user by user on the same test split.

Every ranker here is evaluated on the same users, so the honest question about a 1-2% gap is a
paired one: the mean of the per-user NDCG@10 differences, a bootstrap confidence interval of that
mean (users resampled, scipy.stats.bootstrap) and the paired t-test's p-value (scipy.stats.
ttest_rel; with tens of thousands of users the mean difference is close to normal). On Beauty one
user's NDCG@10 is 0 for about nine users in ten, so an unpaired standard error of a single
model's NDCG@10 is about 0.0011, 2% of the figure; pairing removes the users both rankers get
equally right or wrong.

One seed is itself a sample: a recipe's several checkpoints (seeds) are compared at once by
averaging each user's NDCG@10 over them first (`user_scores` of ranks shaped (checkpoints,
users)), so the test asks whether the recipes differ, with the seeds' noise averaged down.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lsan.metrics import user_ndcg


@dataclass(frozen=True)
class Paired:
    """NDCG@k of `a` minus that of `b` on the same users."""

    delta: float  # mean per-user difference (= NDCG@k of a - NDCG@k of b)
    relative: float  # delta / NDCG@k of b
    ci95: tuple[float, float]  # bootstrap 95% interval of delta
    p_value: float  # paired t-test, two-sided
    users: int

    def as_dict(self) -> dict[str, float | int | list[float]]:
        return {"delta": self.delta, "relative": self.relative, "ci95": list(self.ci95),
                "p_value": self.p_value, "users": self.users}  # fmt: skip

    def describe(self) -> str:
        return shown(self.as_dict())


def shown(d: dict) -> str:
    """`Paired.as_dict()` (as stored in results files) in one line: delta [interval] p."""
    lo, hi = d["ci95"]
    return f"{d['delta']:+.4f} [{lo:+.4f}, {hi:+.4f}] p={d['p_value']:.2g}"


def user_scores(ranks: np.ndarray, k: int) -> np.ndarray:
    """Each user's NDCG@k from ranks (users,), or from several checkpoints' ranks (checkpoints,
    users) the mean over the checkpoints: one recipe's seeds pooled user by user."""
    s = user_ndcg(ranks, k)
    return s.mean(axis=0) if s.ndim == 2 else s


def paired(
    a_ranks: np.ndarray, b_ranks: np.ndarray, k: int = 10, resamples: int = 2000, seed: int = 0
) -> Paired:
    """Compare rankers a and b from their targets' ranks, user i of one = user i of the other;
    either side may be several checkpoints, (checkpoints, users) (see `user_scores`)."""
    from scipy import stats

    a, b = user_scores(a_ranks, k), user_scores(b_ranks, k)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 2:
        raise ValueError(f"paired ranks need the same users (>= 2): got {a.shape} and {b.shape}")
    d = a - b
    base = float(b.mean())
    if not d.any():  # identical rankings: no spread to resample, nothing to test
        return Paired(0.0, 0.0, (0.0, 0.0), 1.0, len(d))
    ci = stats.bootstrap(
        (d,), np.mean, n_resamples=resamples, method="percentile", batch=200,
        random_state=np.random.default_rng(seed),
    ).confidence_interval  # fmt: skip
    p = float(stats.ttest_rel(a, b).pvalue)
    return Paired(
        delta=float(d.mean()), relative=float(d.mean() / base) if base > 0 else 0.0,
        ci95=(float(ci.low), float(ci.high)), p_value=p, users=len(d),
    )  # fmt: skip
