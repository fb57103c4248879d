"""Shared page furniture: the time range (relative or absolute, kept in the URL), guards for empty data,
status badges, number formatting and the annotations every time series carries."""

from __future__ import annotations

import contextlib
import math
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime

import pandas as pd
import streamlit as st
from warmscope.app.dashboard import background, data
from warmscope.app.dashboard.pages import PAGES, Page
from warmscope.model.records import NOT_IN_HIT_RATE
from warmscope.model.registry import require

RANGES = {
    "last hour": 3600,
    "last 6 hours": 6 * 3600,
    "last 24 hours": 86400,
    "last 7 days": 7 * 86400,
    "everything": None,
    "since the last warm-up run": -1,
    "custom": -2,
}
DEFAULT_RANGE = "last 6 hours"
# Timestamps are float seconds, so pandas gives them sub-microsecond digits that plotly (microseconds)
# drops with a warning per chart in the server's log; a chart cannot show that difference.
warnings.filterwarnings(
    "ignore", message="Discarding nonzero nanoseconds in conversion", category=UserWarning
)
# Query-parameter names shared by every page: a link reproduces the view.
URL_KEYS = ("range", "from", "to")

# Text-and-colour status (no emoji font needed): label, colour.
STATUS = {
    "good": ("OK", "#1a7f37"),
    "fair": ("FAIR", "#b58100"),
    "poor": ("POOR", "#cf222e"),
    "none": ("NO DATA", "#6e7781"),
    "critical": ("CRITICAL", "#cf222e"),
    "warning": ("WARNING", "#b35900"),
    "info": ("INFO", "#0969da"),
    "security": ("SECURITY", "#cf222e"),
}


# ---------------------------------------------------------------- URL state


def url_get(key: str, default: str | None = None) -> str | None:
    v = st.query_params.get(key)
    return v if v not in (None, "") else default


def url_set(**kw) -> None:
    """Write view state to the URL; ``None`` removes a key."""
    for k, v in kw.items():
        if v is None or v == "":
            if k in st.query_params:
                del st.query_params[k]
        elif st.query_params.get(k) != str(v):
            st.query_params[k] = str(v)


def init_from_url(key: str, param: str | None = None, cast=str, default=None):
    """Seed a widget's session state from the URL on the first run of a session (widget keys survive reruns)."""
    param = param or key
    seeded = st.session_state.setdefault("_url_seeded", set())
    if key not in seeded:
        seeded.add(key)
        v = url_get(param)
        if v is not None:
            try:
                st.session_state[key] = cast(v)
            except (TypeError, ValueError):
                pass
    return st.session_state.get(key, default)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M")


def _parse_iso(s: str) -> float:
    return datetime.strptime(s, "%Y-%m-%dT%H:%M").replace(tzinfo=UTC).timestamp()


def sidebar_range() -> None:
    """The sidebar's range picker (called once per run by the app's entry point)."""
    init_from_url("range", cast=lambda v: v if v in RANGES else DEFAULT_RANGE)
    if st.session_state.get("range") not in RANGES:
        st.session_state["range"] = DEFAULT_RANGE
    st.selectbox(
        "Time range",
        list(RANGES),
        key="range",
        help="Relative ranges end at the newest data. 'custom' picks absolute times; dragging a box "
        "on the overview's hit-rate chart zooms to that span.",
    )
    if st.session_state["range"] != "custom":
        url_set(range=st.session_state["range"], **{"from": None, "to": None})
    else:
        url_set(range="custom")
        try:
            b = data.time_bounds()
        except data.SourceError:
            b = None
        if b is None:
            return
        lo, hi = _minute(b[0]), _minute(b[1]) + 60
        if "custom-win" not in st.session_state:
            try:
                f, t = _parse_iso(url_get("from", "")), _parse_iso(url_get("to", ""))
            except ValueError:
                f, t = hi - 6 * 3600, hi
            st.session_state["custom-win"] = (_dt(max(lo, min(f, hi))), _dt(max(lo, min(t, hi))))
        st.slider(
            "From – to (UTC)",
            min_value=_dt(lo),
            max_value=_dt(hi),
            step=pd.Timedelta(minutes=5).to_pytimedelta(),
            format="MM-DD HH:mm",
            key="custom-win",
        )


