"""A/B significance for warm-up strategies: sufficient statistics in, results out.

Inputs are per-variant sufficient statistics built from per-unit records (the
experiment unit — a session — is the randomisation unit, so every variance
here is at the unit level, which is what makes a per-request or per-lookup
metric honest when requests cluster by unit):

* :class:`Proportion` — units that converted at least once (two-proportion
  z-test, pooled for the p-value, unpooled Wald CI);
* :class:`Mean` — a per-unit value such as revenue per session (Welch t);
* :class:`Ratio` — Σx / Σy over units, e.g. hit rate = Σhits / Σlookups,
  GPU-seconds per request, mean latency per request (delta method at the unit
  level: Var(x̄/ȳ) ≈ (σx² − 2R·σxy + R²·σy²) / (n·ȳ²), R = x̄/ȳ);
* :class:`Quantile` — P95/P99 latency from per-unit histograms, after Deng,
  Knoblich & Lu (2018): the share of observations at or below the estimated
  quantile is a ratio metric with a clustered (delta-method) variance σ_p²;
  each arm's *outer CI* maps p ± zσ_p back through the quantile function, and
  the quantile's standard error is σ_p / f̂(q̂), f̂ the histogram density at q̂
  (half the outer interval's width overstates it when q̂ sits near a bucket
  edge, where the interval is lopsided); the difference gets a normal CI.
  Chosen over a cluster bootstrap because it costs one pass over the units —
  a bootstrap of 1M units × 10 metrics would not fit the report's budget —
  and its A/A rejection rate is on target (tests).

Relative lifts use the delta method: Var(b/a − 1) ≈ Var(b)/a² + b²·Var(a)/a⁴.
CUPED (:func:`cuped`) adjusts a mean metric with a pre-period covariate, θ
pooled over both arms. :func:`srm` tests the unit split (and the request
split) against the plan. :func:`adjust` gives Holm and Benjamini–Hochberg
p-values. :func:`msprt` is an always-valid (sequential) p-value and confidence
sequence — the normal-mixture SPRT — for reports watched continuously; it is
reported beside, not instead of, the fixed-horizon result. :func:`power`
gives the minimum detectable effect now and the time to reach a target.

Every result carries ``error`` (no estimate possible, e.g. one unit or zero
lookups) and ``warning`` instead of raising.

Example::

    a = Ratio.from_units(units_a["hits_prefix_kv"], units_a["lookups_prefix_kv"])
    b = Ratio.from_units(units_b["hits_prefix_kv"], units_b["lookups_prefix_kv"])
    r = compare("hit rate (prefix_kv)", a, b)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt
from scipy import stats

from .hitrate import Z95
from .latency import quantile_from_buckets

__all__ = [
    "Proportion",
    "Mean",
    "Ratio",
    "Quantile",
    "Result",
    "WelchT",
    "TwoProportionZ",
    "DeltaMethodZ",
    "OuterCIZ",
    "compare",
    "compare_arms",
    "srm",
    "SRM",
    "adjust",
    "cuped",
    "msprt",
    "power",
    "Power",
    "mde_sentence",
    "batch_means",
    "spending",
    "group_sequential_bounds",
    "InvalidStatistics",
    "MIN_EFFECTIVE_UNITS",
]


# --------------------------------------------------------------- statistics
class InvalidStatistics(ValueError):
    """Sufficient statistics that no set of units could have produced."""


def _finite(name: str, **vals: npt.ArrayLike) -> None:
    for k, v in vals.items():
        if not np.all(np.isfinite(np.asarray(v, dtype=float))):
            raise InvalidStatistics(f"{name}: {k} must be finite, got {v!r}")


def _nonneg(name: str, **vals: npt.ArrayLike) -> None:
    _finite(name, **vals)
    for k, v in vals.items():
        if np.any(np.asarray(v, dtype=float) < 0):
            raise InvalidStatistics(f"{name}: {k} must be >= 0, got {v!r}")


def _check_alpha(alpha: float) -> None:
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and 0 < alpha < 1):
        raise ValueError(f"alpha must be strictly between 0 and 1 (e.g. 0.05), got {alpha!r}")


# Σx² ≥ (Σx)²/n holds for any units; sums kept in floating point may miss it by rounding only.
_RTOL = 1e-9


@dataclass(frozen=True)
class Proportion:
    n: int
    successes: int

    def __post_init__(self) -> None:
        _nonneg("Proportion", n=self.n, successes=self.successes)
        if self.successes > self.n:
            raise InvalidStatistics(
                f"Proportion: {self.successes} successes out of {self.n} units; successes "
                "count units with at least one success, so they cannot exceed n"
            )

    def __add__(self, o: Proportion) -> Proportion:
        return Proportion(self.n + o.n, self.successes + o.successes)

    @classmethod
    def from_units(cls, converted: npt.ArrayLike) -> Proportion:
        c = np.asarray(converted, dtype=float)
        return cls(int(len(c)), int((c > 0).sum()))

    @property
    def estimate(self) -> float:
        return self.successes / self.n if self.n else float("nan")

    def var_of_estimate(self) -> float:
        p = self.estimate
        return p * (1 - p) / self.n if self.n else float("nan")


@dataclass(frozen=True)
class Mean:
    n: int
    sum: float
    sum_sq: float

    def __post_init__(self) -> None:
        _nonneg("Mean", n=self.n, sum_sq=self.sum_sq)
        _finite("Mean", sum=self.sum)
        if self.n == 0 and (self.sum or self.sum_sq):
            raise InvalidStatistics("Mean: sums over zero units must be 0")
        if self.n and self.sum * self.sum / self.n > self.sum_sq * (1 + _RTOL) + 1e-12:
            raise InvalidStatistics(
                f"Mean: sum of squares {self.sum_sq:g} is below sum²/n = "
                f"{self.sum * self.sum / self.n:g}; no units give that (check the columns)"
            )

    def __add__(self, o: Mean) -> Mean:
        return Mean(self.n + o.n, self.sum + o.sum, self.sum_sq + o.sum_sq)

    @classmethod
    def from_units(cls, x: npt.ArrayLike) -> Mean:
        x = np.asarray(x, dtype=float)
        return cls(int(len(x)), float(x.sum()), float((x * x).sum()))

    @property
    def estimate(self) -> float:
        return self.sum / self.n if self.n else float("nan")

    @property
    def unit_var(self) -> float:
        if self.n < 2:
            return float("nan")
        return max((self.sum_sq - self.sum * self.sum / self.n) / (self.n - 1), 0.0)

    def var_of_estimate(self) -> float:
        return self.unit_var / self.n if self.n >= 2 else float("nan")


@dataclass(frozen=True)
class Ratio:
    n: int
    sum_x: float
    sum_y: float
    sum_x2: float
    sum_y2: float
    sum_xy: float

    def __post_init__(self) -> None:
        _nonneg("Ratio", n=self.n, sum_x2=self.sum_x2, sum_y2=self.sum_y2)
        _finite("Ratio", sum_x=self.sum_x, sum_y=self.sum_y, sum_xy=self.sum_xy)
        if self.n == 0 and any((self.sum_x, self.sum_y, self.sum_x2, self.sum_y2, self.sum_xy)):
            raise InvalidStatistics("Ratio: sums over zero units must be 0")
        if self.sum_xy * self.sum_xy > self.sum_x2 * self.sum_y2 * (1 + _RTOL) + 1e-12:
            raise InvalidStatistics(
                "Ratio: (Σxy)² exceeds Σx²·Σy² (Cauchy–Schwarz); no units give that"
            )

    @property
    def effective_units(self) -> float:
        """Kish's effective number of units for the denominator, (Σy)² / Σy²:
        ``n`` when every unit has the same y, about 1 when one unit holds it all."""
        return self.sum_y * self.sum_y / self.sum_y2 if self.sum_y2 > 0 else 0.0

    def __add__(self, o: Ratio) -> Ratio:
        return Ratio(
            self.n + o.n,
            self.sum_x + o.sum_x,
            self.sum_y + o.sum_y,
            self.sum_x2 + o.sum_x2,
            self.sum_y2 + o.sum_y2,
            self.sum_xy + o.sum_xy,
        )

    @classmethod
    def from_units(cls, x: npt.ArrayLike, y: npt.ArrayLike) -> Ratio:
        x = np.asarray(x, dtype=float)
        y = np.asarray(y, dtype=float)
        return cls(
            int(len(x)),
            float(x.sum()),
            float(y.sum()),
            float((x * x).sum()),
            float((y * y).sum()),
            float((x * y).sum()),
        )

    @property
    def estimate(self) -> float:
        return self.sum_x / self.sum_y if self.sum_y else float("nan")

    def var_of_estimate(self) -> float:
        n = self.n
        if n < 2 or self.sum_y == 0:
            return float("nan")
        mx, my = self.sum_x / n, self.sum_y / n
        vx = (self.sum_x2 - n * mx * mx) / (n - 1)
        vy = (self.sum_y2 - n * my * my) / (n - 1)
        cxy = (self.sum_xy - n * mx * my) / (n - 1)
        r = mx / my
        return max((vx - 2 * r * cxy + r * r * vy) / (n * my * my), 0.0)


@dataclass(frozen=True)
class Quantile:
    """A quantile of per-unit histograms (bounds; last bucket = overflow), kept
    as sums over units so that arms add and a store can maintain them: with
    h_uk unit u's count in bucket k, N_u = Σ_k h_uk and C_uk = Σ_{j<k} h_uj,

    ``pooled`` Σ_u h_uk, ``nn`` Σ N_u², ``cc`` Σ C_uk², ``cd`` Σ C_uk·h_uk,
    ``dd`` Σ h_uk², ``cn`` Σ C_uk·N_u, ``dn`` Σ h_uk·N_u (per bucket k) and
    ``n`` the units with at least one observation.

    That is everything the clustered share-below variance needs at any q̂
    (the share of unit u below q̂ in bucket k is C_uk + f·h_uk).
    :meth:`from_units` builds it from a units × buckets count matrix."""

    q: float
    bounds: tuple[float, ...]
    n: int
    pooled: np.ndarray = field(repr=False)
    nn: float = field(repr=False)
    cc: np.ndarray = field(repr=False)
    cd: np.ndarray = field(repr=False)
    dd: np.ndarray = field(repr=False)
    cn: np.ndarray = field(repr=False)
    dn: np.ndarray = field(repr=False)

    def __post_init__(self) -> None:
        if not (0 < self.q < 1):
            raise InvalidStatistics(f"Quantile: q must be strictly between 0 and 1, got {self.q!r}")
        b = np.asarray(self.bounds, dtype=float)
        if len(b) == 0 or not np.all(np.isfinite(b)) or np.any(np.diff(b) <= 0) or b[0] <= 0:
            raise InvalidStatistics(
                f"Quantile: bounds must be positive, finite and increasing, got {self.bounds!r}"
            )
        for k in ("pooled", "cc", "cd", "dd", "cn", "dn"):
            v = np.asarray(getattr(self, k), dtype=float)
            if v.shape != (len(b) + 1,):
                raise InvalidStatistics(
                    f"Quantile: {k} needs one value per bucket ({len(b) + 1}: the bounds "
                    f"plus overflow), got shape {v.shape}"
                )
        _nonneg("Quantile", n=self.n, pooled=self.pooled, nn=self.nn, cc=self.cc, dd=self.dd)

    def _same_kind(self, o: Quantile) -> None:
        if self.q != o.q or tuple(self.bounds) != tuple(o.bounds):
            raise ValueError(
                f"cannot combine or compare quantiles with different q or bucket bounds: "
                f"q={self.q:g} vs q={o.q:g}, {len(self.bounds)} vs {len(o.bounds)} bounds"
                + ("" if tuple(self.bounds) == tuple(o.bounds) else " (bounds differ)")
            )

    @property
    def last_edge(self) -> float:
        return float(self.bounds[-1])

    @property
    def above_last_edge(self) -> bool:
        """The quantile falls in the overflow bucket: it is known only to exceed the last edge."""
        total = float(self.pooled.sum())
        return total > 0 and float(self.pooled[:-1].sum()) < self.q * total - 1e-12 * total

    @classmethod
    def from_units(cls, q: float, bounds: Sequence[float], counts: npt.ArrayLike) -> Quantile:
        c = np.asarray(counts, dtype=float).reshape(-1, len(bounds) + 1)
        tot = c.sum(axis=1)
        cum = np.cumsum(c, axis=1) - c  # C_uk: the unit's observations in buckets below k
        return cls(
            float(q),
            tuple(bounds),
            int((tot > 0).sum()),
            c.sum(axis=0),
            float(tot @ tot),
            (cum * cum).sum(axis=0),
            (cum * c).sum(axis=0),
            (c * c).sum(axis=0),
            tot @ cum,
            tot @ c,
        )

    def __add__(self, o: Quantile) -> Quantile:
        self._same_kind(o)
        return Quantile(
            self.q,
            self.bounds,
            self.n + o.n,
            self.pooled + o.pooled,
            self.nn + o.nn,
            self.cc + o.cc,
            self.cd + o.cd,
            self.dd + o.dd,
            self.cn + o.cn,
            self.dn + o.dn,
        )

    @property
    def estimate(self) -> float:
        return float(quantile_from_buckets(np.array(self.bounds), self.pooled, self.q)[0])

    def _share_below(self) -> tuple[float, float, float]:
        """(q̂, clustered SE of the share of observations <= q̂, density at q̂)."""
        if self.n < 2:
            return float("nan"), float("nan"), float("nan")
        b = np.array(self.bounds)
        qhat = self.estimate
        # Share of each unit's observations <= q̂, uniform inside the bucket holding q̂.
        k = int(np.searchsorted(b, qhat, side="left"))
        lo = b[k - 1] if k > 0 else 0.0
        hi = b[k] if k < len(b) else lo
        f = (qhat - lo) / (hi - lo) if hi > lo else 1.0
        total = float(self.pooled.sum())
        below = float(self.pooled[:k].sum()) + f * self.pooled[k]
        r = Ratio(
            self.n,
            below,
            total,
            self.cc[k] + 2 * f * self.cd[k] + f * f * self.dd[k],
            self.nn,
            self.cn[k] + f * self.dn[k],
        )
        dens = self.pooled[k] / total / (hi - lo) if hi > lo else float("nan")
        return qhat, math.sqrt(r.var_of_estimate()), dens

    def outer_ci(self, z: float = Z95) -> tuple[float, float, float]:
        """(estimate, lower, upper) by Deng et al.'s outer CI (clustered variance)."""
        qhat, se, _ = self._share_below()
        if not np.isfinite(se):
            return float("nan"), float("nan"), float("nan")
        b = np.array(self.bounds)
        p = float(np.clip(self.q, 0, 1))
        lo_q = float(quantile_from_buckets(b, self.pooled, float(np.clip(p - z * se, 0, 1)))[0])
        hi_q = float(quantile_from_buckets(b, self.pooled, float(np.clip(p + z * se, 0, 1)))[0])
        return qhat, lo_q, hi_q

    def var_of_estimate(self) -> float:
        """σ_p² / f̂(q̂)²: the share's clustered variance over the squared
        histogram density at q̂. Near a bucket edge the outer interval is
        lopsided, and half its width would overstate the error."""
        _, se, dens = self._share_below()
        return (se / dens) ** 2 if np.isfinite(se) and dens and np.isfinite(dens) else float("nan")


