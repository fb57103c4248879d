"""The value model: what a warm-up buys, priced.

A warmed key that is read turns a miss into a hit. That hit saves the miss's work: GPU-seconds, and
— since a miss is on the request's critical path — the same seconds of time to first token (TTFT)
for the request that reads it. Two prices turn that into money:

* **GPU-seconds** — ``price_per_gpu_s`` (configured, ``[analysis] price_per_gpu_s``);
* **latency**, one of
  - a *conversion/value response to TTFT* measured from the data: the slope ``β`` of revenue per
    request on a unit's mean request latency, by weighted least squares over the A/B units
    (weights: the unit's requests), with a heteroscedasticity-robust (HC1) 95 % interval. A TTFT
    saving shortens the request by the same seconds, so ``−β`` is the value of one request-second
    of TTFT saved (:func:`conversion_response`). The slope on TTFT alone is confounded: units with
    long prompts (slow first tokens) also have long answers (slow requests) — on the demo day it is
    −0.33 per second against the simulator's own law, −R/τ = −0.082; on latency it is −0.062.
  - a configured *SLO*: ``penalty`` per request whose TTFT is over ``target_s``. Moving a request's
    TTFT down by ``δ`` saves the penalty when its TTFT was in ``(target, target + δ]``, so one
    request-second saved is worth ``penalty × f(target)``, with ``f`` the TTFT density at the
    target, read from the recorded TTFT histogram (:func:`slo_price`); its interval is binomial on
    the requests in the histogram buckets around the target.

``ValueModel.per_hit(seconds)`` is the value of one extra hit whose miss costs ``seconds``, with its
interval; ``ValueModel.prices()`` says which prices it used. With no conversion data and no SLO the
value model is GPU-seconds only, and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "Elasticity",
    "ValueModel",
    "conversion_response",
    "slo_price",
    "value_model",
    "values_for",
    "MIN_UNITS",
    "TokenLatency",
    "ttft_per_token",
    "fit_token_latency",
]

MIN_UNITS = 30  # units with requests needed to fit the conversion response
Z95 = 1.959963984540054


@dataclass(frozen=True)
class Elasticity:
    """Revenue per request against a unit's mean request latency: ``slope`` (currency per request
    per second; negative when slower requests earn less) with its 95 % interval."""

    slope: float
    ci_low: float
    ci_high: float
    units: int
    requests: float
    revenue_per_request: float
    mean_latency_s: float

    @property
    def significant(self) -> bool:
        return self.ci_high < 0 or self.ci_low > 0

    def sentence(self) -> str:
        return (
            f"revenue per request changes by {self.slope:+.4f} per second of latency (95 % CI "
            f"{self.ci_low:+.4f} to {self.ci_high:+.4f}; {self.units:,} A/B units, "
            f"{self.requests:,.0f} requests)"
        )


def conversion_response(units: pd.DataFrame, min_units: int = MIN_UNITS) -> Elasticity | str:
    """Fit the value response to latency over A/B unit rows (``requests``, ``latency_sum``,
    ``value``, ``conversions``). Returns the fit, or one sentence saying what is missing."""
    if units is None or len(units) == 0:
        return "no conversion data: no A/B unit records in the range"
    u = units[units["requests"] > 0]
    if float(u["conversions"].sum()) <= 0:
        return "no conversion data: the A/B units record no conversions"
    if len(u) < min_units:
        return (
            f"not enough points: {len(u)} A/B units with requests, {min_units} needed for "
            "the conversion response"
        )
    n = u["requests"].to_numpy(float)
    x = u["latency_sum"].to_numpy(float) / n
    y = u["value"].to_numpy(float) / n
    if float(np.ptp(x)) <= 0:
        return "not enough points: every A/B unit has the same mean latency"
    X = np.column_stack([np.ones_like(x), x])
    W = n
    XtWX = X.T @ (X * W[:, None])
    beta = np.linalg.solve(XtWX, X.T @ (W * y))
    e = y - X @ beta
    inv = np.linalg.inv(XtWX)
    meat = X.T @ (X * (W**2 * e**2)[:, None])
    k = len(u)
    cov = inv @ meat @ inv * k / max(k - 2, 1)  # HC1
    se = math.sqrt(max(float(cov[1, 1]), 0.0))
    b = float(beta[1])
    return Elasticity(
        b,
        b - Z95 * se,
        b + Z95 * se,
        k,
        float(n.sum()),
        float(np.sum(W * y) / n.sum()),
        float(np.sum(W * x) / n.sum()),
    )


def slo_price(
    histograms: pd.DataFrame, target_s: float, penalty: float
) -> tuple[float, float, float] | str:
    """Value of one request-second of TTFT saved under an SLO: ``penalty × f(target)``, ``f`` the
    TTFT density at the target from the recorded ``ttft`` histogram (the buckets either side of the
    target). Returns (value, ci_low, ci_high) or a sentence saying what is missing."""
    if histograms is None or len(histograms) == 0:
        return "no TTFT histogram in the range"
    h = histograms[histograms["metric"].astype(str).str.contains("time_to_first_token|ttft")]
    if h.empty:
        return "no TTFT histogram in the range"
    g = h.groupby("le")["count"].sum().sort_index()
    edges = g.index.to_numpy(float)
    counts = g.to_numpy(float)
    total = float(counts.sum())
    if total <= 0:
        return "no TTFT histogram in the range"
    # the finite bucket holding the target, and its neighbour past it: density = share / width
    i = int(np.searchsorted(edges, target_s))
    if i >= len(edges) or not np.isfinite(edges[i]):
        return f"the TTFT histogram has no finite bucket above the {target_s:g} s target"
    lo_edge = edges[i - 1] if i > 0 else 0.0
    j = min(i + 1, len(edges) - 1)
    hi_edge = edges[j] if np.isfinite(edges[j]) else edges[i]
    width = hi_edge - lo_edge
    c = float(counts[i] + (counts[j] if j != i and np.isfinite(edges[j]) else 0.0))
    share = c / total
    se = math.sqrt(share * (1 - share) / total)
    f, f_lo, f_hi = share / width, max(share - Z95 * se, 0.0) / width, (share + Z95 * se) / width
    return penalty * f, penalty * f_lo, penalty * f_hi


@dataclass(frozen=True)
class TokenLatency:
    """TTFT per request against the prompt tokens it missed in a cache layer (``ttft = fixed_s +
    per_token_s × missed``), fitted over A/B units: what one missed token costs in TTFT, with its
    95 % interval."""

    fixed_s: float
    per_token_s: float
    ci_low: float
    ci_high: float
    units: int
    requests: float
    mean_missed: float = 0.0  # the weighted means the line passes through
    mean_ttft_s: float = 0.0

    def ttft(self, missed_tokens: float) -> float:
        """The fitted TTFT of a request that misses ``missed_tokens``."""
        return self.fixed_s + self.per_token_s * missed_tokens

    def sentence(self) -> str:
        return (
            f"TTFT = {self.fixed_s:.4f} s + {self.per_token_s * 1000:.4f} ms per missed token "
            f"(95 % CI {self.ci_low * 1000:.4f} to {self.ci_high * 1000:.4f} ms; "
            f"{self.units:,} A/B units, {self.requests:,.0f} requests)"
        )


def _wls_hc1(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, float]:
    """Weighted least squares of ``y`` on ``x`` with an intercept: (coefficients, HC1 standard
    error of the slope)."""
    X = np.column_stack([np.ones_like(x), x])
    XtWX = X.T @ (X * w[:, None])
    beta = np.linalg.solve(XtWX, X.T @ (w * y))
    e = y - X @ beta
    inv = np.linalg.inv(XtWX)
    meat = X.T @ (X * (w**2 * e**2)[:, None])
    k = len(x)
    cov = inv @ meat @ inv * k / max(k - 2, 1)  # HC1
    return beta, math.sqrt(max(float(cov[1, 1]), 0.0))


def ttft_per_token(
    units: pd.DataFrame | None, layer: str = "prefix_kv", min_units: int = MIN_UNITS
) -> TokenLatency | str:
    """Fit a unit's mean TTFT per request on its mean missed tokens per request in ``layer``
    (``lookups_<layer> − hits_<layer>``, tokens for an engine's prefix cache), weighted by the
    unit's requests, with an HC1 interval on the slope. Returns the fit, or one sentence saying
    what is missing."""
    lk, hk = f"lookups_{layer}", f"hits_{layer}"
    if units is None or len(units) == 0 or lk not in units.columns:
        return f"no A/B unit records with {layer} lookups: no per-request TTFT to price a miss"
    u = units[(units["requests"] > 0) & (units[lk] > 0) & (units["ttft_sum"] > 0)]
    if len(u) < min_units:
        return (
            f"not enough points: {len(u)} A/B units with TTFT and {layer} lookups, {min_units} "
            "needed to measure what a missed token costs in TTFT"
        )
    n = u["requests"].to_numpy(float)
    x = (u[lk] - u[hk]).to_numpy(float) / n
    y = u["ttft_sum"].to_numpy(float) / n
    if float(np.ptp(x)) <= 0:
        return "not enough points: every A/B unit missed the same number of tokens per request"
    beta, se = _wls_hc1(x, y, n)
    b = float(beta[1])
    return TokenLatency(
        float(beta[0]),
        b,
        b - Z95 * se,
        b + Z95 * se,
        len(u),
        float(n.sum()),
        float(np.sum(n * x) / n.sum()),
        float(np.sum(n * y) / n.sum()),
    )


def fit_token_latency(
    missed: np.ndarray, ttft: np.ndarray, min_requests: int = MIN_UNITS
) -> TokenLatency | str:
    """TTFT per request against the prompt tokens it missed (``ttft = fixed_s + per_token_s ×
    missed``), least squares over requests with an HC1 interval on the slope: what one missed
    token costs, from a block trace's own requests. Returns the fit, or one sentence saying what
    is missing."""
    x = np.asarray(missed, float)
    y = np.asarray(ttft, float)
    ok = np.isfinite(x) & np.isfinite(y) & (y > 0)
    x, y = x[ok], y[ok]
    if len(x) < min_requests:
        return (
            f"not enough points: {len(x)} requests with a time to first token, {min_requests} "
            "needed to measure what a missed token costs"
        )
    if float(np.ptp(x)) <= 0:
        return "not enough points: every request missed the same number of tokens"
    w = np.ones_like(x)
    beta, se = _wls_hc1(x, y, w)
    b = float(beta[1])
    return TokenLatency(
        float(beta[0]),
        b,
        b - Z95 * se,
        b + Z95 * se,
        0,
        float(len(x)),
        float(x.mean()),
        float(y.mean()),
    )


@dataclass(frozen=True)
class ValueModel:
    """Prices of a warm-up's effects: ``kind`` is "conversion", "slo" or "gpu_s"."""

    kind: str
    price_per_gpu_s: float
    per_ttft_s: float  # currency per request-second of TTFT saved (0 when latency is not priced)
    per_ttft_s_ci: tuple[float, float]
    note: str  # where the latency price came from, or why there is none

    def per_hit(self, seconds: float) -> tuple[float, float, float]:
        """Value of one extra hit whose miss costs ``seconds`` (GPU-s and TTFT): (value, low,
        high)."""
        g = seconds * self.price_per_gpu_s
        lo, hi = self.per_ttft_s_ci
        return g + seconds * self.per_ttft_s, g + seconds * lo, g + seconds * hi

    def prices(self) -> str:
        """One sentence naming the prices used and their uncertainty."""
        gpu = f"GPU-s at {self.price_per_gpu_s:g} each (configured)"
        if self.kind == "gpu_s":
            return f"Priced on {gpu} only; latency not priced: {self.note}."
        lo, hi = self.per_ttft_s_ci
        return (
            f"Priced on {gpu} and TTFT at {self.per_ttft_s:.4g} per request-second saved (95 % CI "
            f"{lo:.4g} to {hi:.4g}) from {self.note}."
        )


def value_model(
    price_per_gpu_s: float,
    units: pd.DataFrame | None = None,
    histograms: pd.DataFrame | None = None,
    slo_target_s: float | None = None,
    slo_penalty: float | None = None,
    prefer: str = "conversion",
) -> ValueModel:
    """The value model the data supports: the measured conversion response when there is conversion
    data (``prefer="conversion"``), else a configured SLO, else GPU-seconds only."""
    reasons = []
    if prefer in ("conversion", "value"):
        el = conversion_response(units if units is not None else pd.DataFrame())
        if isinstance(el, Elasticity):
            # a slope with the wrong sign (faster requests earn less) is priced at zero, not
            # negative
            v, lo, hi = -el.slope, -el.ci_high, -el.ci_low
            return ValueModel(
                "conversion",
                price_per_gpu_s,
                max(v, 0.0),
                (max(lo, 0.0), max(hi, 0.0)),
                "the conversion response to latency measured over the A/B units: " + el.sentence(),
            )
        reasons.append(el)
    if slo_target_s is not None and slo_penalty is not None:
        sp = slo_price(
            histograms if histograms is not None else pd.DataFrame(), slo_target_s, slo_penalty
        )
        if not isinstance(sp, str):
            return ValueModel(
                "slo",
                price_per_gpu_s,
                sp[0],
                (sp[1], sp[2]),
                f"the SLO: {slo_penalty:g} per request over {slo_target_s:g} s TTFT, times the "
                "recorded TTFT density at the target",
            )
        reasons.append(sp)
    elif prefer == "slo":
        reasons.append("no SLO configured (target and penalty)")
    return ValueModel(
        "gpu_s", price_per_gpu_s, 0.0, (0.0, 0.0), "; ".join(reasons) or "not requested"
    )


def values_for(
    src: Any,
    frames: dict[Any, Any],
    start: float,
    end: float,
    slo_ttft_s: float | None,
    slo_penalty: float | None,
    objective: str | None,
) -> ValueModel:
    """The value model the store supports: the A/B units active in [start, end] (all experiments)
    for the conversion response, the TTFT histogram for an SLO price, prices from ``[analysis]``."""
    from .config import AnalysisConfig

    cfg = AnalysisConfig.load()
    parts = [src.units(e) for e in src.experiments()]
    units = (
        pd.concat([u for u in parts if len(u)], ignore_index=True)
        if any(len(u) for u in parts)
        else None
    )
    if units is not None:
        units = units[(units["last_ts"] >= start) & (units["first_ts"] <= end)]
    prefer = "slo" if objective == "slo" else "conversion"
    return value_model(
        cfg.price_per_gpu_s,
        units,
        frames.get("histograms"),
        slo_ttft_s if slo_ttft_s is not None else cfg.slo_ttft_s,
        slo_penalty,
        prefer,
    )