def _minute(ts: float) -> float:
    return math.floor(ts / 60) * 60


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC).replace(tzinfo=None)


def _ts(d: datetime) -> float:
    return d.replace(tzinfo=UTC).timestamp()


def defer(**state) -> None:
    """Set widget state on the next run, before the widgets exist (Streamlit refuses it after)."""
    st.session_state.setdefault("_deferred", {}).update(state)


def apply_deferred() -> None:
    """Called first thing in every run."""
    for k, v in st.session_state.pop("_deferred", {}).items():
        st.session_state[k] = v


def zoom_to(start: float, end: float) -> None:
    """Switch the range to an absolute window on the next run (drag-to-zoom)."""
    defer(**{"range": "custom", "custom-win": (_dt(_minute(start)), _dt(_minute(end) + 60))})


def time_range() -> tuple[float, float]:
    """The sidebar's range; relative ranges end at the newest data. Stops the page when there is none."""
    try:
        b = data.time_bounds()
    except data.SourceError as e:
        st.error(str(e))
        st.stop()
    if b is None:
        st.info(
            "The store has no lookups yet. Run `warmscope demo` (or `warmscope simulate`) for demo data, or "
            "instrument a cache with `collectors.InstrumentedCache` and let it flush."
        )
        st.stop()
    name = st.session_state.get("range", DEFAULT_RANGE)
    span = RANGES.get(name, RANGES[DEFAULT_RANGE])
    start, end = range_bounds(name, b, st.session_state.get("custom-win"))
    url_set(
        range=name,
        **({"from": _iso(start), "to": _iso(end)} if span == -2 else {"from": None, "to": None}),
    )
    return start, end


def range_bounds(name: str, b: tuple[float, float], custom=None) -> tuple[float, float]:
    """[start, end) of a named range over data spanning ``b`` (the same floats everywhere: cache keys)."""
    span = RANGES.get(name, RANGES[DEFAULT_RANGE])
    end = b[1] + 1e-6  # the store's end is exclusive: keep the newest tick
    if span == -2 and custom:
        f, t = (_ts(x) for x in custom)
        return max(b[0] - 1, f), min(end, max(t, f + 60))
    if span == -1:
        last = data.last_run_start()
        return (b[0] - 1 if last is None else max(b[0] - 1, last - 60)), end
    return (b[0] - 1 if span is None or span < 0 else max(b[0] - 1, b[1] - span)), end


def when(ts: float) -> str:
    return pd.Timestamp(ts, unit="s").strftime("%Y-%m-%d %H:%M")


def hhmm(ts: float) -> str:
    return pd.Timestamp(ts, unit="s").strftime("%H:%M")


HOURLY_ABOVE_S = 86400 + 60  # ranges longer than a day read hourly rollups


def step(start: float | None, end: float | None) -> float | None:
    """The resolution a page reads: per flush up to a day, hourly beyond."""
    if start is None or end is None or end - start <= HOURLY_ABOVE_S:
        return None
    return 3600.0


def resolution_note(start: float, end: float) -> None:
    if step(start, end):
        st.caption(
            "Hourly resolution (range over 24 h): minute-level figures — cold-start time, prediction "
            "error — need a range of 24 hours or less."
        )


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
        f"Token hit rates (prefix_kv) leave out {n:,} of {total:,} requests ({pct(n / total)}) whose "
        "responses carried no token usage (stream_options.include_usage false, or an engine without "
        "prompt token details)."
    )
    st.warning(note, icon=":material/visibility_off:")
    return note


def load(names, start=None, end=None, fine: bool = False) -> dict:
    """Frames for the range; ``fine=True`` keeps per-flush rows at any range."""
    try:
        return data.frames(names, start, end, None if fine else step(start, end))
    except data.SourceError as e:
        st.error(str(e))
        st.stop()


# ---------------------------------------------------------------- status and formatting


def grade(score: float | None) -> str:
    if score is None or score != score:
        return "none"
    return "good" if score >= 0.8 else ("fair" if score >= 0.5 else "poor")