Stat = Proportion | Mean | Ratio | Quantile


# ------------------------------------------------------------------ results
@dataclass(frozen=True, kw_only=True)
class Result:
    """One metric, treatment against control: the estimates, the absolute and relative effect
    with their confidence intervals, the p-value and how it was computed (``test``)."""

    metric: str
    kind: str  # the statistic: "proportion", "mean", "ratio" or "quantile"
    control: float
    treatment: float
    abs_effect: float  # treatment − control
    abs_low: float
    abs_high: float
    rel_effect: float  # treatment ÷ control − 1
    rel_low: float
    rel_high: float
    p_value: float
    n_control: int
    n_treatment: int
    test: str
    p_holm: float = float("nan")
    p_bh: float = float("nan")
    seq_p: float = float("nan")
    seq_low: float = float("nan")
    seq_high: float = float("nan")
    mde: float = float("nan")
    variance_reduction: float = float("nan")
    primary: bool = False
    error: str | None = None
    warning: str | None = None
    rel_p_value: float = float("nan")
    # the control's quantile is only known to exceed the last bucket edge
    control_above: bool = False
    treatment_above: bool = False
    arm: str = ""  # in an A/B/n report: the treatment arm this row compares with the control
    direction: str = ""  # "higher" or "lower" is better (from the metric's definition); "" unknown

    @property
    def significant(self) -> bool:
        p = self.p_value if self.primary or not np.isfinite(self.p_holm) else self.p_holm
        return self.error is None and np.isfinite(p) and p < 0.05

    @classmethod
    def untestable(
        cls, metric: str, kind: str, n_control: int, n_treatment: int, error: str, **known: Any
    ) -> Result:
        """The result for data that cannot be tested: ``error`` says why, every number is NaN
        but the unit counts and what is ``known`` (e.g. the arms' estimates)."""
        nan = float("nan")
        values: dict[str, Any] = dict(
            control=nan,
            treatment=nan,
            abs_effect=nan,
            abs_low=nan,
            abs_high=nan,
            rel_effect=nan,
            rel_low=nan,
            rel_high=nan,
            p_value=nan,
        )
        return cls(
            metric=metric,
            kind=kind,
            n_control=n_control,
            n_treatment=n_treatment,
            test="",
            error=error,
            **{**values, **known},
        )


