"""Overview: what happened (latest regression and its cause, latest run and its ROI, open
alerts), the 12-dimension score, hit rate by layer with runs, faults and alerts marked, latest
warm-up runs."""

# ruff: noqa: E402  (imports after the title, on purpose)
from __future__ import annotations

import streamlit as st

st.title("Cache warm-up overview")  # first: it paints before the imports below load

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from warmscope.app.dashboard import cached, charts, engine_view, fmt, state

HIT_RATE_DEF = "hits / (hits + misses) over every layer except model weights"

start, end = state.time_range()
if engine_view.active(start, end):  # engine metrics only
    engine_view.overview(start, end)
    st.stop()
fr = state.load(["warmup_runs"], start, end)
st.caption(f"{fmt.when(start)} → {fmt.when(end)} UTC · hit rate = {HIT_RATE_DEF}")
state.resolution_note(start, end)
cached.unmeasured_note(start, end)
runs = fr["warmup_runs"]
# Cached per store version and range (filled in the background when the server starts); the spinner
# shows only when a figure is still being computed — the first view of a range nobody has opened
# yet.
with st.spinner("Analysing the range: alerts, the latest regression and the warm-up score…"):
    alerts = cached.alerts(start, end)
    dd = cached.drill(start, end, hit_rate_layers_only=True)
    card = cached.card(start, end)

# ---------------------------------------------------------------- what happened
st.subheader("What happened")
lines: list[str] = []
loc = dd.localization
if loc.causes and loc.observed == loc.observed and loc.observed < loc.expected:
    top = loc.causes[0]
    cause = " · ".join(f"{k} = {v}" for k, v in top.element.items())
    lines.append(
        f"**Latest regression** since {fmt.hhmm(dd.anomaly[0])}: hit rate {fmt.pct(loc.observed)} "
        f"vs {fmt.pct(loc.expected)} expected; largest cause **{cause}**. See *Root cause*."
    )
else:
    lines.append("**No significant regression** in this range.")
if len(runs):
    last = runs.sort_values("started").iloc[-1]
    same = runs[(runs.replica == last.replica) & (abs(runs.started - last.started) < 60)]
    msg = (
        f"**Latest warm-up run** {fmt.hhmm(last.started)} on {last.replica} ({last.strategy}, "
        f"trigger {last.trigger}, {len(same)} layer{'s' if len(same) > 1 else ''}, "
        f"{fmt.integer(same['keys'].sum())} keys, {same.gpu_s.sum():,.1f} GPU-s)"
    )
    try:
        roi = cached.run_roi(start, end, last.run_id)
        r5 = roi.sort_values("window_s").iloc[0]
        v = r5.roi_compute
        msg += (
            f"; compute ROI at T+{r5.window_s / 60:g} min: **{v:+.2f}**"
            if np.isfinite(v)
            else "; ROI not estimable yet"
        )
    except Exception:  # ROI needs requests around the run: not every source has them
        pass
    lines.append(msg + ". See *Warm-up runs*.")
else:
    lines.append("**No warm-up run** in this range.")
n_crit = int((alerts.severity == "critical").sum()) if len(alerts) else 0
sec = alerts[alerts.alert.map(fmt.is_security)] if len(alerts) else alerts
lines.append(
    f"**{len(alerts)} open alert{'s' if len(alerts) != 1 else ''}** ({n_crit} critical)."
    if len(alerts)
    else "**No open alerts.**"
)
st.markdown("\n".join(f"- {x}" for x in lines))
for r in sec.itertuples():
    fmt.alert_row(r.severity, r.alert, r.summary, r.since)

# ---------------------------------------------------------------- headline numbers
overall = cached.rates(start, end, hit_rate_layers_only=True)  # cached: reruns read a few rows
c = st.columns(4)
c[0].metric(
    "Warm-up score",
    f"{card.composite:.2f}" if card.composite is not None else "no data",
    help=f"Weighted mean of the {len(card.dimensions)} dimensions' 0–1 scores (table below).",
)
c[1].metric(
    "Hit rate",
    fmt.pct(overall.hit_rate.iloc[0]) if len(overall) and overall.lookups.iloc[0] else "no data",
    help=HIT_RATE_DEF,
)
c[2].metric(
    "Lookups",
    fmt.integer(overall.lookups.iloc[0]) if len(overall) else "0",
    help="Hits + misses, layers except model weights",
)
c[3].metric("Warm-up runs", f"{len(runs):,}", help="One run per replica and layer")

