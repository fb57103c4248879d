"""The analyses pages show, cached per store version and range (``st.cache_data``, shared by every
viewer): a rerun or another viewer reads a few rows, not the range. Each public function shows a
source error as one message and stops the page (``guarded``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import pandas as pd
import streamlit as st
from warmscope.app.dashboard import background, data, engine_view
from warmscope.app.dashboard.fmt import pct
from warmscope.app.dashboard.state import load, step
from warmscope.model import records

if TYPE_CHECKING:  # the analyses load on first use, not when a page starts
    from warmscope.analysis.coverage import WarmupSpend
    from warmscope.analysis.drilldown import DrillDown
    from warmscope.analysis.roi import Decay
    from warmscope.analysis.rootcause import Localization
    from warmscope.analysis.scores import ScoreCard
    from warmscope.analysis.traps import TrapVerdict
    from warmscope.model.blocktrace import BlockTrace

T = TypeVar("T")
Version = tuple[object, ...]  # data.version(): what cached results depend on
Window = tuple[float, float]
# (dimension, value) steps of a hit-rate drill path
Path = tuple[tuple[str, str], ...]


def hit_rate_layers(lookups: pd.DataFrame) -> pd.DataFrame:
    """The lookups of the layers counted in hit rates (``Layer.in_hit_rate`` in
    ``model.records.LAYERS``; an undeclared layer counts)."""
    if lookups.empty:
        return lookups
    keep = {n for n in lookups.layer.unique() if records.layer(str(n)).in_hit_rate}
    return lookups[lookups.layer.isin(keep)]


def unmeasured_note(start: float, end: float, tenant: str | None = None) -> str | None:
    """The share of requests whose token usage was not reported, shown next to token hit
    rates (they leave those requests out); None when every request was measured."""
    from warmscope.analysis.hitrate import unmeasured_share

    req = load(["requests"], start, end)["requests"]
    if tenant is not None and "tenant" in req.columns:
        req = req[req["tenant"] == tenant]
    t = unmeasured_share(req)
    if t.empty or not t["unmeasured"].iloc[0]:
        return None
    n, total = int(t["unmeasured"].iloc[0]), int(t["requests"].iloc[0])
    note = (
        f"Token hit rates (prefix_kv) leave out {n:,} of {total:,} requests ({pct(n / total)}) "
        "whose responses carried no token usage (stream_options.include_usage false, or an engine "
        "without prompt token details)."
    )
    st.warning(note, icon=":material/visibility_off:")
    return note


def overview_frames(start: float, end: float) -> dict[str, pd.DataFrame]:
    """The frames of the overview's alerts and score card, through the cached loaders."""
    return background.overview_frames(data.frame, start, end, step(start, end))


@st.cache_data(ttl=data.STORE_TTL, max_entries=32, show_spinner=False)
def _alerts(version: Version, end: float) -> pd.DataFrame:
    from warmscope.analysis.alert_history import holding_now

    # per flush, two hours before the evaluation's window: the hot-key windows a leak began in and
    # the flushes that date it (as the history's last evaluation reads them)
    lo = end - 3 * HISTORY_LOOKBACK_S
    fr = background.overview_frames(data.frame, lo, end, None)
    return holding_now(fr, end, HISTORY_LOOKBACK_S)


@st.cache_data(ttl=data.STORE_TTL, max_entries=32, show_spinner=False)
def _leak(version: Version, start: float, end: float) -> dict[str, object] | None:
    from warmscope.analysis.alerts import cross_tenant_reads, hot_keys_since

    hk = data.frame("hot_keys", hot_keys_since(start, end) - HISTORY_LOOKBACK_S, end)
    lk = data.frame("lookups", start - HISTORY_LOOKBACK_S, end)
    return cross_tenant_reads(hk, start, end, lk)


def leak(start: float, end: float) -> dict[str, object] | None:
    """Cross-tenant reads anywhere in the range (``analysis.alerts.cross_tenant_reads``: onset,
    last window, keys, tenants), or None: a leak matters after it stopped holding."""
    return guarded(_leak, start, end)


