"""Overview: what happened (latest regression and its cause, latest run and its ROI, open
alerts), the 12-dimension score, hit rate by layer with runs, faults and alerts marked, latest
warm-up runs.

With engine metrics only, the same page shows the engines' token-weighted prefix-cache hit rate
(through the same cached hit-rate tables and chart), cached tokens by source, KV-cache usage and
time to first token."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st
from warmscope.analysis.config import AnalysisConfig
from warmscope.analysis.roi import decay_text, roi_text
from warmscope.analysis.scores import status, weight_text, weights_note
from warmscope.app.dashboard import cached, charts, engine_view, fmt, state

if TYPE_CHECKING:
    from warmscope.analysis.drilldown import DrillDown
    from warmscope.analysis.scores import ScoreCard

HIT_RATE_DEF = "hits / (hits + misses) over every layer except model weights"
ENGINE_TABLE_BY = ("model", "instance", "engine_kind", "engine")


def render() -> None:
    start, end = state.time_range()
    if engine_view.active(start, end):  # engine metrics only
        _engine_overview(start, end)
        st.stop()
    runs = state.load(["warmup_runs"], start, end)["warmup_runs"]
    st.caption(f"{fmt.when(start)} → {fmt.when(end)} UTC · hit rate = {HIT_RATE_DEF}")
    state.resolution_note(start, end)
    cached.unmeasured_note(start, end)
    # Cached per store version and range (filled in the background when the server starts); the
    # spinner shows only when a figure is still being computed — the first view of a range nobody
    # has opened yet.
    with st.spinner("Analysing the range: alerts, the latest regression and the warm-up score…"):
        alerts = cached.alerts(start, end)
        dd = cached.drill(start, end, hit_rate_layers_only=True)
        card = cached.card(start, end)
    _what_happened(start, end, alerts, dd)
    _headline(start, end, runs, card)
    freq = charts.overview_freq(start, end)
    hr = cached.rates(start, end, ("layer",), freq)
    if len(hr):
        _hit_rate_chart(
            hr,
            "layer",
            f"Hit rate by layer ({freq // 60:g}-minute buckets) · drag a box to zoom the range",
            start,
            end,
            alerts,
        )
        st.caption(charts.ALERT_ONSETS)
    dims = _score_card(card)
    _radar_and_alerts(dims, alerts)
    _latest_runs(runs)


def _hit_rate_chart(
    hr: pd.DataFrame,
    by: str,
    title: str,
    start: float,
    end: float,
    alerts: pd.DataFrame | None = None,
) -> None:
    """Hit rate over time, one line per ``by``, with runs, faults and alert onsets marked; a box
    dragged on it zooms the range."""
    hr = hr.assign(time=hr.bucket.astype("datetime64[s]"))
    fig = go.Figure()
    for val, g in hr.groupby(by):
        fig.add_trace(
            go.Scatter(
                x=g.time,
                y=g.hit_rate,
                mode="lines+markers",
                marker_size=3,
                name=str(val),
                hovertemplate="%{x|%H:%M} · %{y:.1%}<extra>" + str(val) + "</extra>",
            )
        )
    fig.update_layout(
        title=title,
        yaxis=dict(range=[0, 1.05], tickformat=".0%", title="hit rate"),
        xaxis_title="time (UTC)",
        height=380,
        dragmode="select",
        margin=dict(t=50, b=40),
        legend_title_text=by,
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


def latest_run_line(start: float, end: float) -> str:
    """The range's latest warm-up (its layers' runs merged), its compute ROI at the first window
    and its benefit's decay: the figures the Warm-up runs page shows for it (one cached result)."""
    wid = cached.latest_warmup(start, end)
    if wid is None:
        return "**No warm-up run** in this range."
    run, _eff, roi, _series, decay = cached.run_detail(start, end, wid)
    first = roi.sort_values("window_s").head(1)
    cell = roi_text(first).iloc[0]["roi_compute"] if len(first) else "no window"
    window = f"T+{float(first['window_s'].iloc[0]) / 60:g} min" if len(first) else ""
    layers = str(run["layer"]).split("+")
    return (
        f"**Latest warm-up run** {fmt.hhmm(float(run['started']))} on {run['replica']} "
        f"({run['strategy']}, trigger {run['trigger']}, {len(layers)} "
        f"layer{'s' if len(layers) > 1 else ''}, {fmt.integer(float(run['keys']))} keys, "
        f"{float(run['gpu_s']):,.2f} GPU-s); compute ROI at {window}: **{cell}**; benefit "
        f"decay: {decay_text(decay)}. See *Warm-up runs*."
    )


