"""Advisor: request forecasts with intervals and the next peak; tuned warm-up parameters with before/after."""

# ruff: noqa: E402  (imports after the title, on purpose)
from __future__ import annotations

import streamlit as st

st.title("Advisor")  # first: it paints before the imports below load

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from warmscope.analysis.advisor import advise
from warmscope.analysis.forecast import evaluate, forecast_now, forecast_table, series
from warmscope.analysis.replay import curves
from warmscope.app.dashboard import data, ui

st.caption("What to warm and when: request forecasts per key family at 5 s, 3 min and 1 h, checked against "
           "seasonal-naive and exponential-smoothing baselines on the held-back last 20 % of the range; warm-up "
           "parameters tuned by Bayesian optimisation over a replay of the recorded traffic "
           "(`warmscope advise` prints the same).")
start, end = ui.time_range()
if ui.step(start, end):
    st.info("The advisor needs per-minute lookups: pick a range of 24 hours or less.")
    st.stop()
fr = ui.load(["lookups", "warmup_runs", "warmed_keys", "hot_keys"], start, end)
lk = fr["lookups"]
if len(lk) == 0 or lk["ts"].max() - lk["ts"].min() < 2 * 3600:
    st.info("The advisor needs at least 2 hours of lookups in the range: pick a longer range.")
    st.stop()


@st.cache_data(ttl=data.TTL, show_spinner=False)
def _forecast(store: str, start: float, end: float, _lk: pd.DataFrame):
    tab = forecast_table(_lk, ("family",))
    s = series(_lk, ("layer",))
    ev = evaluate(s)
    return tab, forecast_now(_lk, ("layer",), evaluations=ev)


@st.cache_data(ttl=data.TTL, show_spinner=False)
def _advise(store: str, start: float, end: float, budget: float | None, _fr: dict):
    rec = advise(_fr, budget_gpu_s=budget)
    return rec, curves(rec.model, rec.base), curves(rec.model, rec.params)


with st.spinner("Forecasting…"):
    tab, fc = _forecast(data.store_path(), start, end, lk)

MODEL_NAMES = {"ses": "exponential smoothing", "seasonal_naive": "seasonal naive"}
st.subheader("Forecast")
kept = tab[tab.kept]
cols = st.columns(len(kept) or 1)
for c, (_, r) in zip(cols, kept.iterrows(), strict=False):
    base = tab[(tab.horizon_s == r.horizon_s) & (tab.model != r.model)]
    best_base = base.mape.min() if len(base) else np.nan
    label = f"{r.horizon_s / 3600:g} h" if r.horizon_s >= 3600 else (
        f"{r.horizon_s / 60:g} min" if r.horizon_s >= 60 else f"{r.horizon_s:g} s")
    c.metric(f"MAPE {label} ({MODEL_NAMES.get(r.model, r.model)})", f"{r.mape:.1%}",
             delta=None if r.model != "regression" else f"{r.mape - best_base:+.1%} vs best baseline",
             delta_color="inverse", help=f"90 % interval coverage {r.coverage_90:.0%}. {r.note}")
hs = sorted(fc.horizon_s.unique()) if len(fc) else [3600.0]
h = st.radio("Horizon", hs, index=len(hs) - 1, horizontal=True, key="adv_h",
             format_func=lambda s: f"{s / 3600:g} h" if s >= 3600 else (f"{s / 60:g} min" if s >= 60 else f"{s:g} s"))
layer = st.selectbox("Layer", sorted(fc.group.unique()) if len(fc) else [], key="adv_layer")
f = fc[(fc.horizon_s == h) & (fc.group == layer)].copy()
f["when"] = pd.to_datetime(f.ts, unit="s")
fig = go.Figure()
fig.add_trace(go.Scatter(x=f.when, y=f.hi, line=dict(width=0), showlegend=False, hoverinfo="skip"))
fig.add_trace(go.Scatter(x=f.when, y=f.lo, fill="tonexty", line=dict(width=0), name="90 % interval",
                         fillcolor="rgba(99,110,250,0.2)"))