@st.cache_data(ttl=data.STORE_TTL, max_entries=32, show_spinner=False)
def _arm_labels(version: Version, experiment: str) -> dict[str, str]:
    from warmscope.analysis.ab_report import arm_strategies

    lk = data.frame("lookups", None, None, 3600.0)  # hourly rollups: which replicas served an arm
    return arm_strategies(lk, data.frame("warmup_runs"), experiment)


def arm_labels(experiment: str) -> dict[str, str]:
    """What each arm of ``experiment`` is: its replicas' warm-up strategy (cached)."""
    return guarded(_arm_labels, experiment)


@st.cache_data(ttl=data.STORE_TTL, max_entries=32, show_spinner=False)
def _card(version: Version, start: float, end: float) -> ScoreCard:
    from warmscope.analysis.config import AnalysisConfig
    from warmscope.analysis.scores import score_card

    return score_card(overview_frames(start, end), AnalysisConfig.load())


@st.cache_data(ttl=data.STORE_TTL, max_entries=32, show_spinner=False)
def _drill(
    version: Version,
    start: float,
    end: float,
    anomaly: Window | None,
    baseline: Window | None,
    hit_rate_layers_only: bool,
) -> DrillDown:
    from warmscope.analysis.drilldown import drill_down

    lk = data.frame("lookups", start, end, step(start, end))
    if hit_rate_layers_only:
        lk = hit_rate_layers(lk)
    return drill_down(lk, anomaly=anomaly, baseline=baseline)


@st.cache_data(ttl=data.STORE_TTL, max_entries=32, show_spinner=False)
def _traps(
    version: Version, start: float, end: float, anomaly: Window, baseline: Window
) -> list[TrapVerdict]:
    from warmscope.analysis.alerts import trap_verdicts
    from warmscope.analysis.traps import HOT_KEY_LOOKBACK_S

    fr = data.frames(
        ["lookups", "writes", "warmup_runs", "warmed_keys", "misses"], start, end, step(start, end)
    )
    fr["hot_keys"] = data.frame("hot_keys", max(start, anomaly[0] - HOT_KEY_LOOKBACK_S), end)
    return trap_verdicts(fr, anomaly, baseline)


@st.cache_data(ttl=data.STORE_TTL, max_entries=32, show_spinner=False)
def _miss_shift(
    version: Version, start: float, end: float, anomaly: Window, baseline: Window
) -> tuple[pd.DataFrame, DrillDown | None]:
    from warmscope.analysis.drilldown import drill_down_misses
    from warmscope.analysis.traps import miss_class_shift

    fr = {"misses": data.frame("misses", start, end, step(start, end))}
    if fr["misses"].empty:
        return miss_class_shift(fr, anomaly, baseline), None
    dd = drill_down_misses(fr["misses"], anomaly, baseline)
    return miss_class_shift(fr, anomaly, baseline), dd


@st.cache_data(ttl=data.STORE_TTL, max_entries=32, show_spinner=False)
def _change_point(version: Version, start: float, end: float) -> float | None:
    from warmscope.analysis.drilldown import change_point

    return change_point(data.frame("lookups", start, end, step(start, end)))


# Alert history: the alert conditions re-evaluated every history_every() seconds over the
# HISTORY_LOOKBACK_S before. Dozens of evaluations take tens of seconds, so they run in the
# background, in a child process (one at a time, shared by every viewer), and the page shows the
# history when it is there.
HISTORY_LOOKBACK_S = 3600.0


def history_every(start: float, end: float) -> float:
    """Evaluation spacing: 10 minutes, coarser on long ranges (at most 36 evaluations)."""
    return max(600.0, math.ceil((end - start) / 36 / 600 - 1e-6) * 600)


@st.cache_resource(show_spinner=False)
def _history_jobs() -> dict[tuple[object, ...], Future[pd.DataFrame]]:
    """The alert-history jobs by (version, start, end): futures of computations in a child process
    (its own interpreter, at a lower CPU priority), so that the history's dozens of evaluations do
    not slow page runs."""
    return {}