# Below this many effective units (Kish, :attr:`Ratio.effective_units`) in an
# arm the delta method's normal approximation is not trusted: with heavily
# skewed unit sizes (e.g. Pareto α = 1.5 sessions) a few units dominate Σy and
# an A/A test rejects far more often than α. Checked by simulation (tests).
MIN_EFFECTIVE_UNITS = 50.0


# -------------------------------------------------------------------- tests
S = TypeVar("S", Proportion, Mean, Ratio, Quantile)


class _Test(Generic[S]):
    """Treatment against control for one kind of statistic: the difference and its variance,
    a p-value and a confidence interval (one small class per statistic below).

    :meth:`why_untestable` is the guard: the first reason the arms cannot be compared, or None.
    Its checks run in order, each needing what the earlier ones established (units, then
    estimates, then variances)."""

    name = ""  # the test, as reports show it

    def __init__(self, control: S, treatment: S, alpha: float) -> None:
        self.control: S = control
        self.treatment: S = treatment
        self.alpha = alpha
        self.z = stats.norm.ppf(1 - alpha / 2)

    # The arms' estimates and the variances of those estimates (each computed once).
    @cached_property
    def estimates(self) -> tuple[float, float]:
        return self.control.estimate, self.treatment.estimate

    @cached_property
    def variances(self) -> tuple[float, float]:
        return self.control.var_of_estimate(), self.treatment.var_of_estimate()

    @property
    def point_estimate(self) -> float:
        """The absolute effect, treatment − control."""
        ea, eb = self.estimates
        return eb - ea

    @property
    def variance(self) -> float:
        va, vb = self.variances
        return va + vb

    def p_value(self) -> float:
        """Two-sided, from the normal approximation (zero variance: 0 for any difference)."""
        d, se = self.point_estimate, math.sqrt(self.variance)
        return float(2 * stats.norm.sf(abs(d) / se) if se > 0 else (0.0 if d else 1.0))

    def confidence_interval(self) -> tuple[float, float]:
        d, half = self.point_estimate, self.z * math.sqrt(self.variance)
        return d - half, d + half

    # -- the guard
    def why_untestable(self) -> str | None:
        return self.why_no_estimate() or self.why_no_difference()

    def why_no_estimate(self) -> str | None:
        na, nb = self.control.n, self.treatment.n
        if na < 2 or nb < 2:
            return f"not enough units: {na} in control, {nb} in treatment (need at least 2 each)"
        if not all(np.isfinite(self.estimates)):
            return "no estimate in an arm (no data)"
        return None

    def why_no_difference(self) -> str | None:
        if not all(np.isfinite(self.variances)):
            return (
                "the variance of an arm's estimate cannot be estimated (e.g. no histogram "
                "density at the quantile): not tested"
            )
        if self.variance <= 0 and self.point_estimate == 0:
            return "zero variance in both arms and no difference: nothing to test"
        return None

    def known(self) -> dict[str, Any]:
        """What an untestable result still shows once the estimates exist."""
        ea, eb = self.estimates
        return dict(control=ea, treatment=eb, abs_effect=eb - ea)

    # -- the result
    def result(self, metric: str, tau: float | None, primary: bool) -> Result:
        kind = type(self.control).__name__.lower()
        why = self.why_untestable()
        if why is not None:
            known = self.known() if self.why_no_estimate() is None else {}
            n = self.control.n, self.treatment.n
            return Result.untestable(metric, kind, *n, why, **known)
        (ea, eb), (va, vb) = self.estimates, self.variances
        d, v, z = eb - ea, va + vb, self.z
        lo, hi = self.confidence_interval()
        rel = rlo = rhi = rel_p = float("nan")
        if ea != 0:
            rel = eb / ea - 1
            rse = math.sqrt(vb / ea**2 + eb**2 * va / ea**4)
            rlo, rhi = rel - z * rse, rel + z * rse
            rel_p = 2 * stats.norm.sf(abs(rel) / rse) if rse > 0 else (0.0 if rel else 1.0)
        seq_p, seq_lo, seq_hi = msprt(
            d, v, tau if tau is not None else _default_tau(ea), self.alpha
        )
        return Result(
            metric=metric,
            kind=kind,
            control=ea,
            treatment=eb,
            abs_effect=d,
            abs_low=lo,
            abs_high=hi,
            rel_effect=rel,
            rel_low=rlo,
            rel_high=rhi,
            p_value=self.p_value(),
            n_control=self.control.n,
            n_treatment=self.treatment.n,
            test=self.name,
            seq_p=seq_p,
            seq_low=seq_lo,
            seq_high=seq_hi,
            mde=(z + stats.norm.ppf(0.8)) * math.sqrt(v),
            primary=primary,
            # every unit in each arm has the same value (observed, not assumed): the difference
            # is exact
            warning="zero variance: every unit has the same value in each arm; the difference is "
            "exact"
            if v <= 0
            else None,
            rel_p_value=float(rel_p),
        )


