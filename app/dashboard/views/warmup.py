"""Warm-up runs: timeline, what they spent and wasted, coverage (precision, recall, waste), and
one warm-up (its layers' runs merged): effect, ROI and the decay of its benefit. The chosen
warm-up lives in the URL."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st
from streamlit.errors import StreamlitAPIException
from warmscope.analysis.config import AnalysisConfig
from warmscope.analysis.roi import (
    decay_text,
    roi_text,
    significant_decay,
    warmup_members,
    warmups,
)
from warmscope.app.dashboard import cached, charts, engine_view, fmt, state

if TYPE_CHECKING:
    from warmscope.analysis.roi import Decay

NAMES = {
    "hit_rate": ("Hit rate", "{:.1%}"),
    "ttft_p50_s": ("TTFT P50", "{:.3f} s"),
    "ttft_p95_s": ("TTFT P95", "{:.3f} s"),
    "gpu_s_per_request": ("GPU-s per request", "{:.4f}"),
}
ROI_COLUMNS = {
    "window": "Window",
    "requests": "Requests",
    "gpu_s_saved": "GPU-s saved",
    "cost": "Cost",
    "roi_compute": "Compute ROI",
    "roi_business": "Business ROI",
    "baseline": "Compared with",
}


def render() -> None:
    try:
        st.page_link(
            "entries/advisor.py",
            label="What to warm and when: forecasts and tuned parameters in the Advisor",
            icon=":material/explore:",
        )
    except StreamlitAPIException:  # the page run on its own, outside the app's navigation
        st.markdown(
            "[What to warm and when: forecasts and tuned parameters in the Advisor](/advisor)"
        )
    start, end = state.time_range()
    if engine_view.only_engines(start, end):  # no collector records anywhere
        engine_view.needs_collectors("Warm-up runs, their precision, recall, effect and ROI")
    runs = state.load(["warmup_runs"], start, end)["warmup_runs"]
    if runs.empty:
        st.info(
            "No warm-up runs in this range: pick 'since the last warm-up run' or a longer range "
            "in the sidebar. Runs are recorded by `Telemetry.warmup(...)` (the simulator's pools "
            "record theirs unless their strategy is `none`)."
        )
        st.stop()
    _timeline(runs, start, end)
    spend_metrics(start, end)
    _coverage(start, end)
    _one_warmup(runs, start, end)


def _timeline(runs: pd.DataFrame, start: float, end: float) -> None:
    tl = runs.assign(
        start=pd.to_datetime(runs.started, unit="s"),
        finish=pd.to_datetime(runs.ended.fillna(end), unit="s") + pd.Timedelta(seconds=5),
    )
    fig = px.timeline(
        tl,
        x_start="start",
        x_end="finish",
        y="replica",
        color="strategy",
        hover_data={"layer": True, "trigger": True, "keys": ":,", "gpu_s": ":.1f", "status": True},
        title="Runs per replica and strategy",
    )
    fig.update_layout(
        xaxis_title="time (UTC)",
        height=300,
        xaxis_range=[pd.Timestamp(start, unit="s"), pd.Timestamp(end, unit="s")],
    )
    charts.annotate(fig, start, end)
    st.plotly_chart(fig, width="stretch")
    st.caption(charts.ALERT_ONSETS)


def spend_metrics(start: float, end: float) -> None:
    """What the runs that started in the range spent and wasted (``cached.warmup_spend``): the
    same three figures on the Warm-up runs and the Hot keys page."""
    sp = cached.warmup_spend(start, end)
    if not sp.runs:
        st.caption(sp.sentence())
        return
    c = st.columns(3)
    c[0].metric(
        "Warm-up GPU-s spent",
        f"{sp.gpu_s:,.2f}",
        help=f"warmup_runs.gpu_s of the {sp.runs:,} runs that started in the range",
    )
    c[1].metric(
        "Warm-up GPU-s wasted",
        f"{sp.wasted_gpu_s:,.2f}",
        help="the warm-up cost of those runs' keys never read while warm",
    )
    c[2].metric(
        "Warmed keys never read",
        f"{sp.keys_unread:,} of {sp.keys_warmed:,}",
        help="read while warm: a hit before the entry's TTL ran out and before the key was "
        "first missed",
    )
    st.caption(sp.sentence() + " (all tenants and layers).")


def _coverage(start: float, end: float) -> None:
    cfg = AnalysisConfig.load()
    cov = cached.coverage(start, end)  # cached per range
    st.subheader("Warm-set coverage")
    st.caption(
        "Precision: warmed keys whose warmed entry was read (hit before its TTL ran out and "
        "before the key was first missed). Recall: of the keys requested in the first "
        f"{cfg.recall_window_s / 60:.0f} min after the run, the share it had warmed. Wasted: the "
        "warm-up GPU-seconds of keys never read."
    )
    show = cov.sort_values("started", ascending=False)

    def num(v: float, fmt_: str, why: str) -> str:
        return fmt_.format(v) if v == v else why

    st.dataframe(
        pd.DataFrame(
            {
                "Started (UTC)": show["started"].map(fmt.when),
                "Run": show["run_id"],
                "Replica": show["replica"],
                "Layer": show["layer"],
                "Strategy": show["strategy"],
                "Trigger": show["trigger"],
                "Keys warmed": show["keys_warmed"].map(lambda v: f"{v:,.0f}"),
                "Precision": show["precision"].map(
                    lambda v: num(v, "{:.1%}", "no warmed keys recorded")
                ),
                "Recall": show["recall"].map(
                    lambda v: num(v, "{:.1%}", "no requests in the window")
                ),
                "GPU-s": show["gpu_s"].map(lambda v: num(v, "{:,.2f}", "not recorded")),
                "Wasted GPU-s": show["wasted_gpu_s"].map(
                    lambda v: num(v, "{:,.2f}", "not recorded")
                ),
            }
        ),
        hide_index=True,
        width="stretch",
    )
    by = cov.groupby("strategy")[["keys_warmed", "keys_read", "gpu_s", "wasted_gpu_s"]].sum()
    bar = px.bar(
        by.reset_index().rename(columns={"gpu_s": "spent", "wasted_gpu_s": "wasted"}),
        x="strategy",
        y=["spent", "wasted"],
        barmode="group",
        title="Warm-up GPU-seconds spent and wasted, by strategy",
    )
    bar.update_layout(yaxis_title="GPU-seconds", legend_title_text="", height=320)
    st.plotly_chart(bar, width="stretch")


def _label(r: Mapping[Hashable, object]) -> str:
    return (
        f"{fmt.when(fmt.num(r['started']))} · {r['run_id']} · {r['replica']} · {r['layer']} · "
        f"{r['strategy']} · trigger {r['trigger']}"
    )


def _find_run(owner: Mapping[str, str]) -> None:
    """The run-id box's callback: select the warm-up that holds the run id typed (any of its
    layers' runs, e.g. one named on the Why misses page)."""
    typed = str(st.session_state.get("run-find") or "").strip()
    if typed in owner:
        st.session_state["run"] = owner[typed]


