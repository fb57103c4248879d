"""Warm-up runs: timeline, coverage (precision, recall, waste), effect, ROI and its decay."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from warmscope.analysis.config import AnalysisConfig
from warmscope.analysis.coverage import run_effect, warm_set_coverage
from warmscope.analysis.roi import benefit_series, fit_decay, roi_windows
from warmscope.app import ui

st.title("Warm-up runs")
st.page_link("pages/advisor.py", label="What to warm and when: forecasts and tuned parameters in the Advisor", icon="🧭")
start, end = ui.time_range()
cfg = AnalysisConfig.load()
fr = ui.load(["warmup_runs", "warmed_keys", "early_keys"], start, end)
runs = fr["warmup_runs"]
if runs.empty:
    st.info("No warm-up runs in this range. Wrap warm-up jobs in `Telemetry.warmup(...)` (or run the simulator "
            "with a strategy other than `none`).")
    st.stop()
tl = runs.assign(start=pd.to_datetime(runs.started, unit="s"),
                 finish=pd.to_datetime(runs.ended.fillna(end), unit="s") + pd.Timedelta(seconds=5))
st.plotly_chart(px.timeline(tl, x_start="start", x_end="finish", y="replica", color="strategy",
                            hover_data=["layer", "trigger", "keys", "gpu_s", "status"],
                            title="Runs per replica and strategy"), width="stretch")

cov = warm_set_coverage(runs, fr["warmed_keys"], fr["early_keys"], cfg.recall_window_s)
st.subheader("Warm-set coverage")
st.caption("Precision: warmed keys whose warmed entry was read (hit before its TTL ran out and before the key "
           f"was first missed). Recall: of the keys requested in the first {cfg.recall_window_s / 60:.0f} min "
           "after the run, the share it had warmed. Wasted: the warm-up GPU-seconds of keys never read.")
show = cov.assign(started=cov.started.map(ui.when))
st.dataframe(show[["run_id", "started", "replica", "layer", "strategy", "trigger", "keys_warmed", "precision",
                   "recall", "gpu_s", "wasted_gpu_s"]].style.format(
    {"precision": "{:.1%}", "recall": "{:.1%}", "gpu_s": "{:.2f}", "wasted_gpu_s": "{:.2f}"}),
    hide_index=True, width="stretch")
by = cov.groupby("strategy")[["keys_warmed", "keys_read", "gpu_s", "wasted_gpu_s"]].sum()
by["precision"] = by.keys_read / by.keys_warmed.replace(0, np.nan)
st.plotly_chart(px.bar(by.reset_index(), x="strategy", y=["gpu_s", "wasted_gpu_s"], barmode="group",
                       title="Warm-up GPU-seconds spent and wasted, by strategy"), width="stretch")

run_id = st.selectbox("Run", list(runs.sort_values("started", ascending=False).run_id), key="run")
run = runs.set_index("run_id").loc[run_id]
run = pd.Series({**run.to_dict(), "run_id": run_id})
# A run's before/after, ROI and decay need per-minute data around it only, at any range.
ended = run.ended if run.ended == run.ended else end
span = max([cfg.effect_window_s, cfg.decay_horizon_s, *cfg.roi_windows_s])
fr.update(ui.load(["lookups", "histograms"], run.started - cfg.effect_window_s - 60, ended + cfg.effect_window_s + 60,
                  fine=True))
fr.update(ui.load(["requests"], run.started - span - 60, ended + span + 60, fine=True))
a, b = st.columns(2)
with a:
    st.subheader("Before / after")
    eff = run_effect(run, fr["lookups"], fr["histograms"], fr["requests"], cfg.effect_window_s)
    st.dataframe(eff.style.format("{:.3g}"), width="stretch")
with b:
    st.subheader("ROI")
    roi = roi_windows(run, fr["requests"], cfg.price_per_gpu_s, cfg.value_per_conversion, cfg.roi_windows_s)
    roi["window"] = roi.window_s.map(lambda s: f"T+{s / 3600:g} h" if s >= 3600 else f"T+{s / 60:g} min")
    st.dataframe(roi[["window", "requests", "gpu_s_saved", "cost", "roi_compute", "roi_business", "baseline"]]
                 .style.format({"gpu_s_saved": "{:.2f}", "cost": "{:.4f}", "roi_compute": "{:.2f}",
                                "roi_business": "{:.2f}"}), hide_index=True, width="stretch")
series = benefit_series(run, fr["requests"], cfg.price_per_gpu_s, cfg.value_per_conversion, cfg.decay_horizon_s)
decay = fit_decay(series)
fig = go.Figure()
if len(series):
    fig.add_trace(go.Scatter(x=series.t_s / 60, y=series.benefit, mode="markers", name="benefit per minute"))
    if decay.error is None:
        t = np.linspace(0, series.t_s.max(), 100)
        fig.add_trace(go.Scatter(x=t / 60, y=decay.b0 * np.exp(-decay.k_per_hour * t / 3600), name="fit"))
fig.update_layout(title="Benefit after the run and its exponential decay", xaxis_title="minutes after the run",
                  yaxis_title="currency / minute", height=380)
st.plotly_chart(fig, width="stretch")
if decay.error:
    st.info(f"Decay not fitted: {decay.error}.")
else:
    st.metric("ROI decay rate k", f"{decay.k_per_hour:.2f} / h",
              help=(f"95% CI {decay.ci_low:.2f} – {decay.ci_high:.2f}" if np.isfinite(decay.ci_low) else
                    "95% CI not estimable (too few distinct points)") + f"; half-life {decay.half_life_h:.2f} h")