# ------------------------------------------------------- hit rate by layer, with annotations
freq = charts.overview_freq(start, end)
hr = cached.rates(start, end, ("layer",), freq)
if len(hr):
    hr["time"] = hr.bucket.astype("datetime64[s]")
    fig = go.Figure()
    for layer, g in hr.groupby("layer"):
        fig.add_trace(
            go.Scatter(
                x=g.time,
                y=g.hit_rate,
                mode="lines+markers",
                marker_size=3,
                name=str(layer),
                hovertemplate="%{x|%H:%M} · %{y:.1%}<extra>" + str(layer) + "</extra>",
            )
        )
    fig.update_layout(
        title=f"Hit rate by layer ({freq // 60:g}-minute buckets) · drag a box to zoom the range",
        yaxis=dict(range=[0, 1.05], tickformat=".0%", title="hit rate"),
        xaxis_title="time (UTC)",
        height=380,
        dragmode="select",
        margin=dict(t=50, b=40),
        legend_title_text="layer",
    )
    charts.annotate(fig, start, end, alerts)
    ev = st.plotly_chart(
        fig, width="stretch", on_select="rerun", selection_mode="box", key="ov-zoom"
    )
    box = ev.selection.get("box", []) if ev and ev.selection else []
    if box and box[0].get("x"):
        x0, x1 = (pd.Timestamp(x).timestamp() for x in box[0]["x"][:2])
        st.session_state.pop("ov-zoom", None)  # applied once: the box must not zoom again later
        if abs(x1 - x0) >= 300:
            state.zoom_to(min(x0, x1), max(x0, x1))
        st.rerun()
    st.caption(
        "Dotted green lines: warm-up runs · red bands: known fault windows · orange lines: alert "
        "onsets."
    )

# ---------------------------------------------------------------- the score card
st.subheader("Warm-up score")
dims = card.as_frame()


def _value(v, u):
    if v is None or v != v:
        return "no data"
    if u in ("ratio", "share", "fraction"):
        return fmt.pct(v)
    return f"{v:.3g} {u}".strip()


table = pd.DataFrame(
    {
        "Status": dims.score.map(fmt.light),
        "Dimension": dims.label,
        "Value": [_value(v, u) for v, u in zip(dims.value, dims.unit, strict=True)],
        "Target": [_value(t, u) for t, u in zip(dims.target, dims.unit, strict=True)],
        "Score": dims.score.map(lambda s: "–" if s is None or s != s else f"{s:.2f}"),
        "Weight": dims.effective_weight.map(lambda w: f"{w:.1%}"),
        "Note": dims.note,
    }
)
st.dataframe(
    table.style.map(fmt.status_style, subset=["Status"]),
    hide_index=True,
    width="stretch",
    height=38 + 35 * len(table),
    column_config={
        "Status": st.column_config.TextColumn(width="small"),
        "Note": st.column_config.TextColumn(width="large"),
    },
)
if card.note:
    note = card.note
    for d in card.dimensions:  # people read labels, not field names
        note = note.replace(d.name, d.label)
    st.caption(note)

# ---------------------------------------------------------------- radar, alerts and runs
left, right = st.columns(2)
with left:
    have = dims[dims.score.notna()]
    fig = go.Figure(
        go.Scatterpolar(
            r=list(have.score) + list(have.score[:1]),
            theta=list(have.label) + list(have.label[:1]),
            fill="toself",
            name="score",
            hovertemplate="%{theta}: %{r:.2f}<extra></extra>",
        )
    )
    fig.update_layout(
        polar=dict(
            radialaxis=dict(range=[0, 1], tickfont_size=9), angularaxis=dict(tickfont_size=10)
        ),
        height=440,
        margin=dict(l=150, r=150, t=40, b=40),
        showlegend=False,
        title="Dimension scores (0–1)",
    )
    st.plotly_chart(fig, width="stretch")
with right:
    st.subheader("Active alerts")
    if alerts.empty:
        st.success("No alert conditions hold in this range.")
    else:
        for r in alerts.head(6).itertuples():
            fmt.alert_row(r.severity, r.alert, r.summary, r.since)
        if len(alerts) > 6:
            st.caption(f"{len(alerts) - 6} more on the Alerts page.")
st.subheader("Latest warm-up runs")
if runs.empty:
    st.info("No warm-up runs in this range; pick a longer range or 'since the last warm-up run'.")
else:
    r = runs.sort_values("started", ascending=False).head(8)
    st.dataframe(
        pd.DataFrame(
            {
                "Started (UTC)": r.started.map(fmt.when),
                "Replica": r.replica,
                "Layer": r.layer,
                "Strategy": r.strategy,
                "Trigger": r.trigger,
                "Status": r.status,
                "Keys": r["keys"].map(fmt.integer),
                "GPU-s": r.gpu_s.map(lambda x: f"{x:,.1f}"),
            }
        ),
        hide_index=True,
        width="stretch",
    )