class WelchT(_Test[Mean]):
    """Means of per-unit values: Welch's t with Welch–Satterthwaite degrees of freedom."""

    name = "Welch t"

    @cached_property
    def _t(self) -> tuple[float, float]:
        """(degrees of freedom, standard error)."""
        (va, vb), v = self.variances, self.variance
        na, nb = self.control.n, self.treatment.n
        df = (
            v * v / ((va * va) / (na - 1) + (vb * vb) / (nb - 1))
            if (va > 0 or vb > 0)
            else na + nb - 2
        )
        return df, math.sqrt(v)

    def p_value(self) -> float:
        if self.variance <= 0:
            return super().p_value()
        df, se = self._t
        return float(2 * stats.t.sf(abs(self.point_estimate) / se, df))

    def confidence_interval(self) -> tuple[float, float]:
        if self.variance <= 0:
            return super().confidence_interval()
        df, se = self._t
        half = stats.t.ppf(1 - self.alpha / 2, df) * se
        return self.point_estimate - half, self.point_estimate + half


class TwoProportionZ(_Test[Proportion]):
    """Units converted at least once: the p-value from the pooled proportion, the interval from
    the unpooled (Wald) standard error."""

    name = "two-proportion z"

    def p_value(self) -> float:
        a, b, d = self.control, self.treatment, self.point_estimate
        pooled = (a.successes + b.successes) / (a.n + b.n)
        sp = math.sqrt(pooled * (1 - pooled) * (1 / a.n + 1 / b.n))
        return float(2 * stats.norm.sf(abs(d) / sp) if sp > 0 else (0.0 if d else 1.0))