def light(score: float | None) -> str:
    """Status text for a 0–1 score (colour it with :func:`status_style`)."""
    return STATUS[grade(score)][0]


def status_style(v: str) -> str:
    """pandas Styler cell style for a status label."""
    for label, colour in STATUS.values():
        if v == label:
            return f"color: white; background-color: {colour}; font-weight: 600"
    return ""


def badge(kind: str, text: str = "") -> str:
    """Inline HTML badge: text on a coloured background (for st.markdown(..., unsafe_allow_html=True))."""
    label, colour = STATUS[kind]
    return (
        f'<span style="background:{colour};color:white;border-radius:4px;padding:1px 6px;'
        f'font-size:0.8em;font-weight:600">{text or label}</span>'
    )


def is_security(alert: str) -> bool:
    return alert in ("CrossTenantCacheRead",) or "tenant_isolation" in alert


def alert_row(severity: str, alert: str, summary: str, since: float | None = None) -> None:
    """One alert line; security findings in red whatever their severity."""
    kind = "security" if is_security(alert) else severity if severity in STATUS else "info"
    extra = f" · since {when(since)}" if since is not None and since == since else ""
    box = (
        st.error
        if kind in ("security", "critical")
        else st.warning
        if kind == "warning"
        else st.info
    )
    tag = "SECURITY · " if kind == "security" else ""
    if tag and summary.upper().startswith("SECURITY:"):
        summary = summary[len("SECURITY:") :].strip()
    box(f"**{tag}{severity.upper()} · {alert}** — {summary}{extra}")


def pct(x, digits: int = 1) -> str:
    """``0.123`` → ``12.3%``; a value that rounds to zero reads ``0.0%``, never ``-0.0%``."""
    if x is None or x != x:
        return "–"
    return f"{(0.0 if round(x * 100, digits) == 0 else x):.{digits}%}"


def integer(x) -> str:
    return "–" if x is None or x != x else f"{int(round(x)):,}"


def human(col: str) -> str:
    """Column name for people: ``wasted_gpu_s`` → ``Wasted GPU-s``."""
    words = {
        "gpu": "GPU",
        "s": "(s)",
        "id": "ID",
        "ci": "CI",
        "p": "p",
        "roi": "ROI",
        "ttft": "TTFT",
        "kv": "KV",
    }
    parts = [words.get(w, w) for w in col.split("_")]
    out = " ".join(parts).replace("GPU (s)", "GPU-s")
    return out[:1].upper() + out[1:]


# ---------------------------------------------------------------- annotations on time series


def annotations(start: float, end: float) -> dict:
    """Warm-up runs, injected fault windows and alert onsets in [start, end) to draw on time series."""
    try:
        return data.annotations(start, end)
    except data.SourceError:
        return {"runs": pd.DataFrame(), "faults": pd.DataFrame()}


def annotate(fig, start: float, end: float, alerts: pd.DataFrame | None = None) -> None:
    """Draw runs (green ticks), fault windows (red bands) and alert onsets (orange lines) on a time axis.

    The shapes are added in one layout update: plotly's ``add_vline``/``add_vrect`` re-validate every shape
    already on the figure, which made a day of runs cost seconds per chart."""
    a = annotations(start, end)
    shapes, notes = [], []

    def line(t: float, colour: str, dash: str = "solid") -> dict:
        x = pd.Timestamp(t, unit="s")
        return dict(
            type="line",
            xref="x",
            yref="paper",
            x0=x,
            x1=x,
            y0=0,
            y1=1,
            line=dict(width=1, dash=dash, color=colour),
        )

    for r in a["faults"].itertuples():
        x0, x1 = max(r.start, start), min(r.end, end)
        if x1 > x0:
            shapes.append(
                dict(
                    type="rect",
                    xref="x",
                    yref="paper",
                    x0=pd.Timestamp(x0, unit="s"),
                    x1=pd.Timestamp(x1, unit="s"),
                    y0=0,
                    y1=1,
                    fillcolor="#cf222e",
                    opacity=0.08,
                    line=dict(width=0),
                    layer="below",
                )
            )
            notes.append(
                dict(
                    x=pd.Timestamp(x0, unit="s"),
                    y=1,
                    xref="x",
                    yref="paper",
                    text=f"fault: {r.trap}",
                    showarrow=False,
                    xanchor="left",
                    yanchor="top",
                    font=dict(size=10, color="#cf222e"),
                )
            )
    runs = a["runs"]
    if len(runs):
        # One mark per minute is enough: runs of several layers on one replica start together.
        starts = sorted({math.floor(t / 60) * 60 for t in runs.started})
        shapes += [line(t, "#1a7f37", "dot") for t in starts]
        notes.append(
            dict(
                x=pd.Timestamp(starts[-1], unit="s"),
                y=1.0,
                xref="x",
                yref="paper",
                text="warm-up run",
                showarrow=False,
                font=dict(size=10, color="#1a7f37"),
                xanchor="left",
                yanchor="bottom",
            )
        )
    if alerts is not None and len(alerts):
        shapes += [
            line(t, "#b35900")
            for t in sorted({x for x in alerts.since if x == x and start <= x < end})
        ]
    if shapes or notes:
        fig.update_layout(
            shapes=list(fig.layout.shapes) + shapes,
            annotations=list(fig.layout.annotations) + notes,
        )


