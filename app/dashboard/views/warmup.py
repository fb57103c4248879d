"""Warm-up runs: timeline, coverage (precision, recall, waste), effect, ROI and its decay. The
chosen run lives in the URL."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st
from streamlit.errors import StreamlitAPIException
from warmscope.analysis.config import AnalysisConfig
from warmscope.analysis.roi import decay_text, roi_text
from warmscope.app.dashboard import cached, charts, engine_view, fmt, state


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
    cfg = AnalysisConfig.load()
    runs = state.load(["warmup_runs"], start, end)["warmup_runs"]
    if runs.empty:
        st.info(
            "No warm-up runs in this range: pick 'since the last warm-up run' or a longer range "
            "in the "
            "sidebar. Runs are recorded by `Telemetry.warmup(...)` (the simulator's pools record "
            "theirs unless their strategy is `none`)."
        )
        st.stop()

    def label(r) -> str:
        return (
            f"{fmt.when(r.started)} · {r.replica} · {r.layer} · {r.strategy} · trigger {r.trigger}"
        )

    ordered = runs.sort_values("started", ascending=False)
    labels = {r.run_id: label(r) for r in ordered.itertuples()}

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

    cov = cached.coverage(start, end)  # cached per range
    st.subheader("Warm-set coverage")
    st.caption(
        "Precision: warmed keys whose warmed entry was read (hit before its TTL ran out and "
        "before the "
        "key was first missed). Recall: of the keys requested in the first "
        f"{cfg.recall_window_s / 60:.0f} min after the run, the share it had warmed. Wasted: the "
        "warm-up GPU-seconds of keys never read."
    )
    show = cov.sort_values("started", ascending=False)
    st.dataframe(
        pd.DataFrame(
            {
                "Started (UTC)": show.started.map(fmt.when),
                "Replica": show.replica,
                "Layer": show.layer,
                "Strategy": show.strategy,
                "Trigger": show.trigger,
                "Keys warmed": show.keys_warmed.map(lambda v: f"{v:,.0f}"),
                "Precision": show.precision.map(
                    lambda v: f"{v:.1%}" if v == v else "no warmed keys recorded"
                ),
                "Recall": show.recall.map(
                    lambda v: f"{v:.1%}" if v == v else "no requests in the window"
                ),
                "GPU-s": show.gpu_s.map(lambda v: f"{v:,.2f}" if v == v else "not recorded"),
                "Wasted GPU-s": show.wasted_gpu_s.map(
                    lambda v: f"{v:,.2f}" if v == v else "not recorded"
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

    st.subheader("One run")
    ids = list(labels)
    want = state.url_get("run")
    if "run" not in st.session_state or st.session_state["run"] not in labels:
        st.session_state["run"] = want if want in labels else ids[0]
    run_id = st.selectbox("Run (newest first)", ids, key="run", format_func=labels.get)
    state.url_set(run=run_id)
    # before/after, ROI and decay from per-minute data around the run, at any range (cached per run)
    eff, roi, series, decay = cached.run_detail(start, end, run_id)
    NAMES = {
        "hit_rate": ("Hit rate", "{:.1%}"),
        "ttft_p50_s": ("TTFT P50", "{:.3f} s"),
        "ttft_p95_s": ("TTFT P95", "{:.3f} s"),
        "gpu_s_per_request": ("GPU-s per request", "{:.4f}"),
    }
    a, _ = st.columns([3, 2])
    with a:
        st.markdown(f"**Before / after** ({cfg.effect_window_s / 60:g} min either side)")

        def cell(metric, v, signed=False):
            if v is None or v != v:
                return "not enough points"
            if metric == "hit_rate":
                return f"{v * 100:+.1f} pts" if signed else f"{v:.1%}"
            if signed and abs(v) < 5e-4:
                return "±0"
            s = NAMES.get(metric, (metric, "{:.3g}"))[1].format(v)
            return "+" + s if signed and v >= 0 else s

        st.dataframe(
            pd.DataFrame(
                {
                    "Metric": [NAMES.get(m, (m,))[0] for m in eff.index],
                    "Before": [cell(m, v) for m, v in eff.before.items()],
                    "After": [cell(m, v) for m, v in eff.after.items()],
                    "Change": [cell(m, v, True) for m, v in eff.change.items()],
                }
            ),
            hide_index=True,
            width="stretch",
        )
    # full width: each ROI cell carries its interval
    st.markdown(
        "**ROI** (compute: GPU-s saved × price vs cost; business: conversion value vs cost)"
    )
    st.dataframe(
        roi_text(roi).rename(
            columns={
                "window": "Window",
                "requests": "Requests",
                "gpu_s_saved": "GPU-s saved",
                "cost": "Cost",
                "roi_compute": "Compute ROI",
                "roi_business": "Business ROI",
                "baseline": "Compared with",
            }
        ),
        hide_index=True,
        width="stretch",
    )
    st.caption(
        f"Prices: GPU-s at {cfg.price_per_gpu_s:g} and a conversion at "
        f"{cfg.value_per_conversion:g} "
        "(configured, `[analysis]`); intervals from per-minute batch means."
    )
    fig = go.Figure()
    if len(series):
        fig.add_trace(
            go.Scatter(
                x=series.t_s / 60, y=series.benefit, mode="markers", name="benefit per minute"
            )
        )
        if (
            decay.error is None and np.isfinite(decay.ci_low) and decay.ci_low > 0
        ):  # drawn only when significant
            t = np.linspace(0, series.t_s.max(), 100)
            fig.add_trace(
                go.Scatter(x=t / 60, y=decay.b0 * np.exp(-decay.k_per_hour * t / 3600), name="fit")
            )
    fig.update_layout(
        title="Benefit after the run and its exponential decay",
        xaxis_title="minutes after the run",
        yaxis_title="currency units / minute",
        height=360,
    )
    st.plotly_chart(fig, width="stretch")
    dt = decay_text(decay)
    st.markdown(f"**Benefit decay rate k:** {dt}")