def start_history(start: float, end: float) -> Future[pd.DataFrame]:
    """The alert-history job of the range: started now unless it is running or done (the
    background prewarm starts the default and the 24-hour range's when the server starts)."""
    jobs = _history_jobs()
    key = (data.version(), start, end)
    fut = jobs.get(key)
    if fut is None:
        if len(jobs) >= 16:  # keep the newest few
            jobs.pop(next(iter(jobs)))
        fut = jobs[key] = background.submit(
            background.alert_history,
            data.config(),
            start,
            end,
            None,  # per flush at any range: onsets and bypass spikes are minute-level
            history_every(start, end),
            HISTORY_LOOKBACK_S,
        )
    return fut


def alert_history(start: float, end: float) -> pd.DataFrame | None:
    """When each alert fired and resolved over the range, or None while it is being computed
    (started on the first call, or ahead by the prewarm; kept per store version and range)."""
    fut = start_history(start, end)
    if not fut.done():
        return None
    try:
        return fut.result()
    except data.SourceError as e:
        st.error(str(e))
        st.stop()
    except Exception as e:  # shown, not raised: the rest of the page stays usable
        st.error(f"The alert history could not be computed: {type(e).__name__}: {e}")
        st.stop()


# The Advisor's tuning: tens of seconds of replays, in a child process like the alert history
# (one at a time, shared by every viewer); the page shows the forecast at once and the
# recommendation when it is there. The prewarm starts the default range's with the default inputs.
Advice = tuple[object, object, object]


@st.cache_resource(show_spinner=False)
def _advice_jobs() -> dict[tuple[object, ...], Future[Advice]]:
    return {}


def start_advice(
    start: float,
    end: float,
    budget: float | None = None,
    objective: str | None = None,
    penalty: float | None = None,
) -> Future[Advice]:
    """The Advisor's tuning job for these inputs: started now unless it is running or done."""
    jobs = _advice_jobs()
    key = (data.version(), start, end, budget, objective, penalty)
    fut = jobs.get(key)
    if fut is None:
        if len(jobs) >= 8:  # keep the newest few
            jobs.pop(next(iter(jobs)))
        fut = jobs[key] = background.submit(
            background.advice, data.config(), start, end, budget, objective, penalty
        )
    return fut


def advice(
    start: float,
    end: float,
    budget: float | None,
    objective: str | None,
    penalty: float | None,
) -> Advice | None:
    """(recommendation, replayed curves before, after), or None while the tuning runs (started
    on the first call; kept per store version, range and inputs). A ``ValueError`` of the tuning
    (inputs it cannot use) is raised here, as the page's direct call raised it."""
    fut = start_advice(start, end, budget, objective, penalty)
    if not fut.done():
        return None
    try:
        return fut.result()
    except ValueError:
        raise
    except data.SourceError as e:
        st.error(str(e))
        st.stop()
    except Exception as e:  # shown, not raised: the forecast above stays usable
        st.error(f"The recommendation could not be computed: {type(e).__name__}: {e}")
        st.stop()


@st.cache_data(ttl=data.STORE_TTL, max_entries=64, show_spinner=False)
def _rates(
    version: Version,
    start: float,
    end: float,
    by: tuple[str, ...],
    freq: float | None,
    path: Path,
    hit_rate_layers_only: bool,
    engine: bool,
) -> pd.DataFrame:
    from warmscope.analysis.hitrate import hit_table

    lk = _lookups(start, end, engine)
    for d, v in path:
        lk = lk[lk[d].astype(str) == v]
    if hit_rate_layers_only:
        lk = hit_rate_layers(lk)
    return hit_table(lk, by=list(by), freq=freq)


def rates(
    start: float,
    end: float,
    by: Iterable[str] = (),
    freq: float | None = None,
    path: Iterable[Iterable[str]] = (),
    hit_rate_layers_only: bool = False,
    engine: bool = False,
) -> pd.DataFrame:
    """``hit_table`` of the range's lookups, filtered by ``path`` (a sequence of (dimension,
    value)) and, with ``hit_rate_layers_only``, to the layers counted in hit rates
    (:func:`hit_rate_layers`); cached: a rerun or another viewer reads a few rows, not the range.
    ``engine=True``: of the engines' prefix-cache counters instead (engine-only mode; lookups
    are prompt tokens, the hit rate token-weighted)."""
    steps: Path = tuple((str(d), str(v)) for d, v in (tuple(x) for x in path))
    return guarded(_rates, start, end, tuple(by), freq, steps, hit_rate_layers_only, engine)