# ---------------------------------------------------------------- cached analysis (shared by every viewer)


def overview_frames(start: float, end: float) -> dict:
    """The frames of the overview's alerts and score card, through the cached loaders."""
    return background.overview_frames(data.frame, start, end, step(start, end))


@st.cache_data(ttl=data.STORE_TTL, max_entries=32, show_spinner=False)
def _alerts(version: tuple, start: float, end: float):
    from warmscope.analysis.alerts import evaluate

    return evaluate(overview_frames(start, end), start, end)


@st.cache_data(ttl=data.STORE_TTL, max_entries=32, show_spinner=False)
def _card(version: tuple, start: float, end: float):
    from warmscope.analysis.config import AnalysisConfig
    from warmscope.analysis.scores import score_card

    return score_card(overview_frames(start, end), AnalysisConfig.load())


@st.cache_data(ttl=data.STORE_TTL, max_entries=32, show_spinner=False)
def _drill(version: tuple, start: float, end: float, anomaly, baseline, cached_layers_only: bool):
    from warmscope.analysis.drilldown import drill_down

    lk = data.frame("lookups", start, end, step(start, end))
    if cached_layers_only and len(lk):
        lk = lk[~lk.layer.isin(NOT_IN_HIT_RATE)]
    return drill_down(lk, anomaly=anomaly, baseline=baseline)


@st.cache_data(ttl=data.STORE_TTL, max_entries=32, show_spinner=False)
def _traps(version: tuple, start: float, end: float, anomaly, baseline):
    from warmscope.analysis.traps import HOT_KEY_LOOKBACK_S, detect_all

    fr = data.frames(
        ["lookups", "writes", "warmup_runs", "warmed_keys", "misses"], start, end, step(start, end)
    )
    fr["hot_keys"] = data.frame("hot_keys", max(start, anomaly[0] - HOT_KEY_LOOKBACK_S), end)
    return detect_all(fr, anomaly, baseline)


@st.cache_data(ttl=data.STORE_TTL, max_entries=32, show_spinner=False)
def _miss_shift(version: tuple, start: float, end: float, anomaly, baseline):
    from warmscope.analysis.drilldown import drill_down_misses
    from warmscope.analysis.traps import miss_class_shift

    fr = {"misses": data.frame("misses", start, end, step(start, end))}
    if fr["misses"].empty:
        return miss_class_shift(fr, anomaly, baseline), None
    dd = drill_down_misses(fr["misses"], anomaly, baseline)
    return miss_class_shift(fr, anomaly, baseline), dd


@st.cache_data(ttl=data.STORE_TTL, max_entries=32, show_spinner=False)
def _change_point(version: tuple, start: float, end: float):
    from warmscope.analysis.drilldown import change_point

    return change_point(data.frame("lookups", start, end, step(start, end)))