def _what_happened(start: float, end: float, alerts: pd.DataFrame, dd: DrillDown) -> None:
    st.subheader("What happened")
    lines: list[str] = []
    loc = dd.localization
    if loc.causes and loc.observed == loc.observed and loc.observed < loc.expected:
        top = loc.ranked()[0]
        cause = " · ".join(f"{k} = {v}" for k, v in top.element.items())
        lines.append(
            f"**Latest regression** since {fmt.hhmm(dd.anomaly[0])}: hit rate "
            f"{fmt.pct(loc.observed)} vs {fmt.pct(loc.expected)} expected; largest cause "
            f"**{cause}**. See *Root cause*."
        )
    else:
        lines.append("**No significant regression** in this range.")

    lines.append(latest_run_line(start, end))
    n_crit = int((alerts.severity == "critical").sum()) if len(alerts) else 0
    sec = alerts[alerts.alert.map(fmt.is_security)] if len(alerts) else alerts
    lines.append(
        (
            f"**{len(alerts)} open alert{'s' if len(alerts) != 1 else ''}** ({n_crit} critical) "
            f"at {fmt.hhmm(end)}, the range's end"
            if len(alerts)
            else f"**No open alerts** at {fmt.hhmm(end)}, the range's end"
        )
        + " (the Alerts page's “Holding now” and the history's still-firing episodes)."
    )
    st.markdown("\n".join(f"- {x}" for x in lines))
    st.caption(
        "The regression is sought at the range's change point, against as long before it, on "
        "every layer except model weights: another range can find another change point (or "
        "none); Root cause counts every layer, and an alert compares the last 20 minutes with "
        "the 20 before."
    )
    fmt.alert_rows(sec)
    past = cached.leak(start, end)
    if past is not None and sec.empty:  # a security finding stays red after it stops holding
        layers = past["layers"]
        where = "/".join(map(str, layers)) if isinstance(layers, list) else ""
        st.error(
            "**SECURITY · CrossTenantCacheRead in this range, no longer holding** — cross-tenant "
            f"reads of {past['shared_keys']} {where} keys from "
            f"{fmt.hhmm(fmt.num(past['first']))} (last hot-key window "
            f"{fmt.hhmm(fmt.num(past['last']))}). See *Alerts*."
        )


def _headline(start: float, end: float, runs: pd.DataFrame, card: ScoreCard) -> None:
    overall = cached.rates(start, end, hit_rate_layers_only=True)  # cached: reruns read a few rows
    c = st.columns(4)
    c[0].metric(
        "Warm-up score",
        f"{card.composite:.2f}" if card.composite is not None else "no data",
        help=f"Weighted mean of the {len(card.dimensions)} dimensions' 0–1 scores (table below).",
    )
    c[1].metric(
        "Hit rate",
        fmt.pct(overall.hit_rate.iloc[0])
        if len(overall) and overall.lookups.iloc[0]
        else "no data",
        help=HIT_RATE_DEF,
    )
    c[2].metric(
        "Lookups",
        fmt.integer(overall.lookups.iloc[0]) if len(overall) else "0",
        help="Hits + misses, layers except model weights",
    )
    c[3].metric("Warm-up runs", f"{len(runs):,}", help="One run per replica and layer")


def _value(v: float | None, u: str) -> str:
    if v is None or v != v:
        return "no data"
    if u in ("ratio", "share", "fraction"):
        return fmt.pct(v)
    return f"{v:.3g} {u}".strip()


