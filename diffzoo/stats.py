"""Two-sample statistics for per-seed results: Welch's t, an exact permutation test and Holm's correction.

Every comparison in the study is two small samples of per-seed values (one per training seed) of the
same metric, e.g. five differential runs against five softmax runs::

    from diffzoo.stats import compare, fisher_exact, holm

    c = compare([84.1, 85.0, 84.7], [83.2, 83.9, 83.5])
    c.diff, c.ci_low, c.ci_high     # difference of means (a - b) and its 95 % Welch interval
    c.t, c.df, c.p_welch            # Welch's t, its degrees of freedom, two-sided p
    c.p_perm, c.perm_exact          # permutation p over every split of the 6 values (exact: True)
    holm([0.01, 0.04, 0.03])        # family-wise adjusted p-values, same order
    fisher_exact(2, 8, 7, 8)        # Fisher's exact p: 2 of 8 runs succeed against 7 of 8
    welch_contrast([a1, b1, a2, b2], [1, -1, -1, 1])  # does the gap a - b differ between two conditions?

The permutation test uses the difference of means as its statistic and counts the splits whose
absolute difference is at least the observed one (two-sided). With up to ``EXACT_LIMIT`` distinct
splits every split is enumerated (3 vs 3 fully separated gives exactly 2/20 = 0.1); beyond that a
seeded Monte Carlo sample of splits is drawn and ``p = (hits + 1) / (resamples + 1)``.

Two statistics take per-clip results (one 0/1 correctness per test clip and run) instead of one value per
run, for test sets whose clips come in clusters (the speech task's few unseen voices) or carry a condition
(the SNR each clip was mixed at)::

    from diffzoo.stats import cluster_bootstrap_diff, snr_interaction

    b = cluster_bootstrap_diff(a_runs, b_runs, voices)   # seeds x clips of each variant, a voice per clip
    b.diff, b.ci_low, b.ci_high, b.p                     # accuracy a - b, percentile 95 % CI, bootstrap p
    s = snr_interaction(a_runs, b_runs, snrs)            # does a's advantage change with the SNR?
    s.diff, s.p_perm                                     # slope a - slope b (log-odds per dB), permutation p
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy import stats as _st
from scipy.special import expit as _expit

__all__ = ["EXACT_LIMIT", "ClusterBootstrap", "Comparison", "SnrInteraction", "cluster_bootstrap_diff", "compare",
           "describe", "fisher_exact", "holm", "permutation_p", "snr_interaction", "welch"]

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
    return welch_contrast([a, b], [1.0, -1.0], confidence, names=("a", "b"))


def welch_contrast(
    groups: Sequence[Sequence[float]], weights: Sequence[float], confidence: float = 0.95,
    names: Sequence[str] | None = None,
) -> dict[str, float]:
    """Welch's t for a contrast of independent groups' means, ``sum(w_i * mean(groups[i]))``.

    The standard error adds each group's ``w_i**2 * var_i / n_i``; the degrees of freedom are
    Satterthwaite's. :func:`welch` is the two-group case ``(1, -1)``; ``(1, -1, -1, 1)`` over
    ``(a1, b1, a2, b2)`` asks whether the gap ``a - b`` differs between two conditions. Returns the same keys
    as :func:`welch`, with the same rules for groups of fewer than two values and for no spread at all.
    """
    if len(groups) != len(weights) or not groups:
        raise ValueError(f"{len(groups)} groups and {len(weights)} weights: pass one weight per group")
    arrays = [_array(g, name) for g, name in zip(groups, names or [f"group {i}" for i in range(len(groups))])]
    diff = sum(float(w * x.mean()) for w, x in zip(weights, arrays))
    nan = float("nan")
    if min(x.size for x in arrays) < 2:
        return dict(diff=diff, ci_low=nan, ci_high=nan, t=nan, df=nan, p=nan)
    var = [w * w * x.var(ddof=1) / x.size for w, x in zip(weights, arrays)]
    total = sum(var)
    se = math.sqrt(total)
    if se == 0.0:
        t = math.copysign(math.inf, diff) if diff else nan
        return dict(diff=diff, ci_low=diff, ci_high=diff, t=t, df=nan, p=0.0 if diff else 1.0)
    df = total ** 2 / sum(v ** 2 / (x.size - 1) for v, x in zip(var, arrays))
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


def fisher_exact(k_a: int, n_a: int, k_b: int, n_b: int) -> float:
    """Two-sided p of Fisher's exact test that ``k_a`` successes in ``n_a`` runs and ``k_b`` in ``n_b`` come from
    one success rate (every table with the same margins that is no more likely than the observed one counts).
    For outcomes that split into two kinds, such as runs that learn a task and runs that stay at chance."""
    for k, n, name in ((k_a, n_a, "a"), (k_b, n_b, "b")):
        if int(k) != k or int(n) != n or not 0 <= k <= n or n < 1:
            raise ValueError(f"fisher_exact: sample {name} needs 0 <= successes <= runs and runs >= 1, got {k} of {n}")
    return float(_st.fisher_exact([[k_a, n_a - k_a], [k_b, n_b - k_b]]).pvalue)


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


# -- per-clip results: clusters of clips (voices) and a condition per clip (SNR) ----------------------------------
def _runs_matrix(runs: Sequence[Sequence[float]], name: str) -> np.ndarray:
    """``runs`` (one sequence of per-clip values per run) as a ``(runs, clips)`` float array."""
    try:
        m = np.asarray([np.asarray(r, dtype=float).ravel() for r in runs], dtype=float)
    except ValueError as e:  # ragged
        raise ValueError(f"{name}: every run needs one value per test clip, the same clips in the same order") from e
    if m.ndim != 2 or m.shape[0] == 0 or m.shape[1] == 0:
        raise ValueError(f"{name} is empty; pass at least one run with at least one clip")
    if not np.all(np.isfinite(m)):
        raise ValueError(f"{name} holds non-finite per-clip values")
    return m


@dataclass(frozen=True)
class ClusterBootstrap:
    """:func:`cluster_bootstrap_diff` of ``a`` against ``b`` (accuracies as fractions; differences ``a - b``).

    ``by_cluster``: per cluster (clips without one pooled under ``None``), its clip count and the mean
    accuracy of each variant over all its runs, with their difference.
    """

    diff: float
    mean_a: float
    mean_b: float
    ci_low: float
    ci_high: float
    p: float
    n_a: int
    n_b: int
    n_clips: int
    n_clusters: int
    n_unclustered: int
    n_boot: int
    resample_seeds: bool
    confidence: float = 0.95
    by_cluster: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def cluster_bootstrap_diff(
    a_runs: Sequence[Sequence[float]],
    b_runs: Sequence[Sequence[float]],
    clusters: Sequence[Hashable | None],
    n_boot: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
    resample_seeds: bool = True,
) -> ClusterBootstrap:
    """Difference of mean accuracy of variant ``a`` and variant ``b`` with a cluster bootstrap over the clips.

    Args:
        a_runs, b_runs: one sequence per run (training seed) of per-clip correctness (1 / 0; any finite
            score works) over the same test clips in the same order for every run of both variants.
        clusters: the cluster of each clip (e.g. the voice that spoke it). ``None`` marks a clip that
            belongs to no cluster (e.g. a noise-only silence clip): those clips are independent units.
        n_boot: bootstrap replicates.
        seed: seed of the resampling.
        confidence: level of the percentile interval.
        resample_seeds: also resample each variant's runs (otherwise the runs are kept fixed).

    What one replicate resamples:

    * the clusters: as many clusters as there are, drawn with replacement from the clusters, each drawn
      cluster bringing all of its clips (a cluster drawn twice counts twice);
    * the clips without a cluster: as many as there are, drawn with replacement from them (their own
      stratum, so the test set keeps its share of such clips);
    * with ``resample_seeds``: the runs of ``a`` (``len(a_runs)`` drawn with replacement from them) and,
      independently, the runs of ``b``.

    The drawn clips are the same for both variants (both scored the same clips, so the comparison stays
    paired); the runs are drawn per variant. The replicate's statistic is the accuracy of ``a`` over its
    drawn runs and drawn clips minus the same for ``b``. The point estimate ``diff`` is the mean accuracy of
    ``a`` over all its runs and clips minus that of ``b``. The interval is the percentile interval of the
    replicates; ``p`` is two-sided, ``min(1, 2 * min((#{d* <= 0} + 1), (#{d* >= 0} + 1)) / (n_boot + 1))``,
    the smallest level at which the percentile interval would exclude 0 (not a test under a resampled null).

    Resampling the clusters makes the interval reflect which voices happened to be in the test set: a
    difference carried by one voice gets a wide interval, a difference shared by every voice a narrow one.
    Resampling clusters and runs independently (a crossed design) tends to be conservative.
    """
    A, B = _runs_matrix(a_runs, "a_runs"), _runs_matrix(b_runs, "b_runs")
    keys = list(clusters)
    if not (A.shape[1] == B.shape[1] == len(keys)):
        raise ValueError(f"a_runs has {A.shape[1]} clips per run, b_runs {B.shape[1]} and clusters {len(keys)}; "
                         "they must describe the same clips")
    if n_boot < 1:
        raise ValueError(f"n_boot={n_boot} must be >= 1")
    names = list(dict.fromkeys(k for k in keys if k is not None))
    index = {k: i for i, k in enumerate(names)}
    member = np.array([index[k] if k is not None else -1 for k in keys], dtype=np.int64)
    inside, singles = np.flatnonzero(member >= 0), np.flatnonzero(member < 0)
    k, m = len(names), len(singles)
    size = np.bincount(member[inside], minlength=k).astype(float)

    def per_cluster(X: np.ndarray) -> np.ndarray:  # (runs, k): correct clips per cluster and run
        out = np.zeros((X.shape[0], k))
        for c in range(k):
            out[:, c] = X[:, member == c].sum(1)
        return out

    Ca, Cb = per_cluster(A), per_cluster(B)
    Sa, Sb = A[:, singles], B[:, singles]
    rng = np.random.default_rng(seed)
    W = rng.multinomial(k, np.full(k, 1 / k), size=n_boot).astype(float) if k else np.zeros((n_boot, 0))
    V = rng.multinomial(m, np.full(m, 1 / m), size=n_boot).astype(float) if m else np.zeros((n_boot, 0))
    na, nb = A.shape[0], B.shape[0]
    if resample_seeds:
        Ua = rng.multinomial(na, np.full(na, 1 / na), size=n_boot).astype(float)
        Ub = rng.multinomial(nb, np.full(nb, 1 / nb), size=n_boot).astype(float)
    else:
        Ua, Ub = np.ones((n_boot, na)), np.ones((n_boot, nb))
    clips = W @ size + V.sum(1)  # drawn clips per replicate (fixed: k clusters and m clips drawn)

    def accuracy(U: np.ndarray, C: np.ndarray, S: np.ndarray, n: int) -> np.ndarray:
        return (((U @ C) * W).sum(1) + ((U @ S) * V).sum(1)) / (n * clips)

    d = accuracy(Ua, Ca, Sa, na) - accuracy(Ub, Cb, Sb, nb)
    alpha = 1 - confidence
    lo, hi = np.quantile(d, [alpha / 2, 1 - alpha / 2])
    tol = 1e-12
    below, above = int(np.count_nonzero(d <= tol)), int(np.count_nonzero(d >= -tol))
    p = min(1.0, 2 * min(below + 1, above + 1) / (n_boot + 1))
    by_cluster = []
    for name in [*names, *([None] if m else [])]:
        cols = singles if name is None else np.flatnonzero(member == index[name])
        ma, mb = float(A[:, cols].mean()), float(B[:, cols].mean())
        by_cluster.append({"cluster": name, "clips": int(len(cols)), "mean_a": ma, "mean_b": mb, "diff": ma - mb})
    return ClusterBootstrap(
        diff=float(A.mean() - B.mean()), mean_a=float(A.mean()), mean_b=float(B.mean()), ci_low=float(lo),
        ci_high=float(hi), p=float(p), n_a=na, n_b=nb, n_clips=len(keys), n_clusters=k, n_unclustered=m,
        n_boot=n_boot, resample_seeds=resample_seeds, confidence=confidence, by_cluster=by_cluster,
    )


def _logistic_slope(x: np.ndarray, y: np.ndarray, l2: float) -> float:
    """Slope (log-odds per unit of ``x``) of a logistic regression of ``y`` on ``x`` with an intercept, fit by
    Newton's method with an L2 penalty ``l2`` on both coefficients of the standardised ``x`` (finite under
    separation, e.g. a run that got every clip right)."""
    sd = float(x.std())
    X = np.column_stack([np.ones_like(x), (x - x.mean()) / sd])
    beta = np.zeros(2)
    for _ in range(200):
        p = _expit(X @ beta)
        grad = X.T @ (y - p) - l2 * beta
        hess = (X.T * (p * (1 - p))) @ X + l2 * np.eye(2)
        step = np.linalg.solve(hess, grad)
        beta += step
        if np.abs(step).max() < 1e-10:
            break
    return float(beta[1] / sd)


def _linear_slope(x: np.ndarray, y: np.ndarray) -> float:
    xc = x - x.mean()
    return float(xc @ (y - y.mean()) / (xc @ xc))


@dataclass(frozen=True)
class SnrInteraction:
    """:func:`snr_interaction` of ``a`` against ``b``: slopes of correctness on SNR per dB (log-odds per dB
    for ``scale="logit"``, accuracy (fraction) per dB for ``"linear"``) and their difference ``a - b``.

    ``gap_by_bin``: the clips split into ``bins`` groups of about equal size by SNR; per group its SNR
    range, clip count, the mean accuracy of each variant over all its runs and their difference.
    """

    scale: str
    diff: float
    slope_a: float
    slope_b: float
    ci_low: float
    ci_high: float
    p_perm: float
    perm_exact: bool
    perm_count: int
    slopes_a: list[float]
    slopes_b: list[float]
    n_clips: int
    snr_min: float
    snr_max: float
    gap_by_bin: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def snr_interaction(
    a_runs: Sequence[Sequence[float]],
    b_runs: Sequence[Sequence[float]],
    snr_db: Sequence[float | None],
    scale: str = "logit",
    bins: int = 3,
    resamples: int = 20_000,
    seed: int = 0,
    l2: float = 1e-2,
) -> SnrInteraction:
    """Does the difference between variants ``a`` and ``b`` change with the SNR? A permutation test of the
    variant x SNR interaction that permutes the variant labels of whole runs, not of clips.

    Args:
        a_runs, b_runs: per run, per-clip correctness (1 / 0) over the same clips in the same order.
        snr_db: the SNR each clip was mixed at; clips with None (or nan), e.g. noise-only silence, are left
            out. The SNR must vary over the clips (a test set at one fixed SNR has no slope).
        scale: ``"logit"``: each run's slope is that of a logistic regression of correctness on SNR (with an
            intercept and an L2 penalty ``l2`` on the standardised coefficients, which only matters when a run
            is perfectly separated); ``"linear"``: the least-squares slope of the linear probability model.
        bins: SNR groups of :attr:`SnrInteraction.gap_by_bin`.
        resamples, seed: Monte Carlo permutations when there are more than
            :data:`EXACT_LIMIT` splits of the runs (8 + 8 runs: 12,870 splits, all enumerated).
        l2: the logistic fit's penalty.

    The statistic is ``mean(slope over a's runs) - mean(slope over b's runs)``: the interaction coefficient of
    correctness ~ variant + snr + variant x snr fit per run. On the linear scale it equals the pooled
    least-squares interaction coefficient exactly (every run scored the same clips); on the logit scale it is
    the two-stage (per-run fit, then compare) version of the logistic interaction. ``p_perm`` is
    :func:`permutation_p` of the two sets of per-run slopes: the share of all splits of the runs into groups
    of ``len(a_runs)`` and ``len(b_runs)`` whose difference of mean slopes is at least as large in absolute
    value. ``ci_low``/``ci_high``: Welch's 95 % interval of the difference (runs as the unit).

    Null hypothesis: the variant label is exchangeable across runs with respect to their SNR slope, i.e. the
    two variants' runs have the same distribution of slopes (no variant x SNR interaction on the chosen
    scale). A main effect alone (a variant better by the same log-odds at every SNR) leaves the logit slopes
    unchanged, so it is not detected on the logit scale; on the linear scale the same main effect near 100 %
    accuracy flattens the accuracy-per-dB slope and can show as an interaction.
    """
    if scale not in ("logit", "linear"):
        raise ValueError(f"scale={scale!r}; expected 'logit' or 'linear'")
    A, B = _runs_matrix(a_runs, "a_runs"), _runs_matrix(b_runs, "b_runs")
    x = np.array([np.nan if v is None else float(v) for v in snr_db])
    if not (A.shape[1] == B.shape[1] == len(x)):
        raise ValueError(f"a_runs has {A.shape[1]} clips per run, b_runs {B.shape[1]} and snr_db {len(x)}; "
                         "they must describe the same clips")
    keep = np.isfinite(x)
    x, A, B = x[keep], A[:, keep], B[:, keep]
    if x.size < 3 or float(x.std()) == 0.0:
        raise ValueError("the SNR does not vary over the clips (or fewer than 3 clips have one): no slope to compare")

    def slope(y: np.ndarray) -> float:
        return _logistic_slope(x, y, l2) if scale == "logit" else _linear_slope(x, y)

    sa, sb = [slope(y) for y in A], [slope(y) for y in B]
    p, exact, count = permutation_p(sa, sb, resamples=resamples, seed=seed)
    w = welch(sa, sb)
    order = np.argsort(x, kind="stable")
    gap = []
    for part in np.array_split(order, max(1, min(bins, x.size))):
        ma, mb = float(A[:, part].mean()), float(B[:, part].mean())
        gap.append({"snr_low": float(x[part].min()), "snr_high": float(x[part].max()), "clips": int(part.size),
                    "mean_a": ma, "mean_b": mb, "diff": ma - mb})
    return SnrInteraction(
        scale=scale, diff=float(np.mean(sa) - np.mean(sb)), slope_a=float(np.mean(sa)), slope_b=float(np.mean(sb)),
        ci_low=w["ci_low"], ci_high=w["ci_high"], p_perm=p, perm_exact=exact, perm_count=count, slopes_a=sa,
        slopes_b=sb, n_clips=int(x.size), snr_min=float(x.min()), snr_max=float(x.max()), gap_by_bin=gap,
    )