# Alert history: the alert conditions re-evaluated every history_every() seconds over the HISTORY_LOOKBACK_S
# before. Dozens of evaluations take tens of seconds, so they run in the background, in a child process (one at a
# time, shared by every viewer), and the page shows the history when it is there.
HISTORY_LOOKBACK_S = 3600.0


def history_every(start: float, end: float) -> float:
    """Evaluation spacing: 10 minutes, coarser on long ranges (at most 36 evaluations)."""
    return max(600.0, math.ceil((end - start) / 36 / 600 - 1e-6) * 600)


@st.cache_resource(show_spinner=False)
def _history_jobs() -> dict:
    """The alert-history jobs by (version, start, end): futures of computations in a child process (its own
    interpreter, at a lower CPU priority), so that the history's dozens of evaluations do not slow page runs."""
    return {}


def alert_history(start: float, end: float):
    """When each alert fired and resolved over the range, or None while it is being computed (started on the
    first call; kept per store version and range)."""
    from warmscope.app.dashboard import background

    jobs = _history_jobs()
    key = (data.version(), start, end)
    fut = jobs.get(key)
    if fut is None:
        if len(jobs) >= 16:  # keep the newest few
            jobs.pop(next(iter(jobs)))
        s0 = start - HISTORY_LOOKBACK_S
        fut = jobs[key] = background.submit(
            background.alert_history,
            data.config(),
            start,
            end,
            step(s0, end),
            history_every(start, end),
            HISTORY_LOOKBACK_S,
        )
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


@st.cache_data(ttl=data.STORE_TTL, max_entries=64, show_spinner=False)
def _rates(
    version: tuple,
    start: float,
    end: float,
    by: tuple,
    freq: float | None,
    path: tuple,
    no_weights: bool,
):
    from warmscope.analysis.hitrate import hit_table

    lk = data.frame("lookups", start, end, step(start, end))
    for d, v in path:
        lk = lk[lk[d].astype(str) == v]
    if no_weights and len(lk):
        lk = lk[~lk.layer.isin(NOT_IN_HIT_RATE)]
    return hit_table(lk, by=list(by), freq=freq)


def rates(
    start: float, end: float, by=(), freq: float | None = None, path=(), no_weights: bool = False
):
    """``hit_table`` of the range's lookups (filtered by ``path``, a sequence of (dimension, value); without the
    model-weights layer when ``no_weights``), cached: a rerun or another viewer reads a few rows, not the range."""
    return guarded(_rates, start, end, tuple(by), freq, tuple(tuple(x) for x in path), no_weights)


@st.cache_data(ttl=data.STORE_TTL, max_entries=32, show_spinner=False)
def _run_roi(version: tuple, start: float, end: float, run_id: str):
    from warmscope.analysis.config import AnalysisConfig
    from warmscope.analysis.roi import roi_windows

    cfg = AnalysisConfig.load()
    runs = data.frame("warmup_runs", start, end)
    run = runs[runs.run_id == run_id].iloc[0]
    return roi_windows(
        run,
        data.frame("requests", start, end, step(start, end)),
        cfg.price_per_gpu_s,
        cfg.value_per_conversion,
        cfg.roi_windows_s,
    )


def run_roi(start: float, end: float, run_id: str):
    """ROI windows of one run of the range, against the range's requests (cached)."""
    return guarded(_run_roi, start, end, run_id)


@st.cache_data(ttl=data.STORE_TTL, max_entries=32, show_spinner=False)
def _coverage(version: tuple, start: float, end: float):
    from warmscope.analysis.config import AnalysisConfig
    from warmscope.analysis.coverage import warm_set_coverage

    fr = data.frames(["warmup_runs", "warmed_keys", "early_keys"], start, end)
    return warm_set_coverage(
        fr["warmup_runs"],
        fr["warmed_keys"],
        fr["early_keys"],
        AnalysisConfig.load().recall_window_s,
    )


def coverage(start: float, end: float):
    """Precision, recall and wasted GPU-s of every run in the range (cached)."""
    return guarded(_coverage, start, end)


