"""The 12-dimension warm-up score: raw values, 0–1 scores, weights, composite.

Each dimension is computed from the canonical frames (see ``collectors.store``)
over the frames given, reports its raw value, unit and source, and is
normalised to 0–1 against a target and a worst value from
:class:`analysis.config.AnalysisConfig`:

* lower is better — ``1`` at or below target, ``0`` at or beyond worst,
  linear between;
* higher is better — the mirror image;
* target (grey-release penetration) — ``1 − |value − target| / max(target,
  1 − target)``.

A dimension without the data it needs says so (``value is None``, ``note``)
and is left out of the composite; nothing is invented.

Definitions:

==========================  ====================================================
request_latency             P95 TTFT (histograms, ``gen_ai.server.time_to_first_token``)
cache_hit_rate              hits / (hits + misses), all layers but ``weights``
prediction_mape             MAPE of a one-bucket-ahead EWMA forecast of requests per key family
warmup_qps_gain             GPU-s per request, control ÷ treatment − 1 (capacity gain at equal GPUs)
cold_start_time             mean seconds from a replica's first lookup until its per-minute hit
                            rate first reaches 90% of its median
gpu_memory_fluctuation      coefficient of variation of ``warmscope.gpu.memory.usage_ratio``,
                            mean over replicas
feature_load_latency        mean load duration after an ``embedding`` miss (all layers if none)
sla_deviation               share of requests that missed the TTFT SLA
ab_conversion_attribution   conversion rate, treatment ÷ control − 1
grey_release_penetration    share of experiment requests served by the treatment variant
resource_cost_share         warm-up GPU-s ÷ (warm-up + serving GPU-s)
roi_decay_coefficient       median fitted decay rate k (1/h) of the benefit after each run
==========================  ====================================================

Dynamic weighting: a dimension scoring below ``breach_below`` is breached and
its weight grows to ``w × (1 + dynamic_boost × (breach_below − s) /
breach_below)``; the weights of the dimensions with data are then renormalised
to sum to 1, and the composite is their weighted mean.

Example::

    card = score_card(frames, AnalysisConfig.load())
    card.composite, [d.name for d in card.dimensions if d.breached]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import pandas as pd

from .config import AnalysisConfig, DimensionSpec
from .heat import prediction_mape
from .hitrate import hit_table
from .latency import TTFT, hist_quantile
from .roi import benefit_series, fit_decay

__all__ = ["DimensionScore", "ScoreCard", "score_card", "normalise"]

Frames = Mapping[str, pd.DataFrame]


@dataclass(frozen=True)
class DimensionScore:
    name: str
    label: str
    value: float | None
    unit: str
    source: str
    score: float | None
    target: float
    weight: float
    effective_weight: float
    breached: bool
    note: str = ""


@dataclass(frozen=True)
class ScoreCard:
    dimensions: tuple[DimensionScore, ...]
    composite: float | None
    note: str = ""

    def as_frame(self) -> pd.DataFrame:
        return pd.DataFrame([d.__dict__ for d in self.dimensions])


def normalise(spec: DimensionSpec, value: float) -> float:
    if spec.better == "target":
        span = max(spec.target, 1 - spec.target) or 1.0
        return float(np.clip(1 - abs(value - spec.target) / span, 0, 1))
    if spec.better == "lower":
        s = (spec.worst - value) / (spec.worst - spec.target)
    else:
        s = (value - spec.worst) / (spec.target - spec.worst)
    return float(np.clip(s, 0, 1))


def _f(frames: Frames, name: str) -> pd.DataFrame:
    df = frames.get(name)
    return df if df is not None else pd.DataFrame()


# Each returns (value or None, source, note).
def _latency(fr: Frames, cfg: AnalysisConfig):
    q = hist_quantile(_f(fr, "histograms"), 0.95, TTFT) if len(_f(fr, "histograms")) else pd.DataFrame()
    if q.empty or not np.isfinite(q["value"].iloc[0]):
        return None, "histograms", "no TTFT histogram"
    return float(q["value"].iloc[0]), f"histograms: {TTFT} P95", ""


def _hit_rate(fr: Frames, cfg: AnalysisConfig):
    lk = _f(fr, "lookups")
    if lk.empty:
        return None, "lookups", "no lookups"
    t = hit_table(lk, mask=(lk["layer"] != "weights").to_numpy(dtype=bool))
    v = t["hit_rate"].iloc[0] if len(t) else np.nan
    return (None, "lookups", "no hit/miss lookups") if not np.isfinite(v) else \
        (float(v), "lookups: hits / (hits + misses), layers except weights", "")


def _mape(fr: Frames, cfg: AnalysisConfig):
    lk = _f(fr, "lookups")
    if lk.empty:
        return None, "lookups", "no lookups"
    if lk.attrs.get("step_s", 0) > cfg.prediction_freq_s:
        return None, "lookups", (f"needs lookups per {cfg.prediction_freq_s:g} s; these are per "
                                 f"{lk.attrs['step_s']:g} s (pick a range of 24 h or less)")
    v = prediction_mape(lk, cfg.prediction_freq_s, cfg.prediction_alpha)
    return (None, "lookups", "too little history to forecast") if not np.isfinite(v) else \
        (v, f"lookups: EWMA(alpha={cfg.prediction_alpha:g}) per family, {cfg.prediction_freq_s:g}-s buckets", "")


def _arms(fr: Frames, cfg: AnalysisConfig):
    req = _f(fr, "requests")
    if req.empty:
        return None
    e = req[req["experiment"].astype(bool)]
    g = e.groupby("variant")[["requests", "gpu_s", "conversions"]].sum()
    if cfg.treatment_variant not in g.index or len(g) < 2:
        return None
    t = g.loc[cfg.treatment_variant]
    c = g.drop(index=cfg.treatment_variant).sum()
    return t, c


def _qps_gain(fr: Frames, cfg: AnalysisConfig):
    arms = _arms(fr, cfg)
    if arms is None:
        return None, "requests", f"no experiment with treatment variant {cfg.treatment_variant!r}"
    t, c = arms
    if t["gpu_s"] <= 0 or c["requests"] <= 0 or t["requests"] <= 0:
        return None, "requests", "no GPU time recorded"
    return float((c["gpu_s"] / c["requests"]) / (t["gpu_s"] / t["requests"]) - 1), \
        "requests: GPU-s/request control ÷ treatment − 1", ""


def _cold_start(fr: Frames, cfg: AnalysisConfig):
    lk = _f(fr, "lookups")
    if lk.empty:
        return None, "lookups", "no lookups"
    if lk.attrs.get("step_s", 0) > 60:
        return None, "lookups", (f"needs per-minute lookups; these are per {lk.attrs['step_s']:g} s "
                                 "(pick a range of 24 h or less)")
    t = hit_table(lk, by=["replica"], freq=60, mask=(lk["layer"] != "weights").to_numpy(dtype=bool))
    times = []
    for _, g in t.groupby("replica"):
        g = g[g["lookups"] > 0]
        if len(g) < 5:
            continue
        med = g["hit_rate"].median()
        ok = g[g["hit_rate"] >= 0.9 * med]
        if len(ok):
            times.append(float(ok["bucket"].iloc[0] + 60 - g["bucket"].iloc[0]))
    if not times:
        return None, "lookups", "no replica with enough history"
    return float(np.mean(times)), "lookups: first minute at 90% of the replica's median hit rate", ""


def _gpu_mem(fr: Frames, cfg: AnalysisConfig):
    g = _f(fr, "gauges")
    if g.empty or "metric" not in g or not (g["metric"] == "warmscope.gpu.memory.usage_ratio").any():
        return None, "gauges", "no GPU memory gauge recorded (Telemetry.record_gpu_memory)"
    g = g[g["metric"] == "warmscope.gpu.memory.usage_ratio"]
    cv = g.groupby("replica")["value"].agg(lambda v: v.std(ddof=0) / v.mean() if v.mean() > 0 else np.nan)
    cv = cv.dropna()
    if cv.empty:
        return None, "gauges", "GPU memory always zero"
    return float(cv.mean()), "gauges: CV of warmscope.gpu.memory.usage_ratio per replica", ""


def _load_latency(fr: Frames, cfg: AnalysisConfig):
    h = _f(fr, "histograms")
    if h.empty:
        return None, "histograms", "no load durations recorded"
    ld = h[h["metric"] == "warmscope.cache.load.duration"]
    emb = ld[ld["layer"] == "embedding"]
    use, src = (emb, "embedding") if len(emb) else (ld, "all layers")
    if use.empty:
        return None, "histograms", "no load durations recorded"
    one = use.drop_duplicates(["ts", "tenant", "experiment", "variant", "model", "replica", "layer"])
    n = one["total"].sum()
    if n <= 0:
        return None, "histograms", "no load durations recorded"
    return float(one["sum"].sum() / n), f"histograms: mean warmscope.cache.load.duration ({src})", ""


def _sla(fr: Frames, cfg: AnalysisConfig):
    r = _f(fr, "requests")
    if r.empty:
        return None, "requests", "no requests"
    known = r[r["sla_met"].isin(["true", "false"])]
    n = known["requests"].sum()
    if n <= 0:
        return None, "requests", "SLA outcome not recorded"
    return float(known.loc[known["sla_met"] == "false", "requests"].sum() / n), "requests: sla_met = false share", ""


def _conv(fr: Frames, cfg: AnalysisConfig):
    arms = _arms(fr, cfg)
    if arms is None:
        return None, "requests", f"no experiment with treatment variant {cfg.treatment_variant!r}"
    t, c = arms
    if c["conversions"] <= 0 or t["requests"] <= 0:
        return None, "requests", "no conversions in the control arm"
    return float((t["conversions"] / t["requests"]) / (c["conversions"] / c["requests"]) - 1), \
        "requests: conversion rate treatment ÷ control − 1", ""


def _penetration(fr: Frames, cfg: AnalysisConfig):
    r = _f(fr, "requests")
    e = r[r["experiment"].astype(bool)] if len(r) else r
    n = e["requests"].sum() if len(e) else 0
    if n <= 0:
        return None, "requests", "no experiment traffic"
    return float(e.loc[e["variant"] == cfg.treatment_variant, "requests"].sum() / n), \
        f"requests: share on variant {cfg.treatment_variant}", ""


def _cost_share(fr: Frames, cfg: AnalysisConfig):
    runs, r = _f(fr, "warmup_runs"), _f(fr, "requests")
    serve = r["gpu_s"].sum() if len(r) else 0.0
    warm = runs["gpu_s"].fillna(0).sum() if len(runs) else 0.0
    if serve + warm <= 0:
        return None, "requests, warmup_runs", "no GPU time recorded"
    return float(warm / (serve + warm)), "warmup_runs.gpu_s ÷ (warm-up + serving GPU-s)", ""


def _decay(fr: Frames, cfg: AnalysisConfig):
    runs, r = _f(fr, "warmup_runs"), _f(fr, "requests")
    if runs.empty or r.empty:
        return None, "warmup_runs, requests", "no warm-up runs"
    ks = []
    for run in runs[runs["status"] == "ok"].itertuples():
        d = fit_decay(benefit_series(run, r, cfg.price_per_gpu_s, cfg.value_per_conversion, cfg.decay_horizon_s))
        if d.error is None and np.isfinite(d.k_per_hour) and d.b0 > 0:
            ks.append(d.k_per_hour)
    if not ks:
        return None, "warmup_runs, requests", "no run with a decaying benefit to fit"
    return float(np.median(ks)), f"median decay rate over {len(ks)} runs (benefit ~ b0·exp(−k·t))", ""


_COMPUTE: dict[str, Callable] = {
    "request_latency": _latency, "cache_hit_rate": _hit_rate, "prediction_mape": _mape,
    "warmup_qps_gain": _qps_gain, "cold_start_time": _cold_start, "gpu_memory_fluctuation": _gpu_mem,
    "feature_load_latency": _load_latency, "sla_deviation": _sla, "ab_conversion_attribution": _conv,
    "grey_release_penetration": _penetration, "resource_cost_share": _cost_share,
    "roi_decay_coefficient": _decay,
}


def score_card(frames: Frames, cfg: AnalysisConfig | None = None) -> ScoreCard:
    cfg = cfg or AnalysisConfig()
    raw = []
    for spec in cfg.dimensions:
        try:
            value, source, note = _COMPUTE[spec.name](frames, cfg)
        except (KeyError, ValueError) as e:  # a frame missing a column: say so, don't crash
            value, source, note = None, "", f"cannot compute: {e}"
        if value is not None and not np.isfinite(value):
            value, note = None, note or "not finite"
        score = normalise(spec, value) if value is not None else None
        raw.append((spec, value, source, note, score))
    weights = {}
    for spec, value, _, _, score in raw:
        if score is None:
            continue
        w = spec.weight
        if score < cfg.breach_below and cfg.breach_below > 0:
            w *= 1 + cfg.dynamic_boost * (cfg.breach_below - score) / cfg.breach_below
        weights[spec.name] = w
    total = sum(weights.values())
    dims = []
    for spec, value, source, note, score in raw:
        ew = weights.get(spec.name, 0.0) / total if total > 0 else 0.0
        dims.append(DimensionScore(
            spec.name, spec.label, value, spec.unit, source, score, spec.target, spec.weight, ew,
            score is not None and score < cfg.breach_below, note if value is not None else (note or "no data"),
        ))
    composite = sum(d.score * d.effective_weight for d in dims if d.score is not None) if total > 0 else None
    missing = [d.name for d in dims if d.score is None]
    return ScoreCard(tuple(dims), composite,
                     f"no data for: {', '.join(missing)} (left out of the composite)" if missing else "")
