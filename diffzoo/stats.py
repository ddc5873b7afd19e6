"""Two-sample statistics for per-seed results: Welch's t, an exact permutation test and Holm's correction.

Every comparison in the study is two small samples of per-seed values (one per training seed) of the
same metric, e.g. five differential runs against five softmax runs::

    from diffzoo.stats import compare, holm

    c = compare([84.1, 85.0, 84.7], [83.2, 83.9, 83.5])
    c.diff, c.ci_low, c.ci_high     # difference of means (a - b) and its 95 % Welch interval
    c.t, c.df, c.p_welch            # Welch's t, its degrees of freedom, two-sided p
    c.p_perm, c.perm_exact          # permutation p over every split of the 6 values (exact: True)
    holm([0.01, 0.04, 0.03])        # family-wise adjusted p-values, same order

The permutation test uses the difference of means as its statistic and counts the splits whose
absolute difference is at least the observed one (two-sided). With up to ``EXACT_LIMIT`` distinct
splits every split is enumerated (3 vs 3 fully separated gives exactly 2/20 = 0.1); beyond that a
seeded Monte Carlo sample of splits is drawn and ``p = (hits + 1) / (resamples + 1)``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as _st

__all__ = ["EXACT_LIMIT", "Comparison", "compare", "describe", "holm", "permutation_p", "welch"]

# Enumerate every split when there are at most this many (10 + 10 seeds: C(20, 10) = 184,756).
EXACT_LIMIT = 200_000


def _array(values: Sequence[float], name: str) -> np.ndarray:
    a = np.asarray(values, dtype=float).ravel()
    if a.size == 0:
        raise ValueError(f"{name} is empty; pass at least one per-seed value")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} holds non-finite values {a.tolist()}; drop diverged runs or report them apart")
    return a


def describe(values: Sequence[float]) -> tuple[float, float, int]:
    """``(mean, sample standard deviation (ddof=1; nan for one value), n)``."""
    a = _array(values, "values")
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else float("nan"), int(a.size)


def welch(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> dict[str, float]:
    """Welch's unequal-variance t-test of ``mean(a) - mean(b)``.

    Returns ``diff``, ``ci_low``, ``ci_high`` (the ``confidence`` interval of the difference), ``t``,
    ``df`` (Welch-Satterthwaite) and the two-sided ``p``. Needs two values per sample; when both
    samples have zero spread the difference is exact (``p`` 0 if the means differ, 1 if not).
    """
    x, y = _array(a, "a"), _array(b, "b")
    diff = float(x.mean() - y.mean())
    nan = float("nan")
    if x.size < 2 or y.size < 2:
        return dict(diff=diff, ci_low=nan, ci_high=nan, t=nan, df=nan, p=nan)
    va, vb = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    se = math.sqrt(va + vb)
    if se == 0.0:
        t = math.copysign(math.inf, diff) if diff else nan
        return dict(diff=diff, ci_low=diff, ci_high=diff, t=t, df=nan, p=0.0 if diff else 1.0)
    df = (va + vb) ** 2 / (va ** 2 / (x.size - 1) + vb ** 2 / (y.size - 1))
    t = diff / se
    p = float(2 * _st.t.sf(abs(t), df))
    half = float(_st.t.ppf(0.5 + confidence / 2, df)) * se
    return dict(diff=diff, ci_low=diff - half, ci_high=diff + half, t=float(t), df=float(df), p=p)


def permutation_p(
    a: Sequence[float], b: Sequence[float], resamples: int = 20_000, seed: int = 0, exact_limit: int = EXACT_LIMIT
) -> tuple[float, bool, int]:
    """Two-sided permutation p of the difference of means.

    Returns ``(p, exact, count)``: ``exact`` is True when all ``count`` splits of the pooled values
    into groups of ``len(a)`` and ``len(b)`` were enumerated; otherwise ``count`` = ``resamples``
    random splits (seeded by ``seed``) were drawn.
    """
    x, y = _array(a, "a"), _array(b, "b")
    pooled = np.concatenate([x, y])
    n, na = pooled.size, x.size
    total = pooled.sum()
    observed = abs(x.mean() - y.mean())
    tol = 1e-9 * max(1.0, float(np.abs(pooled).max()))  # ties in floating point count as at least as extreme
    splits = math.comb(n, na)

    def stat(sums_a: np.ndarray) -> np.ndarray:
        return np.abs(sums_a / na - (total - sums_a) / (n - na))

    if splits <= exact_limit:
        idx = np.fromiter(itertools.chain.from_iterable(itertools.combinations(range(n), na)), dtype=np.int64)
        sums = pooled[idx.reshape(splits, na)].sum(1)
        hits = int(np.count_nonzero(stat(sums) >= observed - tol))
        return hits / splits, True, splits
    if resamples < 1:
        raise ValueError(f"resamples={resamples} must be >= 1 when there are {splits} splits (> exact_limit)")
    rng = np.random.default_rng(seed)
    keys = rng.random((resamples, n))
    first = np.argpartition(keys, na - 1, axis=1)[:, :na]
    hits = int(np.count_nonzero(stat(pooled[first].sum(1)) >= observed - tol))
    return (hits + 1) / (resamples + 1), False, resamples


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (same order as given); nan entries stay nan and do not count."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, np.nan)
    valid = np.flatnonzero(~np.isnan(p))
    m = valid.size
    running = 0.0
    for rank, i in enumerate(valid[np.argsort(p[valid], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out.tolist()


@dataclass(frozen=True)
class Comparison:
    """Statistics of ``a`` against ``b`` (differences are ``a - b``)."""

    n_a: int
    n_b: int
    mean_a: float
    mean_b: float
    sd_a: float
    sd_b: float
    diff: float
    ci_low: float
    ci_high: float
    t: float
    df: float
    p_welch: float
    p_perm: float
    perm_exact: bool
    perm_count: int
    confidence: float = 0.95

    def as_dict(self) -> dict:
        return asdict(self)


def compare(
    a: Sequence[float], b: Sequence[float], confidence: float = 0.95, resamples: int = 20_000, seed: int = 0
) -> Comparison:
    """Mean, sd and n of each sample, Welch's interval/t/p and the permutation p of ``a`` vs ``b``."""
    (ma, sa, na), (mb, sb, nb) = describe(a), describe(b)
    w = welch(a, b, confidence)
    p_perm, exact, count = permutation_p(a, b, resamples=resamples, seed=seed)
    return Comparison(
        n_a=na, n_b=nb, mean_a=ma, mean_b=mb, sd_a=sa, sd_b=sb, diff=w["diff"], ci_low=w["ci_low"],
        ci_high=w["ci_high"], t=w["t"], df=w["df"], p_welch=w["p"], p_perm=p_perm, perm_exact=exact,
        perm_count=count, confidence=confidence,
    )
