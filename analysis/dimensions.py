"""The score card's dimensions: what each one measures, from which frames, and how it is scored.

Each dimension is a computation declared with ``@dimension(...)``: its name, label, unit,
direction (``better``), target, worst value and base weight, and the canonical frames it reads
(see ``collectors.store``). It returns a :class:`Measurement` — the raw value, its source and a
note, and a 95% CI where the value is an estimate. A dimension without the data it needs says so
(``value`` None and a note); nothing is invented. :data:`DIMENSIONS` is the registry, in order;
:mod:`analysis.scores` turns measurements into 0–1 scores and the composite, and
:class:`analysis.config.AnalysisConfig` carries the targets, worst values and weights (defaults
from here, overridable in the configuration).

Definitions (95% CI in brackets where the value is an estimate):

==========================  ====================================================
request_latency             P95 TTFT (histograms) [outer CI, requests as draws]
cache_hit_rate              hits / (hits + misses), all layers but ``weights`` [Wilson]
prediction_mape             held-back MAPE of the request forecast per key family
                            ``prediction_freq_s`` (15 s) ahead — the model
                            ``analysis.forecast`` keeps against its seasonal-naive and
                            exponential-smoothing baselines; per-minute lookups are
                            scored one bucket ahead and say so; hourly rollups: no data
                            [batch means over 10 time blocks of the held-back part]
warmup_qps_gain             GPU-s per request, control ÷ treatment − 1 [hourly batch means]
cold_start_time             mean seconds from each replica start in the range (a
                            ``replica_start``/``replica_restart`` warm-up) until the
                            replica's per-minute hit rate first reaches 90% of its median
                            [t over starts]; no start in the range: no data
gpu_memory_fluctuation      coefficient of variation of ``warmscope.gpu.memory.usage_ratio``,
                            mean over replicas; a gauge pinned at its ceiling: no data
feature_load_latency        mean load duration after an ``embedding`` miss (all layers if
                            none); every load the same (a constant): no data
sla_deviation               share of requests that missed the TTFT SLA [Wilson]
ab_conversion_attribution   conversion rate, treatment ÷ control − 1 [hourly batch means]
grey_release_penetration    treatment's share of experiment requests in the last hour
                            while it ramps; a fixed split (no change across hours): no data
resource_cost_share         warm-up GPU-s ÷ (warm-up + serving GPU-s) (exact)
warmup_roi                  compute ROI over T+5 min after each warm-up, runs merged per
                            replica, pooled: (Σ saved × price − Σ cost) / Σ cost [summed
                            window variances]; the benefit's decay rate is in the note
==========================  ====================================================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np
import pandas as pd
from scipy import stats
from warmscope.model.records import FRAMES, not_in_hit_rate
from warmscope.model.registry import require, unique

from .buckets import bucket_start
from .forecast import prediction_error
from .hitrate import Z95, hit_table, wilson
from .latency import TTFT, all_bounds, quantile_from_buckets
from .roi import benefit_series, decay_summary, fit_decay, replica_runs, roi_windows

__all__ = ["DimensionSpec", "DIMENSIONS", "Measurement", "Settings", "dimension", "build"]

Frames = Mapping[str, pd.DataFrame]
BETTER = ("lower", "higher", "target")


@dataclass(frozen=True)
class Measurement:
    """A dimension's measurement: the value (None: no data, the note says why), where it comes
    from, and its 95% CI when it is an estimate (None: an exact count)."""

    value: float | None
    source: str
    note: str = ""
    ci: tuple[float, float] | None = None


class Settings(Protocol):
    """The analysis settings the computations read (:class:`analysis.config.AnalysisConfig`)."""

    @property
    def treatment_variant(self) -> str: ...
    @property
    def prediction_freq_s(self) -> float: ...
    @property
    def roi_window_s(self) -> float: ...
    @property
    def price_per_gpu_s(self) -> float: ...
    @property
    def value_per_conversion(self) -> float: ...
    @property
    def decay_horizon_s(self) -> float: ...


Compute = Callable[[Frames, Settings], Measurement]


@dataclass(frozen=True)
class DimensionSpec:
    """One dimension of the score card: how it is computed, from which frames, and how it is scored.

    ``compute(frames, cfg)`` is given only the ``frames`` declared here. ``better`` is ``"lower"``,
    ``"higher"`` or ``"target"``; the score is 1 at ``target`` and 0 at ``worst``. ``weight`` is
    the base weight in the composite (renormalised over the dimensions with data); ``[analysis.
    dimensions.NAME]`` in the configuration can override target, worst and weight."""

    name: str
    label: str
    unit: str
    better: str
    target: float
    worst: float
    weight: float
    compute: Compute = field(repr=False, compare=False)
    frames: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        def need(ok: object, problem: str) -> None:
            require(ok, "score dimension", self.name, problem)

        need(
            isinstance(self.name, str) and self.name.isidentifier(),
            "the name must be an identifier",
        )
        need(self.label, "needs a label people read")
        need(
            self.better in BETTER, f"better must be one of {', '.join(BETTER)}, got {self.better!r}"
        )
        for f in ("target", "worst", "weight"):
            need(isinstance(getattr(self, f), int | float), f"{f} must be a number")
        need(self.weight >= 0, f"weight must be >= 0, got {self.weight}")
        need(
            self.better == "target" or self.target != self.worst,
            f"target and worst must differ (both {self.target})",
        )
        need(callable(self.compute), "needs compute(frames, cfg)")
        need(self.frames, "needs the frames it reads (frames=(...))")
        unknown = [f for f in self.frames if f not in FRAMES]
        need(not unknown, f"reads frames no record declares: {', '.join(unknown)}")


_DECLARED: list[tuple[dict[str, Any], Compute]] = []


def dimension(
    name: str,
    label: str,
    unit: str,
    better: str,
    target: float,
    worst: float,
    weight: float | None = None,
    *,
    frames: tuple[str, ...],
) -> Callable[[Compute], Compute]:
    """Declare the decorated function as the computation of score dimension ``name``.

    ``weight=None``: an equal share of what the dimensions with an explicit weight leave of 1. The
    entry is checked when this module is imported (:class:`DimensionSpec`)."""

    def register(fn: Compute) -> Compute:
        _DECLARED.append(
            (
                dict(
                    name=name,
                    label=label,
                    unit=unit,
                    better=better,
                    target=target,
                    worst=worst,
                    weight=weight,
                    frames=frames,
                ),
                fn,
            )
        )
        return fn

    return register


def build(declared: list[tuple[dict[str, Any], Compute]]) -> tuple[DimensionSpec, ...]:
    """The registry from ``@dimension`` declarations: shares of the remaining weight resolved, each
    entry checked (``RegistryError`` names the dimension and what is missing)."""
    unique("score dimension", [d["name"] for d, _ in declared])
    fixed = sum(d["weight"] for d, _ in declared if d["weight"] is not None)
    shared = [d["name"] for d, _ in declared if d["weight"] is None]
    require(
        fixed <= 1 or not shared,
        "score dimension",
        ", ".join(shared),
        f"no weight left to share: the explicit weights sum to {fixed}",
    )
    share = round((1 - fixed) / len(shared), 6) if shared else 0.0
    return tuple(
        DimensionSpec(**{**d, "weight": share if d["weight"] is None else d["weight"]}, compute=fn)
        for d, fn in declared
    )


def _f(frames: Frames, name: str) -> pd.DataFrame:
    df = frames.get(name)
    return df if df is not None else pd.DataFrame()


def _in_hit_rate(lk: pd.DataFrame) -> np.ndarray:
    """The rows of layers counted in hit rates (``records.LAYERS``' ``in_hit_rate``)."""
    return cast(np.ndarray, (~lk["layer"].isin(not_in_hit_rate())).to_numpy(dtype=bool))


def _layers_counted() -> str:
    out = not_in_hit_rate()
    return ("layers except " + ", ".join(out)) if out else "all layers"


# Each returns a Measurement: (value or None, source, note[, (ci_low, ci_high)]). No CI means
# the value is an exact count (an accounting quantity), not an estimate.
@dimension(
    "request_latency", "Request latency (TTFT P95)", "s", "lower", 1.0, 5.0, frames=("histograms",)
)
def _latency(fr: Frames, cfg: Settings) -> Measurement:
    h = _f(fr, "histograms")
    h = h[h["metric"] == TTFT] if len(h) else h
    if h.empty:
        return Measurement(None, "histograms", "no TTFT histogram")
    counts = h.groupby("le")["count"].sum()
    les = all_bounds(TTFT, counts.index.astype(float))
    c = counts.reindex(les, fill_value=0).to_numpy(float)
    b = les[np.isfinite(les)]
    n = c.sum()
    v = float(quantile_from_buckets(b, c, 0.95)[0])
    if n <= 0 or not np.isfinite(v):
        return Measurement(None, "histograms", "no TTFT histogram")
    if c[:-1].sum() < 0.95 * n:
        return Measurement(
            None, "histograms", f"TTFT P95 is beyond the last bucket edge (> {b[-1]:g} s)"
        )
    # Outer CI (requests as independent draws): the ranks 0.95 ± z·sqrt(0.95·0.05/n) mapped back.
    half = Z95 * np.sqrt(0.95 * 0.05 / n)
    lo, hi = (
        float(quantile_from_buckets(b, c, float(np.clip(0.95 + d, 0, 1)))[0]) for d in (-half, half)
    )
    return Measurement(v, f"histograms: {TTFT} P95", "", (lo, hi))


@dimension("cache_hit_rate", "Cache hit rate", "ratio", "higher", 0.8, 0.3, frames=("lookups",))
def _hit_rate(fr: Frames, cfg: Settings) -> Measurement:
    lk = _f(fr, "lookups")
    if lk.empty:
        return Measurement(None, "lookups", "no lookups")
    t = hit_table(lk, mask=_in_hit_rate(lk))
    v = t["hit_rate"].iloc[0] if len(t) else np.nan
    if not np.isfinite(v):
        return Measurement(None, "lookups", "no hit/miss lookups")
    return Measurement(
        float(v),
        f"lookups: hits / (hits + misses), {_layers_counted()}",
        "",
        (float(t["ci_low"].iloc[0]), float(t["ci_high"].iloc[0])),
    )


def _step(lk: pd.DataFrame) -> float:
    step = float(lk.attrs.get("step_s", 0) or 0)
    if step:
        return step
    ts = np.unique(lk["ts"].to_numpy(float))
    d = np.diff(ts)
    return float(d[d > 0].min()) if len(d) and (d > 0).any() else 0.0


@dimension(
    "prediction_mape",
    "Request-prediction error (MAPE)",
    "ratio",
    "lower",
    0.15,
    0.6,
    0.18,
    frames=("lookups",),
)
def _mape(fr: Frames, cfg: Settings) -> Measurement:
    lk = _f(fr, "lookups")
    if lk.empty:
        return Measurement(None, "lookups", "no lookups")
    pe = prediction_error(lk, horizon_s=cfg.prediction_freq_s)
    if not np.isfinite(pe.value):
        return Measurement(None, "lookups", pe.note)
    return Measurement(pe.value, f"lookups: {pe.note}", "", pe.ci)


def _arms(fr: Frames, cfg: Settings) -> tuple[pd.Series, pd.Series] | None:
    req = _f(fr, "requests")
    if req.empty:
        return None
    e = req[req["experiment"].astype(bool)]
    g = e.groupby("variant")[["requests", "gpu_s", "conversions"]].sum()
    if cfg.treatment_variant not in g.index or len(g) < 2:
        return None
    t = cast(pd.Series, g.loc[cfg.treatment_variant])  # one row: the index is the unique variants
    c = g.drop(index=cfg.treatment_variant).sum()
    return t, c


def _hourly_ci(
    fr: Frames, cfg: Settings, stat: Callable[[pd.Series, pd.Series], float]
) -> float | None:
    """95% CI of a treatment-vs-control statistic from hourly batch means
    (Student t over the hours); None with fewer than 3 hours."""
    req = _f(fr, "requests")
    e = req[req["experiment"].astype(bool)]
    e = e.assign(
        hour=bucket_start(e["ts"], 3600.0),
        arm=np.where(e["variant"] == cfg.treatment_variant, "t", "c"),
    )
    g = e.groupby(["hour", "arm"])[["requests", "gpu_s", "conversions"]].sum().unstack("arm")
    vals = []
    for _, row in g.iterrows():
        t, c = row.xs("t", level="arm"), row.xs("c", level="arm")
        with np.errstate(invalid="ignore", divide="ignore"):
            v = stat(t, c)
        if np.isfinite(v):
            vals.append(v)
    if len(vals) < 3:
        return None
    x = np.asarray(vals)
    half = float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
    return half


def _arm_effect(
    fr: Frames,
    cfg: Settings,
    effect: Callable[[pd.Series, pd.Series], float],
    what: str,
    lacks: Callable[[pd.Series, pd.Series], str | None],
) -> Measurement:
    """``effect(treatment, control)`` over the experiment's arms' totals, its CI from hourly batch
    means; no data when there is no experiment, or when ``lacks(t, c)`` says what is missing."""
    arms = _arms(fr, cfg)
    if arms is None:
        return Measurement(
            None, "requests", f"no experiment with treatment variant {cfg.treatment_variant!r}"
        )
    t, c = arms
    missing = lacks(t, c)
    if missing:
        return Measurement(None, "requests", missing)
    v = float(effect(t, c))
    half = _hourly_ci(fr, cfg, effect)
    ci = (v - half, v + half) if half is not None else None
    return Measurement(v, f"requests: {what} (CI: hourly batch means)", "", ci)


def _gpu_gain(t: pd.Series, c: pd.Series) -> float:
    return cast(float, (c["gpu_s"] / c["requests"]) / (t["gpu_s"] / t["requests"]) - 1)


def _conversion_lift(t: pd.Series, c: pd.Series) -> float:
    return cast(float, (t["conversions"] / t["requests"]) / (c["conversions"] / c["requests"]) - 1)


@dimension("warmup_qps_gain", "Warm-up QPS gain", "ratio", "higher", 0.2, 0.0, frames=("requests",))
def _qps_gain(fr: Frames, cfg: Settings) -> Measurement:
    def lacks(t: pd.Series, c: pd.Series) -> str | None:
        no_time = t["gpu_s"] <= 0 or c["requests"] <= 0 or t["requests"] <= 0
        return "no GPU time recorded" if no_time else None

    return _arm_effect(fr, cfg, _gpu_gain, "GPU-s/request control ÷ treatment − 1", lacks)


_STARTS = ("replica_start", "replica_restart")


@dimension(
    "cold_start_time",
    "Cold-start time",
    "s",
    "lower",
    300.0,
    1800.0,
    frames=("lookups", "warmup_runs"),
)
def _cold_start(fr: Frames, cfg: Settings) -> Measurement:
    lk, runs = _f(fr, "lookups"), _f(fr, "warmup_runs")
    if lk.empty:
        return Measurement(None, "lookups", "no lookups")
    if lk.attrs.get("step_s", 0) > 60:
        return Measurement(
            None,
            "lookups",
            f"needs per-minute lookups; these are per {lk.attrs['step_s']:g} s "
            "(pick a range of 24 h or less)",
        )
    starts = (
        runs[runs["trigger"].isin(_STARTS)] if len(runs) and "trigger" in runs else runs.iloc[0:0]
    )
    if starts.empty:
        return Measurement(
            None, "warmup_runs, lookups", "no replica started in this range (nothing to time)"
        )
    starts = starts.groupby(["replica", "started"], as_index=False).size()
    t = hit_table(lk, by=["replica"], freq=60, mask=_in_hit_rate(lk))
    t = t[t["lookups"] > 0]
    t_end = float(lk["ts"].max())
    times = []
    r: Any  # an itertuples row: pandas types its fields as any scalar
    for r in starts.itertuples():
        g = t[(t["replica"] == r.replica) & (t["bucket"] >= r.started - 60)]
        nxt = starts[(starts["replica"] == r.replica) & (starts["started"] > r.started)]["started"]
        if len(nxt):
            g = g[g["bucket"] < nxt.min()]
        if len(g) < 5 or t_end - r.started < 1800:
            continue
        med = g["hit_rate"].median()
        ok = g[g["hit_rate"] >= 0.9 * med]
        if len(ok):
            times.append(float(ok["bucket"].iloc[0] + 60 - r.started))
    if not times:
        return Measurement(
            None,
            "warmup_runs, lookups",
            "no replica start with 30 min of traffic after it in this range",
        )
    v = float(np.mean(times))
    ci = None
    if len(times) >= 2:
        half = float(
            stats.t.ppf(0.975, len(times) - 1) * np.std(times, ddof=1) / np.sqrt(len(times))
        )
        ci = (max(v - half, 0.0), v + half)  # a time is never negative
    return Measurement(
        v,
        f"lookups: minutes from {len(times)} replica start(s) to 90% of the "
        "replica's median hit rate",
        "",
        ci,
    )


@dimension(
    "gpu_memory_fluctuation",
    "GPU memory fluctuation (CV)",
    "ratio",
    "lower",
    0.1,
    0.5,
    frames=("gauges",),
)
def _gpu_mem(fr: Frames, cfg: Settings) -> Measurement:
    g = _f(fr, "gauges")
    if (
        g.empty
        or "metric" not in g
        or not (g["metric"] == "warmscope.gpu.memory.usage_ratio").any()
    ):
        return Measurement(
            None, "gauges", "no GPU memory gauge recorded (Telemetry.record_gpu_memory)"
        )
    g = g[g["metric"] == "warmscope.gpu.memory.usage_ratio"]
    if g["value"].min() >= 0.99:
        return Measurement(
            None,
            "gauges",
            f"GPU memory sits at its ceiling ({g['value'].mean():.2%}) all range: a full "
            "cache pool, so its fluctuation says nothing",
        )
    cv = g.groupby("replica")["value"].agg(
        lambda v: v.std(ddof=0) / v.mean() if v.mean() > 0 else np.nan
    )
    cv = cv.dropna()
    if cv.empty:
        return Measurement(None, "gauges", "GPU memory always zero")
    return Measurement(
        float(cv.mean()), "gauges: CV of warmscope.gpu.memory.usage_ratio per replica", ""
    )


@dimension(
    "feature_load_latency",
    "Feature/embedding load latency",
    "s",
    "lower",
    0.02,
    0.2,
    frames=("histograms",),
)
def _load_latency(fr: Frames, cfg: Settings) -> Measurement:
    h = _f(fr, "histograms")
    if h.empty:
        return Measurement(None, "histograms", "no load durations recorded")
    ld = h[h["metric"] == "warmscope.cache.load.duration"]
    emb = ld[ld["layer"] == "embedding"]
    use, src = (emb, "embedding") if len(emb) else (ld, "all layers")
    if use.empty:
        return Measurement(None, "histograms", "no load durations recorded")
    one = use.drop_duplicates(
        ["ts", "tenant", "experiment", "variant", "model", "replica", "layer"]
    )
    n = one["total"].sum()
    if n <= 0:
        return Measurement(None, "histograms", "no load durations recorded")
    v = float(one["sum"].sum() / n)
    per = (one["sum"] / one["total"].where(one["total"] > 0)).dropna()
    if n > 1 and len(per) and (per.max() - per.min()) <= 1e-9 * max(abs(per.mean()), 1e-12):
        return Measurement(
            None,
            "histograms",
            f"every load took the same {v:.3g} s (a configured constant, not a measurement)",
        )
    return Measurement(v, f"histograms: mean warmscope.cache.load.duration ({src})", "")


@dimension(
    "sla_deviation",
    "SLA deviation (share missed)",
    "ratio",
    "lower",
    0.01,
    0.1,
    frames=("requests",),
)
def _sla(fr: Frames, cfg: Settings) -> Measurement:
    r = _f(fr, "requests")
    if r.empty:
        return Measurement(None, "requests", "no requests")
    known = r[r["sla_met"].isin(["true", "false"])]
    n = known["requests"].sum()
    if n <= 0:
        return Measurement(None, "requests", "SLA outcome not recorded")
    missed = float(known.loc[known["sla_met"] == "false", "requests"].sum())
    lo, hi = wilson(missed, n)
    return Measurement(missed / n, "requests: sla_met = false share", "", (float(lo), float(hi)))


@dimension(
    "ab_conversion_attribution",
    "A/B conversion attribution (relative lift)",
    "ratio",
    "higher",
    0.05,
    -0.05,
    frames=("requests",),
)
def _conv(fr: Frames, cfg: Settings) -> Measurement:
    def lacks(t: pd.Series, c: pd.Series) -> str | None:
        none = c["conversions"] <= 0 or t["requests"] <= 0
        return "no conversions in the control arm" if none else None

    what = "conversion rate treatment ÷ control − 1"
    return _arm_effect(fr, cfg, _conversion_lift, what, lacks)


RAMP_MIN_SHIFT = 0.1  # a grey release moves the treatment's hourly share by at least this


@dimension(
    "grey_release_penetration",
    "Grey-release traffic penetration",
    "ratio",
    "target",
    0.5,
    0.0,
    frames=("requests",),
)
def _penetration(fr: Frames, cfg: Settings) -> Measurement:
    r = _f(fr, "requests")
    e = r[r["experiment"].astype(bool)] if len(r) else r
    n = e["requests"].sum() if len(e) else 0
    if n <= 0:
        return Measurement(None, "requests", "no experiment traffic")
    share = float(e.loc[e["variant"] == cfg.treatment_variant, "requests"].sum() / n)
    # A grey release ramps the treatment's share; a fixed split (an A/B hash) is not one.
    h = e.assign(hour=bucket_start(e["ts"], 3600.0), t=e["variant"] == cfg.treatment_variant)
    tab = h.groupby(["hour", "t"])["requests"].sum().unstack(fill_value=0)
    tab = tab[tab.sum(axis=1) > 0]
    hourly = tab[True] / tab.sum(axis=1) if True in tab.columns else pd.Series(dtype=float)
    if (
        tab.shape[0] < 2
        or tab.shape[1] < 2
        or stats.chi2_contingency(tab.to_numpy())[1] > 0.001
        # a ramp moves the share by points, not by a million requests' chi-square
        or abs(float(hourly.iloc[-1]) - float(hourly.iloc[0])) < RAMP_MIN_SHIFT
    ):
        return Measurement(
            None,
            "requests",
            f"no grey release in this range: the treatment's share is fixed at {share:.0%} "
            "by the experiment's split (no ramp)",
        )
    last = tab.iloc[-1]
    return Measurement(
        float(last[True] / last.sum()),
        f"requests: share on variant {cfg.treatment_variant} in the last hour",
        "",
    )


@dimension(
    "resource_cost_share",
    "Warm-up resource cost share",
    "ratio",
    "lower",
    0.05,
    0.3,
    frames=("warmup_runs", "requests"),
)
def _cost_share(fr: Frames, cfg: Settings) -> Measurement:
    runs, r = _f(fr, "warmup_runs"), _f(fr, "requests")
    serve = r["gpu_s"].sum() if len(r) else 0.0
    warm = runs["gpu_s"].fillna(0).sum() if len(runs) else 0.0
    if serve + warm <= 0:
        return Measurement(None, "requests, warmup_runs", "no GPU time recorded")
    return Measurement(
        float(warm / (serve + warm)), "warmup_runs.gpu_s ÷ (warm-up + serving GPU-s)", ""
    )


@dimension(
    "warmup_roi",
    "Warm-up ROI (T+5 min sliding window)",
    "ratio",
    "higher",
    1.0,
    -1.0,
    0.25,
    frames=("warmup_runs", "requests"),
)
def _roi(fr: Frames, cfg: Settings) -> Measurement:
    """Compute ROI over (end, end + T] after each warm-up, runs merged per
    replica (one benefit per warm-up, not one per layer), pooled over warm-ups:
    (Σ GPU-s saved × price − Σ cost) / Σ cost; CI from the windows' summed
    variances. The benefit's decay rate is reported beside it, not scored."""
    runs, r = _f(fr, "warmup_runs"), _f(fr, "requests")
    if runs.empty or r.empty:
        return Measurement(None, "warmup_runs, requests", "no warm-up runs")
    done = replica_runs(runs[(runs["status"] == "ok") & runs["ended"].notna()])
    T = cfg.roi_window_s
    if float(r.attrs.get("step_s", 0) or 0) > T:  # hourly rollups cannot hold a T-second window
        return Measurement(
            None,
            "warmup_runs, requests",
            f"needs per-minute requests for its T+{T:g} s windows, and this range reads hourly "
            "rollups (ranges over a day): choose a day or less; the Warm-up runs page has each "
            "run's ROI at any range",
        )
    end = float(r["ts"].max())
    saved = cost = var = 0.0
    used = unfinished = 0
    ks = []
    run: Any  # an itertuples row: pandas types its fields as any scalar
    for run in done.itertuples():
        if run.ended + T > end:
            unfinished += 1
            continue
        w = roi_windows(run, r, cfg.price_per_gpu_s, cfg.value_per_conversion, windows=(T,)).iloc[0]
        if not (w["cost"] > 0 and np.isfinite(w["gpu_s_saved"])):
            continue
        half = (
            (w["roi_compute_high"] - w["roi_compute"]) * w["cost"]
            if np.isfinite(w["roi_compute_high"])
            else np.nan
        )
        saved += w["gpu_s_saved"] * cfg.price_per_gpu_s
        cost += w["cost"]
        var += (half / stats.t.ppf(0.975, 4)) ** 2 if np.isfinite(half) else 0.0
        used += 1
        d = fit_decay(
            benefit_series(
                run,
                r,
                cfg.price_per_gpu_s,
                cfg.value_per_conversion,
                cfg.decay_horizon_s,
                part="compute",
            )
        )
        ks.append(d)
    if not used:
        why = f" ({unfinished} still inside their window)" if unfinished else ""
        return Measurement(
            None,
            "warmup_runs, requests",
            f"no finished warm-up with a cost and traffic after it{why}",
        )
    v = (saved - cost) / cost
    se = np.sqrt(var) / cost
    # the decay as the Warm-up runs page reads it (a rate only where its CI excludes no decay)
    note = decay_summary(ks) + " (the decay is reported beside the ROI, not scored)"
    if unfinished:
        note += (
            "; " if note else ""
        ) + f"{unfinished} warm-up(s) still inside their {T:g}-s window left out"
    if se * 1.96 > 20:
        return Measurement(
            None,
            "warmup_runs, requests",
            f"cost too small to estimate: ROI {v:+.3g} ± {1.96 * se:.3g}",
        )
    return Measurement(
        float(v),
        f"compute ROI over T+{T:g} s after {used} warm-up(s), runs merged per replica: "
        "(GPU-s saved × price − cost) / cost",
        note,
        (float(v - Z95 * se), float(v + Z95 * se)),
    )


DIMENSIONS: tuple[DimensionSpec, ...] = build(_DECLARED)  # the score card's dimensions, in order