class DeltaMethodZ(_Test[Ratio]):
    """Σx / Σy over units: a normal test on the delta-method variance, trusted only with enough
    effective units in each arm (:data:`MIN_EFFECTIVE_UNITS`)."""

    name = "delta-method z"

    def why_no_estimate(self) -> str | None:
        if self.control.n >= 2 and self.treatment.n >= 2:
            if self.control.sum_y == 0 or self.treatment.sum_y == 0:
                return "no denominator (e.g. zero lookups) in an arm"
        return super().why_no_estimate()

    def why_no_difference(self) -> str | None:
        small = min(self.control.effective_units, self.treatment.effective_units)
        if small < MIN_EFFECTIVE_UNITS:
            return (
                f"too few units for the delta method: {small:.0f} effective units in an arm "
                f"(need {MIN_EFFECTIVE_UNITS:.0f}); a few large units carry most of the "
                "denominator, so a p-value would be overconfident — wait for more units"
            )
        return super().why_no_difference()


class OuterCIZ(_Test[Quantile]):
    """A quantile of per-unit histograms: a normal test on the difference, each arm's standard
    error from Deng et al.'s outer interval (:meth:`Quantile.var_of_estimate`). A quantile beyond
    the last bucket edge is only known as "> edge" and is not tested."""

    name = "outer-CI z (Deng et al. 2018)"

    def __init__(self, control: Quantile, treatment: Quantile, alpha: float) -> None:
        control._same_kind(treatment)
        super().__init__(control, treatment, alpha)

    def why_no_difference(self) -> str | None:
        above = [
            n
            for n, x in (("control", self.control), ("treatment", self.treatment))
            if x.above_last_edge
        ]
        if above:
            return (
                f"P{self.control.q * 100:g} is beyond the last bucket edge "
                f"({self.control.last_edge:g}) in the {' and '.join(above)} arm: only '> edge' is "
                "known, so it is not tested (add buckets above the edge)"
            )
        return super().why_no_difference()

    def known(self) -> dict[str, Any]:
        flags = dict(
            control_above=self.control.above_last_edge,
            treatment_above=self.treatment.above_last_edge,
        )
        if flags["control_above"] or flags["treatment_above"]:  # the estimates, no difference
            ea, eb = self.estimates
            return dict(control=ea, treatment=eb, **flags)
        return {**super().known(), **flags}


