"""Latency: P50 / P95 / P99 over time of time to first token, request latency or cache load time,
overall or per tenant, model, variant, replica (and layer for load time), with runs, faults and
alerts marked. The choices live in the URL."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from warmscope.analysis.latency import DURATION, TTFT
from warmscope.app.dashboard import cached, charts, engine_view, fmt, state

LOAD = "warmscope.cache.load.duration"
METRICS = {
    "ttft": ("Time to first token", TTFT),
    "latency": ("Request latency", DURATION),
    "load": ("Cache load time (per layer)", LOAD),
}
GROUPS = {
    "ttft": ["none", "tenant", "model", "variant", "replica"],
    "latency": ["none", "tenant", "model", "variant", "replica"],
    "load": ["layer", "none", "tenant", "replica"],
}
QS = {"P50": 0.5, "P95": 0.95, "P99": 0.99}
LINE = {"P50": "solid", "P95": "dash", "P99": "dot"}


def _controls(start: float, end: float) -> tuple[str, str, str, int]:
    """The pickers, kept in the URL: (measure, group-by or "none", percentile, bucket seconds)."""
    c1, c2, c3, c4 = st.columns([2, 1, 1, 1])
    state.init_from_url("lat-metric", "metric", cast=lambda v: v if v in METRICS else "ttft")
    if st.session_state.get("lat-metric") not in METRICS:
        st.session_state["lat-metric"] = "ttft"
    mkey = c1.radio(
        "Measure",
        list(METRICS),
        key="lat-metric",
        horizontal=True,
        format_func=lambda k: METRICS[k][0],
    )
    groups = GROUPS[mkey]
    state.init_from_url("lat-by", "by")
    if st.session_state.get("lat-by") not in groups:
        st.session_state["lat-by"] = groups[0]
    by = c2.selectbox(
        "Group by", groups, key="lat-by", format_func=lambda g: "nothing" if g == "none" else g
    )
    state.init_from_url("lat-q", "q")
    if st.session_state.get("lat-q") not in QS:
        st.session_state["lat-q"] = "P95"
    qname = c3.selectbox(
        "Percentile (grouped)",
        list(QS),
        key="lat-q",
        disabled=by == "none",
        help="With a grouping, one line per group at this percentile; without, P50, P95 and P99.",
    )
    res = state.step(start, end) or 0
    opts = [f for f in (60, 300, 600, 1800, 3600, 6 * 3600) if f >= res]
    freq = c4.select_slider(
        "Bucket",
        options=opts,
        value=max(600, opts[0]),
        format_func=lambda s: f"{s // 3600} h" if s >= 3600 else f"{s // 60} min",
    )
    state.url_set(metric=mkey, by=by, q=qname if by != "none" else None)
    return str(mkey), str(by), str(qname), int(freq)


def _chart(
    t: pd.DataFrame, top: float, label: str, keys: list[str], qname: str, freq: int
) -> go.Figure:
    """The percentiles over time: P50, P95 and P99 ungrouped, one line per group otherwise; a
    triangle where a percentile lies past the histogram's last edge."""
    t["time"] = t.bucket.astype("datetime64[s]")
    fig = go.Figure()
    series = (
        [(name, t, name) for name in QS]
        if not keys
        else [(qname, g, str(val)) for val, g in t.groupby(keys[0], sort=True)]
    )
    for q, g, name in series:
        col = f"p{QS[q] * 100:g}"
        over = g[f"overflow_{col}"].astype(bool).to_numpy()
        text = np.where(over, f"> {top:g} s (past the last bucket edge)", "")
        fig.add_trace(
            go.Scatter(
                x=g.time,
                y=g[col],
                mode="lines+markers",
                marker_size=4,
                name=name,
                line_dash=LINE[q] if not keys else None,
                marker_symbol=np.where(over, "triangle-up", "circle"),
                customdata=np.column_stack([g["count"].to_numpy(), text]),
                hovertemplate="%{x|%H:%M} · " + q + " %{y:.3f} s %{customdata[1]}<br>"
                "%{customdata[0]:,.0f} observations<extra>" + name + "</extra>",
            )
        )
    what = "P50, P95 and P99" if not keys else f"{qname} by {keys[0]}"
    fig.update_layout(
        title=f"{label}: {what} ({freq // 60:g}-minute buckets)",
        yaxis=dict(title="seconds", rangemode="tozero"),
        xaxis_title="time (UTC)",
        height=420,
        legend_title_text="percentile" if not keys else keys[0],
        margin=dict(t=50, b=40),
    )
    return fig


def _whole_range(whole: pd.DataFrame, top: float, keys: list[str]) -> None:
    by = keys[0] if keys else ""
    st.subheader(f"Over the whole range{' by ' + by if keys else ''}")
    table = pd.DataFrame(
        {
            **({by: whole[by].astype(str)} if keys else {}),
            "Observations": whole["count"].map(fmt.integer),
        }
    )
    for q in QS:
        col = f"p{QS[q] * 100:g}"
        table[q] = [
            f"> {top:g} s" if o else f"{v:.3f} s"
            for v, o in zip(whole[col], whole[f"overflow_{col}"], strict=True)
        ]
    st.dataframe(
        table.sort_values(
            "Observations", key=lambda s: s.str.replace(",", "").astype(float), ascending=False
        ),
        hide_index=True,
        width="stretch",
        column_config={
            "Observations": st.column_config.TextColumn(
                help="measurements in the range: requests (time to first token, latency) or "
                "cache loads (load time)"
            )
        },
    )


def render() -> None:
    start, end = state.time_range()
    if engine_view.active(start, end):  # engine metrics only: the overview shows their TTFT
        engine_view.needs_collectors("Latency percentiles per tenant, model, variant and layer")
    if all(cached.latency(start, end, m) is None for m in (TTFT, DURATION, LOAD)):
        st.info(
            "No latency histograms in this range: request latency and TTFT come from "
            "`tel.record_request(...)`, cache load times from `InstrumentedCache.get_or_load`. "
            "Widen the range in the sidebar."
        )
        st.stop()
    mkey, by, qname, freq = _controls(start, end)
    label, metric = METRICS[mkey]
    state.resolution_note(start, end)
    keys = [] if by == "none" else [by]
    qs = tuple(QS.values()) if not keys else (QS[qname],)
    # cached per range and choice: a rerun reads a few rows
    view = cached.latency(start, end, metric, keys, qs, freq)
    if view is None:
        st.info(f"No {label.lower()} recorded in this range.")
        st.stop()
    t, whole, top = view
    fig = _chart(t, top, label, keys, qname, freq)
    charts.annotate(fig, start, end)
    st.plotly_chart(fig, width="stretch")
    st.caption(
        "Quantiles from histogram buckets (linear inside a bucket, as Prometheus' "
        "histogram_quantile). "
        f"A triangle marks a bucket whose percentile lies past the last edge ({top:g} s): only a "
        "lower limit is known there. " + charts.ALERT_ONSETS
    )
    _whole_range(whole, top, keys)