def _cell(metric: str, v: float | None, signed: bool = False) -> str:
    if v is None or v != v:
        return "not enough points"
    if metric == "hit_rate":
        return f"{v * 100:+.1f} pts" if signed else f"{v:.1%}"
    form = NAMES.get(metric, (metric, "{:.3g}"))[1]
    s = form.format(v)
    if signed and form.format(abs(v)) == form.format(0.0):
        return "±0"  # nothing at the precision the values are shown at (0.0914 → 0.0916 is +0.0002)
    return "+" + s if signed and v >= 0 else s


def _one_warmup(runs: pd.DataFrame, start: float, end: float) -> None:
    """One warm-up (its layers' runs merged, newest first: the overview's "latest run" is the
    first): before/after, ROI, and the decay of its compute benefit."""
    cfg = AnalysisConfig.load()
    st.subheader("One warm-up")
    w = warmups(runs)
    labels = {str(r["run_id"]): _label(r) for r in w.to_dict("records")}
    ids = list(labels)
    members = warmup_members(runs)
    # every run id (each layer's run) -> the warm-up holding it, keyed by its first run's id
    owner = {rid: wid for wid, rids in members.items() for rid in rids if wid in labels}
    want = owner.get(state.url_get("run") or "")
    if "run" not in st.session_state or st.session_state["run"] not in labels:
        st.session_state["run"] = want or ids[0]
    pick, find = st.columns([5, 1])
    typed = find.text_input(
        "Find a run id",
        key="run-find",
        placeholder="e.g. run-1-b00003",
        on_change=_find_run,
        args=(owner,),
        help="Any run id (every layer's run has one, as the Why misses page and the coverage "
        "table show them): picks the warm-up that holds it.",
    ).strip()
    run_id = str(
        pick.selectbox(
            "Warm-up (newest first; its layers' runs together)",
            ids,
            key="run",
            format_func=lambda i: labels.get(i, i),
        )
    )
    if typed and typed not in owner:
        st.warning(
            f"No warm-up run {typed!r} started in this range: check the id, or widen the time "
            "range in the sidebar."
        )
    layer_of = dict(zip(runs["run_id"].astype(str), runs["layer"].astype(str), strict=True))
    st.caption(
        "Its runs: "
        + " · ".join(f"`{rid}` ({layer_of.get(rid, '?')})" for rid in members.get(run_id, []))
    )
    state.url_set(run=run_id)
    # before/after, ROI and decay from per-minute data around it, at any range (cached)
    run, eff, roi, series, decay = cached.run_detail(start, end, run_id)
    a, _ = st.columns([3, 2])
    with a:
        st.markdown(f"**Before / after** ({cfg.effect_window_s / 60:g} min either side)")
        st.dataframe(
            pd.DataFrame(
                {
                    "Metric": [NAMES.get(str(m), (str(m),))[0] for m in eff.index],
                    "Before": [_cell(str(m), float(v)) for m, v in eff["before"].items()],
                    "After": [_cell(str(m), float(v)) for m, v in eff["after"].items()],
                    "Change": [_cell(str(m), float(v), True) for m, v in eff["change"].items()],
                }
            ),
            hide_index=True,
            width="stretch",
        )
    _roi(run, roi, cfg)
    _benefit(series, decay, float(roi["cost"].iloc[0]) if len(roi) else float("nan"))