# Each statistic's test (a subclass of a statistic, e.g. a test double, takes its parent's).
TESTS: tuple[tuple[type, type[_Test[Any]]], ...] = (
    (Mean, WelchT),
    (Proportion, TwoProportionZ),
    (Ratio, DeltaMethodZ),
    (Quantile, OuterCIZ),
)


def compare(
    metric: str,
    control: Stat,
    treatment: Stat,
    alpha: float = 0.05,
    tau: float | None = None,
    primary: bool = False,
) -> Result:
    """Treatment vs control for one metric; never raises on degenerate data
    (it says why in ``error``), but does raise ``ValueError`` on a bad
    ``alpha`` and on quantiles with different q or bucket bounds."""
    _check_alpha(alpha)
    if type(control) is not type(treatment):
        kind, n = type(control).__name__.lower(), (control.n, treatment.n)
        return Result.untestable(
            metric, kind, *n, "control and treatment are different metric types"
        )
    test = next(t for s, t in TESTS if isinstance(control, s))
    return test(control, treatment, alpha).result(metric, tau, primary)


def compare_arms(
    metric: str, arms: Mapping[str, Stat], control: str, alpha: float = 0.05, primary: bool = False
) -> list[Result]:
    """A/B/n: every other arm against ``control``, p-values Holm-adjusted over
    the comparisons (``p_holm``; BH in ``p_bh``). Each result's ``metric`` is
    ``"<metric> (<arm> vs <control>)"``."""
    _check_alpha(alpha)
    if control not in arms:
        raise ValueError(f"control arm {control!r} is not among the arms {sorted(arms)}")
    others = [a for a in arms if a != control]
    if not others:
        raise ValueError("need at least one arm besides the control")
    res = [
        compare(f"{metric} ({a} vs {control})", arms[control], arms[a], alpha, primary=primary)
        for a in others
    ]
    holm, bh = adjust([r.p_value for r in res])
    return [
        replace(r, p_holm=float(h), p_bh=float(b)) for r, h, b in zip(res, holm, bh, strict=True)
    ]


def _default_tau(baseline: float) -> float:
    # Mixture scale of the mSPRT: effects around 10% of the control value.
    return abs(baseline) * 0.1 if baseline else 1.0


# ---------------------------------------------------------------------- SRM
@dataclass(frozen=True)
class SRM:
    observed: tuple[float, ...]
    expected_share: tuple[float, ...]
    chi2: float
    p_value: float
    flagged: bool
    what: str
    threshold: float = 0.001  # flagged at p below this


def srm(
    counts: Sequence[float],
    planned: Sequence[float] | None = None,
    threshold: float = 0.001,
    what: str = "units",
) -> SRM:
    """Pearson χ² of observed counts (two or more arms) against the planned
    split; flagged at p < threshold. Raises ``ValueError`` on counts or shares
    that are not finite or negative, or when their lengths differ."""
    obs = np.asarray(counts, dtype=float).ravel()
    share = np.asarray(planned if planned is not None else [1.0] * len(obs), dtype=float).ravel()
    if not np.all(np.isfinite(obs)) or np.any(obs < 0):
        raise ValueError(
            f"sample-ratio check on {what}: counts must be finite and >= 0, got {list(counts)}"
        )
    if len(share) != len(obs):
        raise ValueError(
            f"sample-ratio check on {what}: {len(obs)} counts but {len(share)} planned shares"
        )
    if not np.all(np.isfinite(share)) or np.any(share <= 0):
        raise ValueError(
            f"sample-ratio check on {what}: planned shares must be finite and > 0, got "
            f"{list(share)}"
        )
    if not 0 < threshold < 1:
        raise ValueError(f"sample-ratio threshold must be between 0 and 1, got {threshold!r}")
    share = share / share.sum()
    if obs.sum() <= 0 or len(obs) < 2:
        return SRM(tuple(obs), tuple(share), float("nan"), float("nan"), False, what, threshold)
    exp = share * obs.sum()
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    p = float(stats.chi2.sf(chi2, len(obs) - 1))
    return SRM(tuple(obs.tolist()), tuple(share.tolist()), chi2, p, p < threshold, what, threshold)


