"""Overview: the 12-dimension score, hit rate by layer, alerts, latest warm-up runs."""

from __future__ import annotations

import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from warmscope.analysis.config import AnalysisConfig
from warmscope.analysis.hitrate import hit_table
from warmscope.analysis.scores import score_card
from warmscope.app import engine_view, ui
from warmscope.analysis.alerts import evaluate, hot_keys_since

st.title("Cache warm-up overview")
start, end = ui.time_range()
if engine_view.active(start, end):  # engine metrics only
    engine_view.overview(start, end)
    st.stop()
fr = ui.load(["lookups", "requests", "histograms", "warmup_runs", "warmed_keys", "gauges", "writes", "early_keys"],
             start, end)
fr.update(ui.load(["hot_keys"], max(start, hot_keys_since(start, end)), end))  # only what the alert checks read
st.caption(f"{ui.when(start)} → {ui.when(end)}")
ui.resolution_note(start, end)
card = score_card(fr, AnalysisConfig.load())
lk = fr["lookups"]
overall = hit_table(lk)
c = st.columns(4)
c[0].metric("Warm-up score", f"{card.composite:.2f}" if card.composite is not None else "no data")
c[1].metric("Hit rate", f"{overall.hit_rate.iloc[0]:.1%}" if len(overall) and overall.lookups.iloc[0] else "no data")
c[2].metric("Lookups", f"{int(overall.lookups.iloc[0]):,}" if len(overall) else "0")
c[3].metric("Warm-up runs", f"{len(fr['warmup_runs']):,}")

left, right = st.columns([1, 1])
with left:
    dims = card.as_frame()
    have = dims[dims.score.notna()]
    fig = go.Figure(go.Scatterpolar(r=list(have.score) + list(have.score[:1]),
                                    theta=list(have.label) + list(have.label[:1]), fill="toself",
                                    name="score"))
    fig.update_layout(polar=dict(radialaxis=dict(range=[0, 1])), height=420, margin=dict(l=60, r=60, t=30, b=30),
                      showlegend=False)
    st.plotly_chart(fig, width="stretch")
with right:
    table = dims.assign(
        status=dims.score.map(ui.light),
        value=[("no data" if v is None or v != v else f"{v:.3g} {u}") for v, u in zip(dims.value, dims.unit)],
        score=dims.score.map(lambda s: "–" if s is None or s != s else f"{s:.2f}"),
        weight=dims.effective_weight.map(lambda w: f"{w:.1%}"),
    )[["status", "label", "value", "target", "score", "weight", "note"]]
    st.dataframe(table, hide_index=True, width="stretch", height=460)
if card.note:
    st.caption(card.note)

hr = hit_table(lk, by=["layer"], freq=max(600, ui.step(start, end) or 0))
if len(hr):
    hr["time"] = hr.bucket.astype("datetime64[s]")
    st.plotly_chart(px.line(hr, x="time", y="hit_rate", color="layer", range_y=[0, 1],
                            title="Hit rate by layer (10-minute buckets)"), width="stretch")

a, b = st.columns(2)
with a:
    st.subheader("Active alerts")
    alerts = evaluate(fr, start, end)
    if alerts.empty:
        st.success("No alert conditions hold in this range.")
    else:
        st.dataframe(alerts[["severity", "alert", "summary"]], hide_index=True, width="stretch")
with b:
    st.subheader("Latest warm-up runs")
    runs = fr["warmup_runs"]
    if runs.empty:
        st.info("No warm-up runs in this range.")
    else:
        r = runs.sort_values("started", ascending=False).head(8)
        st.dataframe(r.assign(started=r.started.map(ui.when))[["started", "replica", "layer", "strategy",
                                                                "trigger", "status", "keys", "gpu_s"]],
                     hide_index=True, width="stretch")