def _lookups(start: float, end: float, engine: bool) -> pd.DataFrame:
    """The collectors' lookups of the range at its resolution, or with ``engine`` the engines'
    prefix-cache counters as lookup rows (``engine_view.lookups``)."""
    if engine:
        return engine_view.lookups(start, end)
    return data.frame("lookups", start, end, step(start, end))


@st.cache_data(ttl=data.STORE_TTL, max_entries=32, show_spinner=False)
def _engine_causes(
    version: Version, start: float, end: float, anomaly: Window, baseline: Window
) -> tuple[pd.DataFrame, Localization | None]:
    from warmscope.analysis.drilldown import leaf_table
    from warmscope.analysis.rootcause import localize

    leaves = leaf_table(engine_view.lookups(start, end), anomaly, baseline, engine_view.DIMS)
    # volume_exp: the baseline's traffic, scaled to the anomaly window's length
    if leaves.lookups.sum() == 0 or leaves.volume_exp.sum() == 0:
        return leaves, None
    dims = [d for d in engine_view.DIMS if d in leaves.columns]
    loc = localize(
        leaves,
        dims,
        v_num="hits",
        v_den="lookups",
        f_num="hits_exp",
        f_den="lookups_exp",
        v_vol="lookups",
        f_vol="volume_exp",
    )
    return leaves, loc


def engine_causes(
    start: float, end: float, anomaly: Window, baseline: Window
) -> tuple[pd.DataFrame, Localization | None]:
    """Engine-only root cause (cached): the leaves (model × instance × engine kind × engine:
    prompt tokens and cached tokens in ``anomaly``, and the expected ones at the ``baseline``'s
    rate, ``analysis.drilldown.leaf_table``) and their localisation, or None when either window
    holds no engine traffic. No significance gate: engine phases are minutes, too few for the
    collector path's minute-to-minute test."""
    return guarded(_engine_causes, start, end, tuple(anomaly), tuple(baseline))


@st.cache_data(ttl=data.STORE_TTL, max_entries=32, show_spinner=False)
def _coverage(version: Version, start: float, end: float) -> pd.DataFrame:
    from warmscope.analysis.config import AnalysisConfig
    from warmscope.analysis.coverage import warm_set_coverage

    fr = _range_runs(start, end)
    return warm_set_coverage(
        fr["warmup_runs"],
        fr["warmed_keys"],
        fr["early_keys"],
        AnalysisConfig.load().recall_window_s,
    )


def coverage(start: float, end: float) -> pd.DataFrame:
    """Precision, recall and wasted GPU-s of every run in the range (cached)."""
    return guarded(_coverage, start, end)


@dataclass(frozen=True)
class MissTables:
    """What the Why misses page shows, computed once per store version and range
    (``analysis.misses``): missed tokens, per class, addressable, over time, per tenant / engine /
    key family, warmed keys lost before a reader, engine block rates per salt."""

    tokens: float
    classes: pd.DataFrame
    addressable: dict[str, float]
    over_time: pd.DataFrame
    by: dict[str, pd.DataFrame]
    lost: pd.DataFrame
    blocks: pd.DataFrame