@st.cache_data(ttl=data.STORE_TTL, max_entries=64, show_spinner=False)
def _run_detail(version: tuple, start: float, end: float, run_id: str):
    from warmscope.analysis.config import AnalysisConfig
    from warmscope.analysis.coverage import run_effect
    from warmscope.analysis.roi import benefit_series, fit_decay, roi_windows

    cfg = AnalysisConfig.load()
    runs = data.frame("warmup_runs", start, end)
    row = runs.set_index("run_id").loc[run_id]
    run = pd.Series({**row.to_dict(), "run_id": run_id})
    # A run's before/after, ROI and decay need per-minute data around it only, at any range.
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
        run, rq, cfg.price_per_gpu_s, cfg.value_per_conversion, cfg.decay_horizon_s
    )
    return eff, roi, series, fit_decay(series)


def run_detail(start: float, end: float, run_id: str):
    """One run's before/after effect, ROI windows, benefit series and its decay fit (cached)."""
    return guarded(_run_detail, start, end, run_id)


@st.cache_data(ttl=data.STORE_TTL, max_entries=64, show_spinner=False)
def _latency(
    version: tuple, start: float, end: float, metric: str, by: tuple, qs: tuple, freq: float
):
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


def latency(start: float, end: float, metric: str, by=(), qs=(0.5, 0.95, 0.99), freq: float = 600):
    """Quantiles of ``metric`` per time bucket (the 10 busiest groups of ``by``), over the whole range, and the
    largest finite bucket edge — or None when the range holds none of it (cached)."""
    return guarded(_latency, start, end, metric, tuple(by), tuple(qs), freq)


OVERVIEW_FREQ_S = 600  # the overview chart's bucket below a day
EXPLORER_FREQ_S = 600  # the hit-rate explorer's default bucket


def overview_freq(start: float, end: float) -> int:
    return int(max(OVERVIEW_FREQ_S, step(start, end) or 0))


def traps(start: float, end: float, anomaly, baseline):
    """The cold-start trap verdicts for a window (cached)."""
    return guarded(_traps, start, end, tuple(anomaly), tuple(baseline))


def miss_shift(start: float, end: float, anomaly, baseline):
    """(per-class shares in the window and the baseline, the misses drill-down or None)."""
    return guarded(_miss_shift, start, end, tuple(anomaly), tuple(baseline))


def change_point(start: float, end: float):
    return guarded(_change_point, start, end)


def guarded(fn, *args):
    try:
        return fn(data.version(), *args)
    except data.SourceError as e:
        st.error(str(e))
        st.stop()


def alerts(start: float, end: float):
    """The alert conditions over the range (cached per store version and range)."""
    return guarded(_alerts, start, end)


def card(start: float, end: float):
    return guarded(_card, start, end)


def drill(start: float, end: float, anomaly=None, baseline=None, cached_layers_only: bool = False):
    return guarded(_drill, start, end, anomaly, baseline, cached_layers_only)


# Page runs in progress in this server process. The background warm-up below waits while there is one: it shares
# the interpreter (and its lock) with the page runs, and a viewer's page comes first.
_running = [0]
_running_lock = threading.Lock()


@contextlib.contextmanager
def foreground():
    """Mark a page run (the app's entry point wraps every run in it)."""
    with _running_lock:
        _running[0] += 1
    try:
        yield
    finally:
        with _running_lock:
            _running[0] -= 1


def _quiet(max_wait_s: float = 30.0) -> None:
    """Until no page is running (at most ``max_wait_s``: a page that waits on the warm-up must not stall it)."""
    deadline = time.monotonic() + max_wait_s
    while _running[0] > 0 and time.monotonic() < deadline:
        time.sleep(0.05)


# What a first view of each page (pages.PAGES with prewarm=True) reads, as cached calls (function,
# arguments) for one range; ``fine`` is the range's step (None: per-minute rows).
WarmSteps = Iterator[tuple[Callable[..., object], tuple]]
TTFT_METRIC = "gen_ai.server.time_to_first_token"