def _score_card(card: ScoreCard) -> pd.DataFrame:
    """The score card's table: status (OK only where the value meets its target), value, target,
    score and the weight with why it is that weight."""
    st.subheader("Warm-up score")
    cfg = AnalysisConfig.load()
    dims = card.as_frame()
    table = pd.DataFrame(
        {
            "Status": [fmt.STATUS[status(d, cfg)][0] for d in card.dimensions],
            "Dimension": dims.label,
            "Value": [_value(d.value, d.unit) for d in card.dimensions],
            "Target": [_value(d.target, d.unit) for d in card.dimensions],
            "Score": [
                "–" if d.score is None or d.score != d.score else f"{d.score:.2f}"
                for d in card.dimensions
            ],
            "Weight": [f"{d.effective_weight:.1%}" for d in card.dimensions],
            "Why this weight": [weight_text(d, card, cfg) for d in card.dimensions],
        }
    )
    st.dataframe(
        table.style.map(fmt.status_style, subset=["Status"]),
        hide_index=True,
        width="stretch",
        height=38 + 35 * len(table),
        column_config={
            "Status": st.column_config.TextColumn(width="small"),
            "Why this weight": st.column_config.TextColumn(width="medium"),
        },
    )
    notes = [f"**{d.label}** — {d.note}" for d in card.dimensions if d.note]
    if notes:  # below the table: a note is a sentence, a table column cuts it at any width
        st.markdown("\n".join(f"- {n}" for n in notes))
    st.caption(
        "Status: OK at a score of 0.8 or more with the value meeting its target (or its CI "
        "reaching it), FAIR from 0.5, POOR below. "
        + weights_note(card)
        + " Base weights: `[analysis.dimensions.NAME] weight`."
    )
    if card.note:
        note = card.note
        for d in card.dimensions:  # people read labels, not field names
            note = note.replace(d.name, d.label)
        st.caption(note)
    return dims