fig.add_trace(go.Scatter(x=f.when, y=f.forecast, name="forecast", line=dict(color="#636efa")))
fig.add_trace(go.Scatter(x=f.when, y=f.actual, name="actual", line=dict(color="#222", width=1)))
held = f.ts.quantile(0.8) if len(f) else None
if held is not None:
    fig.add_vline(x=pd.to_datetime(held, unit="s"), line_dash="dot", annotation_text="held back →")
fig.update_layout(title=f"{layer}: mean requests/s over the next {h:g} s, forecast at each minute",
                  yaxis_title="requests / s", height=380, margin=dict(t=50, b=20))
st.plotly_chart(fig, width="stretch")
with st.expander("Forecast error per horizon and model (per key family)"):
    st.dataframe(tab.style.format({"mape": "{:.1%}", "coverage_90": "{:.0%}"}), hide_index=True, width="stretch")

st.subheader("Recommendation")
budget = st.number_input("Warm-up budget (GPU-s per day, 0 = no cap)", min_value=0.0, value=0.0, step=50.0,
                         key="adv_budget")
with st.spinner("Tuning (Bayesian optimisation over the replay)…"):
    try:
        rec, before, after = _advise(data.store_path(), start, end, budget or None, fr)
    except ValueError as e:
        st.info(f"No recommendation: {e}.")
        st.stop()
if rec.peak:
    a, b = st.columns(2)
    a.metric("Next peak", ui.when(rec.peak.at), help=rec.peak.basis)
    b.metric("Trigger the warm-up at", ui.when(rec.trigger_at),
             help=f"{rec.params.lead_s / 60:.0f} min before the peak (recommended lead time)")
p, q = rec.base, rec.params
st.dataframe(pd.DataFrame({
    "recorded": [str(p.warm_keys), f"{p.response_ttl_s / 60:.0f} min", f"{p.lambda_per_s:.2e}",
                 f"{p.lead_s / 60:.0f} min"],
    "recommended": [str(q.warm_keys), f"{q.response_ttl_s / 60:.0f} min", f"{q.lambda_per_s:.2e}",
                    f"{q.lead_s / 60:.0f} min"]},
    index=["warm-set size (keys per layer)", "response TTL", "heat decay λ (per s)", "trigger lead before peak"]),
    width="stretch")
o, bo = rec.outcome, rec.base_outcome
c1, c2, c3, c4 = st.columns(4)
c1.metric("Expected gain", f"{rec.gain:+.0f} GPU-s", help=f"GPU-s saved minus warm-up GPU-s over the range, against "
          f"the recorded parameters (the objective); GP sd {rec.gain_sd:.0f} GPU-s")
c4.metric("Warm-up ROI (compute)", f"{o.roi:+.2f}", delta=f"{o.roi - bo.roi:+.2f}",
          help="(GPU-s the warm-ups' hits save − their GPU-s) / their GPU-s; a change that returns less in total "
          "can have the higher ratio, so the tuning maximises the net GPU-s")
c2.metric("Warm-up GPU-s", f"{o.warm_gpu_s:.0f}", delta=f"{o.warm_gpu_s - bo.warm_gpu_s:+.0f}", delta_color="inverse")
c3.metric("Warm-up bytes", f"{o.warm_bytes / 1e6:.0f} MB", delta=f"{(o.warm_bytes - bo.warm_bytes) / 1e6:+.0f} MB",
          delta_color="inverse")
fig = go.Figure()
for name, cv, dash in (("recorded", before, "dot"), ("recommended", after, "solid")):
    for ly, g in cv.groupby("layer"):
        fig.add_trace(go.Scatter(x=pd.to_datetime(g.ts, unit="s"), y=g.hit_rate, name=f"{ly} · {name}",
                                 line=dict(dash=dash)))
fig.update_layout(title="Replayed hit rate per 15 min: recorded parameters vs recommended", yaxis_tickformat=".0%",
                  height=380, margin=dict(t=50, b=20))
st.plotly_chart(fig, width="stretch")
st.caption(f"{rec.evaluations} replays in {rec.seconds:.1f} s. The replay is validated against the simulator "
           "(replayed and simulated hit rates within 3 points); prove a recommendation with a simulator A/B "
           "(pool B on the recommended parameters). Staleness: warmed entries expire at the TTL, are evicted unread "
           "when the cache turns over, and lose popularity as the hot keys did — "
           + "; ".join(rec.model.persist_note.values()) + ".")