def _warm_overview(version: tuple, start: float, end: float, fine: float | None) -> WarmSteps:
    yield _rates, (version, start, end, ("layer",), overview_freq(start, end), (), False)
    yield _rates, (version, start, end, (), None, (), True)
    yield data.annotations, (start, end)
    yield _alerts, (version, start, end)
    yield _card, (version, start, end)
    yield _drill, (version, start, end, None, None, True)
    runs = data.frame("warmup_runs", start, end)
    if len(runs):  # the latest warm-up run's ROI
        yield _run_roi, (version, start, end, str(runs.sort_values("started").iloc[-1].run_id))


def _warm_hitrate(version: tuple, start: float, end: float, fine: float | None) -> WarmSteps:
    for by in ((), ("tenant",), ("tenant", "layer")):
        yield _rates, (version, start, end, by, None, (), False)
    freq = EXPLORER_FREQ_S if not fine else 3600
    yield _rates, (version, start, end, ("tenant",), freq, (), False)


def _warm_latency(version: tuple, start: float, end: float, fine: float | None) -> WarmSteps:
    freq = EXPLORER_FREQ_S if not fine else 3600
    yield _latency, (version, start, end, TTFT_METRIC, (), (0.5, 0.95, 0.99), freq)


def _warm_warmup(version: tuple, start: float, end: float, fine: float | None) -> WarmSteps:
    runs = data.frame("warmup_runs", start, end)
    if len(runs):  # the newest run's detail
        newest = runs.sort_values("started", ascending=False).iloc[0]
        yield _run_detail, (version, start, end, str(newest.run_id))
    yield _coverage, (version, start, end)


def _warm_hotkeys(version: tuple, start: float, end: float, fine: float | None) -> WarmSteps:
    yield data.frames, (["hot_keys", "warmed_keys"], start - 3600, end, step(start - 3600, end))


def _warm_rootcause(version: tuple, start: float, end: float, fine: float | None) -> WarmSteps:
    yield _rates, (version, start, end, (), max(300, fine or 0), (), False)
    _quiet()
    cp = _change_point(version, start, end)
    if cp is not None:  # the default window
        an, base = (cp, end), (max(start, cp - (end - cp)), cp)
        yield _drill, (version, start, end, an, base, False)
        yield _traps, (version, start, end, an, base)


_WARM = {
    "overview": _warm_overview,
    "hitrate": _warm_hitrate,
    "latency": _warm_latency,
    "warmup": _warm_warmup,
    "hotkeys": _warm_hotkeys,
    "rootcause": _warm_rootcause,
}


def check_prewarm(pages: tuple[Page, ...], warm: Mapping[str, object]) -> None:
    """Raise ``RegistryError`` unless the pages with ``prewarm=True`` are those with steps."""
    for p in pages:
        require(
            not p.prewarm or p.name in warm,
            "dashboard page",
            p.name,
            f"prewarm=True needs ui._warm_{p.name}, the cached calls of its first view",
        )
        require(
            p.prewarm or p.name not in warm,
            "dashboard page",
            p.name,
            f"has ui._warm_{p.name} but prewarm=False",
        )
    known = {p.name for p in pages}
    for name in warm:
        require(
            name in known, "dashboard page", name, "has prewarm steps but is not in pages.PAGES"
        )


check_prewarm(PAGES, _WARM)


def _warm_steps(version: tuple) -> WarmSteps:
    """The cached calls a first view of each prewarmed page makes: default range first, then the
    24-hour range."""
    b = data.time_bounds()
    if b is None:
        return
    for name in (DEFAULT_RANGE, "last 24 hours"):
        start, end = range_bounds(name, b)
        fine = step(start, end)
        for p in PAGES:
            if p.prewarm:
                yield from _WARM[p.name](version, start, end, fine)


@st.cache_resource(show_spinner=False)
def _prewarmer(version: tuple):
    """Once per store version: read the default and the 24-hour range's frames and analysis in the background,
    so the first viewer and a switch to 24 h find them cached. Each step waits until no page is running."""

    def work():
        try:
            for fn, args in _warm_steps(version):
                _quiet()
                fn(*args)
        except Exception:  # a warm-up of caches: a failure only means the first viewer waits
            pass

    t = threading.Thread(target=work, name="warmscope-prewarm", daemon=True)
    t.start()
    return t


def prewarm() -> None:
    try:
        _prewarmer(data.version())
    except Exception:
        pass
