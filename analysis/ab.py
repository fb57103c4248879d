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
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
from scipy import stats

from .hitrate import Z95
from .latency import quantile_from_buckets

__all__ = ["Proportion", "Mean", "Ratio", "Quantile", "Result", "compare", "srm", "SRM", "adjust", "cuped",
           "msprt", "power", "Power", "batch_means"]


# --------------------------------------------------------------- statistics
@dataclass(frozen=True)
class Proportion:
    n: int
    successes: int

    def __add__(self, o: "Proportion") -> "Proportion":
        return Proportion(self.n + o.n, self.successes + o.successes)

    @classmethod
    def from_units(cls, converted) -> "Proportion":
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

    def __add__(self, o: "Mean") -> "Mean":
        return Mean(self.n + o.n, self.sum + o.sum, self.sum_sq + o.sum_sq)

    @classmethod
    def from_units(cls, x) -> "Mean":
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

    def __add__(self, o: "Ratio") -> "Ratio":
        return Ratio(self.n + o.n, self.sum_x + o.sum_x, self.sum_y + o.sum_y, self.sum_x2 + o.sum_x2,
                     self.sum_y2 + o.sum_y2, self.sum_xy + o.sum_xy)

    @classmethod
    def from_units(cls, x, y) -> "Ratio":
        x = np.asarray(x, dtype=float)
        y = np.asarray(y, dtype=float)
        return cls(int(len(x)), float(x.sum()), float(y.sum()), float((x * x).sum()), float((y * y).sum()),
                   float((x * y).sum()))

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

    @classmethod
    def from_units(cls, q: float, bounds: Sequence[float], counts) -> "Quantile":
        c = np.asarray(counts, dtype=float).reshape(-1, len(bounds) + 1)
        tot = c.sum(axis=1)
        cum = np.cumsum(c, axis=1) - c  # C_uk: the unit's observations in buckets below k
        return cls(float(q), tuple(bounds), int((tot > 0).sum()), c.sum(axis=0), float(tot @ tot),
                   (cum * cum).sum(axis=0), (cum * c).sum(axis=0), (c * c).sum(axis=0), tot @ cum, tot @ c)

    def __add__(self, o: "Quantile") -> "Quantile":
        return Quantile(self.q, self.bounds, self.n + o.n, self.pooled + o.pooled, self.nn + o.nn,
                        self.cc + o.cc, self.cd + o.cd, self.dd + o.dd, self.cn + o.cn, self.dn + o.dn)

    @property
    def estimate(self) -> float:
        return float(quantile_from_buckets(np.array(self.bounds), self.pooled, self.q)[0])

    def _share_below(self):
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
        r = Ratio(self.n, below, total, self.cc[k] + 2 * f * self.cd[k] + f * f * self.dd[k], self.nn,
                  self.cn[k] + f * self.dn[k])
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
@dataclass(frozen=True)
class Result:
    metric: str
    kind: str
    control: float
    treatment: float
    abs_effect: float
    abs_low: float
    abs_high: float
    rel_effect: float
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

    @property
    def significant(self) -> bool:
        p = self.p_value if self.primary or not np.isfinite(self.p_holm) else self.p_holm
        return self.error is None and np.isfinite(p) and p < 0.05


def _nan_result(metric: str, kind: str, a: Stat, b: Stat, error: str) -> Result:
    nan = float("nan")
    return Result(metric, kind, nan, nan, nan, nan, nan, nan, nan, nan, nan, getattr(a, "n", 0),
                  getattr(b, "n", 0), "", error=error)