def miss_freq(start: float, end: float) -> float:
    """The Why misses chart's bucket: about 120 buckets, whole minutes, at least one."""
    return max(60.0, float(int((end - start) / 120 // 60 * 60)))


@st.cache_data(ttl=data.STORE_TTL, max_entries=32, show_spinner=False)
def _miss_tables(version: Version, start: float, end: float) -> MissTables:
    from warmscope.analysis import misses as mz

    fr = load(["misses", "warmed_keys", "kv_blocks"], start, end)
    m, wk, kvb = fr["misses"], fr["warmed_keys"], fr["kv_blocks"]
    tokens = float(m["tokens"].sum()) if len(m) else 0.0
    has = tokens > 0
    return MissTables(
        tokens=tokens,
        classes=mz.class_table(m) if has else pd.DataFrame(),
        addressable={k: float(v) for k, v in mz.addressable(m, wk).items()} if has else {},
        over_time=mz.over_time(m, miss_freq(start, end)) if has else pd.DataFrame(),
        by={d: mz.by_dimension(m, d) for d in ("tenant", "engine", "family")} if has else {},
        lost=mz.warmed_lost_before_read(wk),
        blocks=mz.block_rates(kvb) if len(kvb) else pd.DataFrame(),
    )


def miss_tables(start: float, end: float) -> MissTables:
    """The Why misses page's tables for the range (cached: a rerun recomputes nothing)."""
    return guarded(_miss_tables, start, end)


def _range_runs(start: float, end: float) -> dict[str, pd.DataFrame]:
    """The runs that started in the range and their warmed keys (the keys of other runs left
    out), with the early keys of those runs."""
    fr = data.frames(["warmup_runs", "warmed_keys", "early_keys"], start, end)
    ids = fr["warmup_runs"]["run_id"] if len(fr["warmup_runs"]) else pd.Series(dtype=str)
    for n in ("warmed_keys", "early_keys"):
        if len(fr[n]):
            fr[n] = fr[n][fr[n]["run_id"].isin(ids)]
    return fr


@st.cache_data(ttl=data.STORE_TTL, max_entries=32, show_spinner=False)
def _warmup_spend(version: Version, start: float, end: float) -> WarmupSpend:
    from warmscope.analysis.coverage import warmup_spend

    fr = _range_runs(start, end)
    return warmup_spend(fr["warmup_runs"], fr["warmed_keys"])


def warmup_spend(start: float, end: float) -> WarmupSpend:
    """What the runs that started in the range spent and wasted (``analysis.coverage.
    warmup_spend``): the Hot keys and the Warm-up runs page show this one figure (cached)."""
    return guarded(_warmup_spend, start, end)


@st.cache_data(ttl=data.STORE_TTL, max_entries=64, show_spinner=False)
def _run_detail(
    version: Version, start: float, end: float, run_id: str
) -> tuple[pd.Series, pd.DataFrame, pd.DataFrame, pd.DataFrame, Decay]:
    from warmscope.analysis.config import AnalysisConfig
    from warmscope.analysis.coverage import run_effect
    from warmscope.analysis.roi import benefit_series, fit_decay, roi_windows, warmups

    cfg = AnalysisConfig.load()
    w = warmups(data.frame("warmup_runs", start, end))
    run = w[w["run_id"] == run_id].iloc[0]
    # A warm-up's before/after, ROI and decay need per-minute data around it only, at any range.
    ended = run.ended if run.ended == run.ended else end
    span = max([cfg.effect_window_s, cfg.decay_horizon_s, *cfg.roi_windows_s])
    fr = data.frames(
        ["lookups", "histograms"],
        run.started - cfg.effect_window_s - 60,
        ended + cfg.effect_window_s + 60,
    )
    rq = data.frame("requests", run.started - span - 60, ended + span + 60)
    eff = run_effect(run, fr["lookups"], fr["histograms"], rq, cfg.effect_window_s)
    roi = roi_windows(run, rq, cfg.price_per_gpu_s, cfg.value_per_conversion, cfg.roi_windows_s)
    series = benefit_series(
        run,
        rq,
        cfg.price_per_gpu_s,
        cfg.value_per_conversion,
        cfg.decay_horizon_s,
        part="compute",
    )
    return run, eff, roi, series, fit_decay(series)


def run_detail(
    start: float, end: float, run_id: str
) -> tuple[pd.Series, pd.DataFrame, pd.DataFrame, pd.DataFrame, Decay]:
    """One warm-up (``analysis.roi.warmups``: its layers' runs merged, named by its first run's
    id): the warm-up, its before/after effect, ROI windows, compute-benefit series and decay fit.
    The overview's latest run and the Warm-up runs page read this one result (cached)."""
    return guarded(_run_detail, start, end, run_id)


def latest_warmup(start: float, end: float) -> str | None:
    """The id of the range's newest warm-up (``analysis.roi.latest_warmup``), or None."""
    from warmscope.analysis.roi import latest_warmup as newest

    w = newest(load(["warmup_runs"], start, end)["warmup_runs"])
    return None if w is None else str(w["run_id"])


@st.cache_data(ttl=data.STORE_TTL, max_entries=64, show_spinner=False)
def _latency(
    version: Version,
    start: float,
    end: float,
    metric: str,
    by: tuple[str, ...],
    qs: tuple[float, ...],
    freq: float,
) -> tuple[pd.DataFrame, pd.DataFrame, float] | None:
    from warmscope.analysis.latency import all_bounds, quantiles_over_time

    h = data.frame("histograms", start, end, step(start, end))
    h = h[h["metric"] == metric] if len(h) else h
    if h.empty:
        return None
    top = float(all_bounds(metric, h["le"].unique())[-2])  # the largest finite bucket edge
    t = quantiles_over_time(h, metric, qs=qs, freq=freq, by=list(by))
    if by:  # the 10 busiest groups
        busiest = (
            h.groupby(list(by))["count"]
            .sum()
            .sort_values(ascending=False)
            .head(10)
            .index.astype(str)
        )
        t = t[t[by[0]].astype(str).isin(busiest)]
    whole = quantiles_over_time(
        h.assign(ts=end), metric, qs=(0.5, 0.95, 0.99), freq=end - start + 1, by=list(by)
    )
    return t, whole, top


def latency(
    start: float,
    end: float,
    metric: str,
    by: Iterable[str] = (),
    qs: Iterable[float] = (0.5, 0.95, 0.99),
    freq: float = 600,
) -> tuple[pd.DataFrame, pd.DataFrame, float] | None:
    """Quantiles of ``metric`` per time bucket (the 10 busiest groups of ``by``), over the whole
    range, and the largest finite bucket edge — or None when the range holds none of it (cached)."""
    return guarded(_latency, start, end, metric, tuple(by), tuple(qs), freq)


def traps(start: float, end: float, anomaly: Window, baseline: Window) -> list[TrapVerdict]:
    """The cold-start trap verdicts for a window (cached)."""
    return guarded(_traps, start, end, tuple(anomaly), tuple(baseline))


def miss_shift(
    start: float, end: float, anomaly: Window, baseline: Window
) -> tuple[pd.DataFrame, DrillDown | None]:
    """(per-class shares in the window and the baseline, the misses drill-down or None)."""
    return guarded(_miss_shift, start, end, tuple(anomaly), tuple(baseline))


def change_point(start: float, end: float) -> float | None:
    return guarded(_change_point, start, end)


def guarded(fn: Callable[..., T], *args: object) -> T:
    """``fn(data.version(), *args)``; a source error is shown as one message and stops the page."""
    try:
        return fn(data.version(), *args)
    except data.SourceError as e:
        st.error(str(e))
        st.stop()


def alerts(start: float, end: float) -> pd.DataFrame:
    """The alerts holding at the range's end: the alert history's last evaluation (the conditions
    over the hour before ``end``), so that every page's list of open alerts is the history's
    still-firing episodes (cached per store version and end)."""
    return guarded(_alerts, end)


def card(start: float, end: float) -> ScoreCard:
    return guarded(_card, start, end)


def drill(
    start: float,
    end: float,
    anomaly: Window | None = None,
    baseline: Window | None = None,
    hit_rate_layers_only: bool = False,
) -> DrillDown:
    """``drill_down`` of the range's lookups (with ``hit_rate_layers_only``, of the layers
    counted in hit rates), for an anomaly window against a baseline or automatic ones (cached)."""
    return guarded(_drill, start, end, anomaly, baseline, hit_rate_layers_only)


@st.cache_data(show_spinner=False, max_entries=8)
def _block_trace(path: str, start: float | None, end: float | None, version: Version) -> BlockTrace:
    from warmscope.sources.trace_store import read_store_trace

    return read_store_trace(path, start, end)


def block_trace(start: float | None, end: float | None) -> BlockTrace:
    """The store's block trace in the range (all of it for ``None``), read once per store version
    for the What if and Advisor pages; raises ``TraceError``/``SourceError`` with the message to
    show when the store holds none."""
    return _block_trace(data.store_path(), start, end, data.version())