def _radar_and_alerts(dims: pd.DataFrame, alerts: pd.DataFrame) -> None:
    left, right = st.columns(2)
    with left:
        have = dims[dims.score.notna()]
        # long labels on two lines: on one, the figure's edge cut them ("…sliding window")
        labels = ["<br>".join(textwrap.wrap(str(x), 24)) for x in have.label]
        fig = go.Figure(
            go.Scatterpolar(
                r=list(have.score) + list(have.score[:1]),
                theta=labels + labels[:1],
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
            fmt.alert_rows(alerts, 6)
            if len(alerts) > 6:
                st.caption(f"{len(alerts) - 6} more on the Alerts page.")


def _latest_runs(runs: pd.DataFrame) -> None:
    st.subheader("Latest warm-up runs")
    if runs.empty:
        st.info(
            "No warm-up runs in this range; pick a longer range or 'since the last warm-up run'."
        )
        return
    r = runs.sort_values("started", ascending=False).head(8)
    st.dataframe(
        pd.DataFrame(
            {
                "Started (UTC)": r["started"].map(fmt.when),
                "Replica": r["replica"],
                "Layer": r["layer"],
                "Strategy": r["strategy"],
                "Trigger": r["trigger"],
                "Status": r["status"],
                "Keys": r["keys"].map(fmt.integer),
                "GPU-s": r["gpu_s"].map(lambda x: f"{x:,.1f}"),
            }
        ),
        hide_index=True,
        width="stretch",
    )


def _engine_overview(start: float, end: float) -> None:
    """Engine metrics only: the engines' token-weighted prefix-cache hit rate (the hit-rate
    tables of the collector view, over the engines' counters), then what only engines export."""
    per = _engine_totals(start, end)
    _engine_table(per)
    freq = engine_view.bucket(start, end)
    _hit_rate_chart(
        cached.rates(start, end, ("instance",), freq, engine=True),
        "instance",
        f"Prefix-cache hit rate by instance (token-weighted, {freq // 60:g}-minute buckets)",
        start,
        end,
    )
    left, right = st.columns(2)
    with left:
        _cached_by_source(start, end)
    with right:
        _kv_usage(start, end)
    _engine_ttft(start, end)


def _engine_totals(start: float, end: float) -> pd.DataFrame:
    """The engines' totals as metrics; returns the hit-rate table by model, instance, engine."""
    st.caption(f"{fmt.when(start)} → {fmt.when(end)} · engine metrics from Prometheus")
    st.info(engine_view.COLLECTORS_NOTE)
    tot = cached.rates(start, end, engine=True)
    if tot.empty or not tot.lookups.iloc[0]:
        engine_view.no_engine_data()
    per = cached.rates(start, end, ENGINE_TABLE_BY, engine=True)
    c = st.columns(4)
    c[0].metric("Prefix-cache hit rate (tokens)", fmt.pct(tot.hit_rate.iloc[0]))
    c[1].metric("Prompt tokens", fmt.integer(tot.lookups.iloc[0]))
    c[2].metric("Cached tokens", fmt.integer(tot.hits.iloc[0]))
    c[3].metric("Instances", f"{per.instance.nunique():,}")
    return per


def _engine_table(per: pd.DataFrame) -> None:
    st.subheader("Hit rate by model, instance and engine")
    table = per.rename(columns={"lookups": "queries"})[
        [*ENGINE_TABLE_BY, "hits", "queries", "hit_rate"]
    ].sort_values(["model", "instance"])
    st.dataframe(
        table.style.format({"hit_rate": "{:.2%}", "hits": "{:,.0f}", "queries": "{:,.0f}"}),
        hide_index=True,
        width="stretch",
        key="engine-hit-table",
        column_config={
            "hits": "cached tokens",
            "queries": "prompt tokens",
            "hit_rate": "hit rate",
            "engine_kind": "engine kind",
        },
    )


def _cached_by_source(start: float, end: float) -> None:
    src = engine_view.frame("engine_cached_by_source", start, end)
    src = src[src.tokens > 0] if len(src) else src
    if src.empty:
        st.info(
            "No cached tokens by source in this range (vLLM "
            "`prompt_tokens_cached_by_source`, "
            "SGLang `cached_tokens_total{cache_source}`)."
        )
    else:
        s = src.groupby(["instance", "source"], as_index=False).tokens.sum()
        s["share"] = s.tokens / s.groupby("instance").tokens.transform("sum")
        st.plotly_chart(
            px.bar(
                s,
                x="instance",
                y="share",
                color="source",
                range_y=[0, 1],
                title="Cached-token share by source",
            ),
            width="stretch",
        )


def _kv_usage(start: float, end: float) -> None:
    kv = engine_view.frame("engine_kv_usage", start, end)
    if kv.empty:
        st.info("No KV-cache usage in this range.")
    else:
        kv["time"] = pd.to_datetime(kv.ts, unit="s")
        fig = px.line(
            kv,
            x="time",
            y="usage",
            color="instance",
            range_y=[0, 1],
            markers=True,
            title="KV-cache usage",
        )
        charts.span_one_instant(fig, start, end)
        st.plotly_chart(fig, width="stretch")


def _engine_ttft(start: float, end: float) -> None:
    ttft = engine_view.frame("engine_ttft", start, end)
    st.subheader("Time to first token")
    if ttft.empty:
        st.info(
            "No time-to-first-token histogram samples in this range (no requests, or the "
            "engine "
            "does not export `time_to_first_token_seconds`)."
        )
        return
    newest = ttft.sort_values("ts").groupby(["instance", "quantile"])["seconds"].last()
    last = newest.unstack("quantile")
    last.columns = pd.Index([f"P{round(float(q) * 100):d} (s)" for q in last.columns])
    st.dataframe(
        last.reset_index().style.format({str(c): "{:.3f}" for c in last.columns}),
        hide_index=True,
        width="stretch",
    )
    ttft["time"] = pd.to_datetime(ttft.ts, unit="s")
    q = (ttft["quantile"] * 100).round().astype(int).astype(str)
    ttft["series"] = ttft.instance + " P" + q
    fig = px.line(
        ttft,
        x="time",
        y="seconds",
        color="series",
        markers=True,
        title="TTFT P50 / P95 / P99",
    )
    charts.span_one_instant(fig, start, end)
    st.plotly_chart(fig, width="stretch")