def _roi(run: pd.Series, roi: pd.DataFrame, cfg: AnalysisConfig) -> None:
    text = roi_text(roi)
    first = roi.sort_values("window_s").head(1)
    if len(first):
        cell = roi_text(first).iloc[0]["roi_compute"]
        st.markdown(
            f"**Compute ROI at T+{float(first['window_s'].iloc[0]) / 60:g} min:** {cell} · "
            f"cost {float(run['gpu_s']):,.2f} GPU-s × {cfg.price_per_gpu_s:g} = "
            f"{float(first['cost'].iloc[0]):.4f}"
        )
    st.markdown(
        "**ROI** (compute: GPU-s saved × price vs cost; business: conversion value vs cost)"
    )
    fmt.wrapped_table(text.rename(columns=ROI_COLUMNS).style)  # long cells say why: wrapped
    st.caption(
        f"Prices: GPU-s at {cfg.price_per_gpu_s:g} and a conversion at "
        f"{cfg.value_per_conversion:g} (configured, `[analysis]`); intervals from per-minute batch "
        "means. A run costs cents while conversions' value moves by currency units a minute, so a "
        "business ROI per run is rarely estimable: the A/B page's experiment ROI weighs every "
        "request of the warmed arm against every run's cost."
    )


def _benefit(series: pd.DataFrame, decay: Decay, cost: float) -> None:
    fig = go.Figure()
    if len(series):
        fig.add_trace(
            go.Scatter(
                x=series.t_s / 60,
                y=series.compute,
                mode="markers",
                name="GPU-s saved × price, per minute",
            )
        )
        if significant_decay(decay):  # drawn only when significant
            t = np.linspace(0, float(series.t_s.max()), 100)
            fig.add_trace(
                go.Scatter(x=t / 60, y=decay.b0 * np.exp(-decay.k_per_hour * t / 3600), name="fit")
            )
    fig.update_layout(
        title="Compute benefit after the warm-up"
        + (
            " and its exponential decay"
            if len(series) and significant_decay(decay)
            else " (no decay measured: no curve)"
        ),
        xaxis_title="minutes after the warm-up",
        yaxis_title="currency units / minute",
        height=360,
    )
    st.plotly_chart(fig, width="stretch")
    total = float(series.compute.sum()) if len(series) else float("nan")
    st.caption(
        f"In the units of the warm-up's cost ({cost:.4f}): the compute benefit over the "
        f"{len(series)} minutes shown adds up to {total:+.4f}. Conversions are left out here "
        "(their noise, currency units a minute against a cost of cents, would hide the cost's "
        "scale)."
    )
    st.markdown(f"**Benefit decay rate k:** {decay_text(decay)}")