# ------------------------------------------------------------ multiplicity
def adjust(p_values: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Holm and Benjamini–Hochberg adjusted p-values (NaN stays NaN; a value
    outside [0, 1] raises ``ValueError``)."""
    p = np.asarray(p_values, dtype=float).ravel()
    ok = np.isfinite(p)
    bad = p[ok & ((p < 0) | (p > 1))] if len(p) else p
    if len(bad) or np.isinf(p).any():
        raise ValueError(
            f"p-values must be in [0, 1] (NaN for 'not tested'), got {bad.tolist() or 'inf'}"
        )
    holm = np.full(len(p), np.nan)
    bh = np.full(len(p), np.nan)
    q = p[ok]
    m = len(q)
    if m:
        order = np.argsort(q)
        h = np.maximum.accumulate((m - np.arange(m)) * q[order])
        holm_ok = np.empty(m)
        holm_ok[order] = np.minimum(h, 1.0)
        b = q[order] * m / np.arange(1, m + 1)
        b = np.minimum.accumulate(b[::-1])[::-1]
        bh_ok = np.empty(m)
        bh_ok[order] = np.minimum(b, 1.0)
        holm[ok], bh[ok] = holm_ok, bh_ok
    return holm, bh


# ---------------------------------------------------------------- CUPED
def cuped(
    y: npt.ArrayLike, x: npt.ArrayLike, arm: npt.ArrayLike
) -> tuple[np.ndarray, float, float]:
    """CUPED-adjust per-unit ``y`` with pre-period covariate ``x``; θ pooled over
    arms (``arm`` labels each unit). Returns (adjusted y, θ, variance reduction)."""
    y = np.asarray(y, dtype=float)
    x = np.asarray(x, dtype=float)
    arm = np.asarray(arm)
    # Pooled within-arm covariance: arm differences in x (none, if randomised) don't leak into θ.
    xc = x.copy()
    yc = y.copy()
    for a in np.unique(arm):
        m = arm == a
        xc[m] -= x[m].mean()
        yc[m] -= y[m].mean()
    vx = float((xc * xc).sum())
    if vx == 0:
        return y.copy(), 0.0, 0.0
    theta = float((xc * yc).sum() / vx)
    adj = y - theta * (x - x.mean())
    vr = 1 - float(((yc - theta * xc) ** 2).sum() / (yc * yc).sum()) if (yc * yc).sum() > 0 else 0.0
    return adj, theta, vr


# ------------------------------------------------------------- sequential
def msprt(diff: float, var: float, tau: float, alpha: float = 0.05) -> tuple[float, float, float]:
    """Normal-mixture SPRT (Johari et al.): always-valid p-value and the
    confidence sequence for the difference, at this look.

    Λ = sqrt(V/(V+τ²))·exp(τ²Δ²/(2V(V+τ²))); p = min(1, 1/Λ); the interval is
    the set of Δ0 with Λ(Δ − Δ0) < 1/α."""
    _check_alpha(alpha)
    if not (np.isfinite(diff) and np.isfinite(var)) or var <= 0 or tau <= 0:
        return float("nan"), float("nan"), float("nan")
    t2 = tau * tau
    log_lam = 0.5 * math.log(var / (var + t2)) + t2 * diff * diff / (2 * var * (var + t2))
    p = float(min(1.0, math.exp(-log_lam))) if log_lam < 700 else 0.0
    half = math.sqrt(
        2 * var * (var + t2) / t2 * (math.log(1 / alpha) + 0.5 * math.log((var + t2) / var))
    )
    return p, diff - half, diff + half


# ---------------------------------------------------- group-sequential
def spending(t: npt.ArrayLike, alpha: float = 0.05, kind: str = "obrien_fleming") -> np.ndarray:
    """Lan–DeMets alpha spent by information fraction ``t``, two-sided (α/2 per
    side, each side spending by the one-sided function): O'Brien–Fleming type
    ``4 − 4Φ(z_{α/4}/√t)``, Pocock type ``α·ln(1 + (e − 1)t)``."""
    _check_alpha(alpha)
    frac: np.ndarray = np.clip(np.asarray(t, dtype=float), 0.0, 1.0)
    if kind == "obrien_fleming":
        with np.errstate(divide="ignore"):
            spent: np.ndarray = np.where(
                frac > 0, 4 - 4 * stats.norm.cdf(stats.norm.ppf(1 - alpha / 4) / np.sqrt(frac)), 0.0
            )
            return spent
    if kind == "pocock":
        return alpha * np.log(1 + (math.e - 1) * frac)
    raise ValueError(f"spending must be 'obrien_fleming' or 'pocock', got {kind!r}")


def group_sequential_bounds(
    looks: int | Sequence[float],
    alpha: float = 0.05,
    kind: str = "obrien_fleming",
    grid: int = 2001,
) -> np.ndarray:
    """Two-sided z boundaries for planned looks (Lan–DeMets alpha spending).

    ``looks``: the number of equally spaced looks, or their information
    fractions (increasing, the last 1.0 for the planned end). At look k the
    test stops when |z_k| ≥ c_k; the chance of stopping at look k under no
    effect (and not before) equals the alpha spent between looks k−1 and k.
    Computed by numerical integration of the score process (Armitage,
    McPherson & Rowe), so it needs no simulation."""
    _check_alpha(alpha)
    t = (
        np.arange(1, looks + 1) / looks
        if isinstance(looks, (int, np.integer))
        else np.asarray(looks, float)
    )
    if len(t) == 0 or np.any(np.diff(t) <= 0) or t[0] <= 0 or t[-1] > 1:
        raise ValueError(f"information fractions must be increasing in (0, 1], got {list(t)}")
    spent = spending(t, alpha, kind)
    inc = np.diff(np.concatenate([[0.0], spent]))
    bounds = np.empty(len(t))
    # Density of the score S_k = Z_k·√t_k on a grid inside the continuation region.
    s_grid: np.ndarray  # both set at the first look
    dens: np.ndarray
    for k, tk in enumerate(t):
        if k == 0:
            c = stats.norm.isf(inc[0] / 2)
            bounds[0] = c
            s_grid = np.linspace(-c * math.sqrt(tk), c * math.sqrt(tk), grid)
            dens = stats.norm.pdf(s_grid, scale=math.sqrt(tk))
            continue
        sd = math.sqrt(tk - t[k - 1])
        w = np.full(grid, s_grid[1] - s_grid[0])
        w[[0, -1]] /= 2  # trapezoid weights
        mass = dens * w

        def cross(
            c: float, tk: float = tk, mass: Any = mass, s_grid: Any = s_grid, sd: float = sd
        ) -> float:
            b = c * math.sqrt(tk)
            return float(
                mass @ (stats.norm.sf((b - s_grid) / sd) + stats.norm.cdf((-b - s_grid) / sd))
            )

        if inc[k] <= 0:
            c = float("inf")
        else:
            from scipy.optimize import brentq

            c = brentq(lambda c, goal=float(inc[k]): cross(c) - goal, 0.01, 40.0, xtol=1e-10)
        bounds[k] = c
        if k < len(t) - 1:
            new = np.linspace(-c * math.sqrt(tk), c * math.sqrt(tk), grid)
            step = stats.norm.pdf((new[:, None] - s_grid[None, :]) / sd)  # the score's moves
            dens = (mass[None, :] * step / sd).sum(axis=1)
            s_grid = new
    return bounds


# ------------------------------------------------------------------ power
@dataclass(frozen=True)
class Power:
    mde_abs: float
    mde_rel: float
    target_rel: float
    units_needed: float
    days_to_target: float
    note: str = ""


def power(
    control: Stat,
    treatment: Stat,
    days_observed: float,
    target_rel: float = 0.02,
    alpha: float = 0.05,
    power_: float = 0.8,
) -> Power:
    """MDE now (80% power), and the time to reach ``target_rel`` at the current
    traffic; ``note`` is one sentence that says it (see :func:`mde_sentence`)."""
    _check_alpha(alpha)
    if not 0 < power_ < 1:
        raise ValueError(f"power must be strictly between 0 and 1 (e.g. 0.8), got {power_!r}")
    if not target_rel > 0:
        raise ValueError(
            f"target relative effect must be > 0 (e.g. 0.02 for 2%), got {target_rel!r}"
        )
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power_)
    va, vb = control.var_of_estimate(), treatment.var_of_estimate()
    base = control.estimate
    nan = float("nan")
    if not (np.isfinite(va) and np.isfinite(vb)) or not base:
        return Power(nan, nan, target_rel, nan, nan, "not enough data for a power estimate")
    mde = z * math.sqrt(va + vb)
    mde_rel = mde / abs(base)
    n_now = control.n + treatment.n
    need = n_now * (mde_rel / target_rel) ** 2
    rate = n_now / days_observed if days_observed > 0 else nan
    days = max(need - n_now, 0.0) / rate if rate and np.isfinite(rate) else nan
    return Power(mde, mde_rel, target_rel, need, days, mde_sentence(mde_rel, target_rel, days))


def mde_sentence(mde_rel: float, target_rel: float, days: float) -> str:
    """The minimum detectable effect in words, never contradicting itself: when
    the MDE is already at or below the target there is nothing to wait for."""
    if not np.isfinite(mde_rel):
        return "not enough data for a power estimate"
    now = f"Minimum detectable effect now (80% power): {mde_rel:.2%}"
    if mde_rel <= target_rel:
        return f"{now}; a {target_rel:.0%} effect is already detectable."
    if not np.isfinite(days):
        return f"{now}; the time to reach {target_rel:.0%} is unknown (no traffic rate)."
    if days < 1:
        hours = max(days * 24, 0.1)
        return (
            f"{now}; reaching {target_rel:.0%} takes about {hours:.1f} more hours at "
            "the current traffic."
        )
    return (
        f"{now}; reaching {target_rel:.0%} takes about {days:.1f} more days at the current traffic."
    )


# ------------------------------------------------------------ batch means
def batch_means(
    control: Sequence[float] | np.ndarray, treatment: Sequence[float] | np.ndarray, metric: str
) -> Result:
    """Prometheus-only fallback: each arm's per-time-bucket values as the
    samples (batch means), Welch t between arms. Buckets are not independent
    units, so this is a rougher answer than unit-level data."""
    a = Mean.from_units([x for x in control if np.isfinite(x)])
    b = Mean.from_units([x for x in treatment if np.isfinite(x)])
    r = compare(metric, a, b)
    return replace(
        r,
        test="batch means (Welch t)",
        warning="from Prometheus time buckets, not experiment units: autocorrelated buckets make "
        "this p-value optimistic; A/B unit records (collectors) give a sounder answer",
    )