def compare(metric: str, control: Stat, treatment: Stat, alpha: float = 0.05, tau: float | None = None,
            primary: bool = False) -> Result:
    """Treatment vs control for one metric; never raises on degenerate data."""
    kind = type(control).__name__.lower()
    z = stats.norm.ppf(1 - alpha / 2)
    if type(control) is not type(treatment):
        return _nan_result(metric, kind, control, treatment, "control and treatment are different metric types")
    na, nb = control.n, treatment.n
    if na < 2 or nb < 2:
        return _nan_result(metric, kind, control, treatment,
                           f"not enough units: {na} in control, {nb} in treatment (need at least 2 each)")
    if isinstance(control, Ratio) and (control.sum_y == 0 or treatment.sum_y == 0):
        return _nan_result(metric, kind, control, treatment, "no denominator (e.g. zero lookups) in an arm")
    ea, eb = control.estimate, treatment.estimate
    va, vb = control.var_of_estimate(), treatment.var_of_estimate()
    if not (np.isfinite(ea) and np.isfinite(eb)):
        return _nan_result(metric, kind, control, treatment, "no estimate in an arm (no data)")
    d = eb - ea
    v = va + vb
    warning = None
    if not np.isfinite(v) or v <= 0:
        if d == 0:
            return replace(_nan_result(metric, kind, control, treatment,
                                       "zero variance in both arms and no difference: nothing to test"),
                           control=ea, treatment=eb, abs_effect=0.0)
        v = 0.0
        warning = "zero variance: the difference is exact, p-value and CI are degenerate"
    se = math.sqrt(v)
    if isinstance(control, Mean) and v > 0:
        df = v * v / ((va * va) / (na - 1) + (vb * vb) / (nb - 1)) if (va > 0 or vb > 0) else na + nb - 2
        tcrit = stats.t.ppf(1 - alpha / 2, df)
        p = 2 * stats.t.sf(abs(d) / se, df)
        lo, hi, test = d - tcrit * se, d + tcrit * se, "Welch t"
    elif isinstance(control, Proportion):
        pooled = (control.successes + treatment.successes) / (na + nb)
        sp = math.sqrt(pooled * (1 - pooled) * (1 / na + 1 / nb))
        p = 2 * stats.norm.sf(abs(d) / sp) if sp > 0 else (0.0 if d else 1.0)
        lo, hi, test = d - z * se, d + z * se, "two-proportion z"
    else:
        p = 2 * stats.norm.sf(abs(d) / se) if se > 0 else (0.0 if d else 1.0)
        lo, hi = d - z * se, d + z * se
        test = "delta-method z" if isinstance(control, Ratio) else "outer-CI z (Deng et al. 2018)"
    if ea != 0:
        rel = eb / ea - 1
        rse = math.sqrt(vb / ea ** 2 + eb ** 2 * va / ea ** 4)
        rlo, rhi = rel - z * rse, rel + z * rse
    else:
        rel = rlo = rhi = float("nan")
    seq_p, seq_lo, seq_hi = msprt(d, v, tau if tau is not None else _default_tau(ea), alpha)
    mde = (z + stats.norm.ppf(0.8)) * se
    return Result(metric, kind, ea, eb, d, lo, hi, rel, rlo, rhi, float(p), na, nb, test, seq_p=seq_p,
                  seq_low=seq_lo, seq_high=seq_hi, mde=mde, primary=primary, warning=warning)


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


def srm(counts: Sequence[float], planned: Sequence[float] | None = None, threshold: float = 0.001,
        what: str = "units") -> SRM:
    """Pearson χ² of observed counts against the planned split; flagged at p < threshold."""
    obs = np.asarray(counts, dtype=float)
    share = np.asarray(planned if planned is not None else [1.0] * len(obs), dtype=float)
    share = share / share.sum()
    if obs.sum() <= 0 or len(obs) < 2:
        return SRM(tuple(obs), tuple(share), float("nan"), float("nan"), False, what)
    exp = share * obs.sum()
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    p = float(stats.chi2.sf(chi2, len(obs) - 1))
    return SRM(tuple(obs.tolist()), tuple(share.tolist()), chi2, p, p < threshold, what)


# ------------------------------------------------------------ multiplicity
def adjust(p_values: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Holm and Benjamini–Hochberg adjusted p-values (NaN stays NaN)."""
    p = np.asarray(p_values, dtype=float)
    ok = np.isfinite(p)
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
def cuped(y, x, arm) -> tuple[np.ndarray, float, float]:
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
    if not (np.isfinite(diff) and np.isfinite(var)) or var <= 0 or tau <= 0:
        return float("nan"), float("nan"), float("nan")
    t2 = tau * tau
    log_lam = 0.5 * math.log(var / (var + t2)) + t2 * diff * diff / (2 * var * (var + t2))
    p = float(min(1.0, math.exp(-log_lam))) if log_lam < 700 else 0.0
    half = math.sqrt(2 * var * (var + t2) / t2 * (math.log(1 / alpha) + 0.5 * math.log((var + t2) / var)))
    return p, diff - half, diff + half


# ------------------------------------------------------------------ power
@dataclass(frozen=True)
class Power:
    mde_abs: float
    mde_rel: float
    target_rel: float
    units_needed: float
    days_to_target: float
    note: str = ""


def power(control: Stat, treatment: Stat, days_observed: float, target_rel: float = 0.02,
          alpha: float = 0.05, power_: float = 0.8) -> Power:
    """MDE now (80% power), and the time to reach ``target_rel`` at the current traffic."""
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
    return Power(mde, mde_rel, target_rel, need, days)


# ------------------------------------------------------------ batch means
def batch_means(control: Sequence[float], treatment: Sequence[float], metric: str) -> Result:
    """Prometheus-only fallback: each arm's per-time-bucket values as the
    samples (batch means), Welch t between arms. Buckets are not independent
    units, so this is a rougher answer than unit-level data."""
    a = Mean.from_units([x for x in control if np.isfinite(x)])
    b = Mean.from_units([x for x in treatment if np.isfinite(x)])
    r = compare(metric, a, b)
    return replace(r, test="batch means (Welch t)",
                   warning="from Prometheus time buckets, not experiment units: autocorrelated buckets make "
                           "this p-value optimistic; A/B unit records (collectors) give a sounder answer")
