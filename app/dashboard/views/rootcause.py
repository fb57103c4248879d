"""Root cause: pick a regression window (detected, chosen by absolute time, or brushed on the
chart), get ranked explanations and trap verdicts. The chosen window lives in the URL.

With engine metrics only, the same chart and ranked explanations localise a change in the
engines' token-weighted prefix-cache hit rate over model × instance × engine
(``cached.engine_causes``); the window is chosen in hours before the end of the range."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from warmscope.analysis.alerts import TRAP_ALERTS
from warmscope.app.dashboard import cached, charts, engine_view, fmt, state

if TYPE_CHECKING:
    from streamlit.elements.plotly_chart import PlotlyState
    from warmscope.analysis.rootcause import Localization
    from warmscope.analysis.traps import TrapVerdict

Window = tuple[float, float]


TRAPS_NEED_COLLECTORS = (
    "Cold-start trap checks (bypass, key explosion, tenant isolation, warm-up timing) read "
    "per-key and per-tenant records: they need the warmscope collectors."
)
RANKED = (
    "Causes are ranked by score, highest first (each cause's share of every leaf's absolute "
    "change, sign ignored): the first row is the top cause."
)
SHARES = (
    "Share of the change explained: each cause's part of the gap between the window's hit rate "
    "and the expected one."
)
NEGATIVE_SHARES = (
    SHARES + " A negative share is a part that moved the other way (its hit rate rose, or its "
    "traffic shifted toward better-hitting keys): it offset that share of the change instead of "
    "causing it."
)
TRAPS_ARE_ALERTS = (
    "The trap checks the alert rules run (Alerts page), over this window against its baseline: "
    "a trap found here is one the alerts can fire. Warm-up timing is judged on warm-ups timed "
    "against traffic; a replica (re)start's warm-up is timed by the restart, and its unread keys "
    "are WarmSetPrecisionLow's."
)


def window_chart(
    start: float,
    end: float,
    t: pd.DataFrame,
    anomaly: Window,
    baseline: Window,
    title: str,
    brush: bool,
) -> PlotlyState | None:
    """The hit rate over time with the anomaly window and its baseline shaded; with ``brush``, a
    box dragged on it chooses the window (the chart's selection event is returned)."""
    fig = go.Figure(
        go.Scatter(
            x=t.bucket.astype("datetime64[s]"),
            y=t.hit_rate,
            mode="lines+markers",
            marker_size=3,
            name="hit rate",
            hovertemplate="%{x|%H:%M} · %{y:.1%}<extra></extra>",
        )
    )
    for (x0, x1), colour, text in (
        (anomaly, "#b35900", "anomaly"),
        (baseline, "grey", "baseline"),
    ):
        fig.add_vrect(
            x0=pd.Timestamp(x0, unit="s"),
            x1=pd.Timestamp(x1, unit="s"),
            fillcolor=colour,
            opacity=0.15,
            line_width=0,
            annotation_text=text,
            annotation_position="bottom left",
        )
    charts.annotate(fig, start, end)
    fig.update_layout(
        title=title,
        yaxis=dict(range=[0, 1.05], tickformat=".0%", title="hit rate"),
        xaxis_title="time (UTC)",
        dragmode="select" if brush else "zoom",
        height=380,
        showlegend=False,
    )
    if not brush:
        st.plotly_chart(fig, width="stretch")
        return None
    return st.plotly_chart(
        fig, width="stretch", on_select="rerun", selection_mode="box", key="rc-brush"
    )


def explanations(loc: Localization, what: str) -> None:
    """The ranked explanations of a localisation: the window's hit rate against the expected
    one, each cause's share of the change, as a table and as bars."""
    st.subheader("Ranked explanations")
    if loc.error:
        st.info(loc.error)
        return
    if not loc.causes:
        st.info(
            "; ".join(loc.notes) or "No significant regression in this window: nothing stands out."
        )
        return
    st.metric(
        f"{what} in the window",
        fmt.pct(loc.observed),
        f"{(loc.observed - loc.expected) * 100:+.1f} pts vs expected",
    )
    df = pd.DataFrame(
        [
            {
                "Cause": " · ".join(f"{k} = {v}" for k, v in c.element.items()),
                "Explains": c.explanatory_power,
                "Score": c.score,
                "Leaves": c.leaves,
            }
            for c in loc.ranked()  # the first row is the top cause
        ]
    )
    st.dataframe(
        df.style.format({"Explains": "{:.0%}", "Score": "{:.2f}", "Leaves": "{:,}"}),
        hide_index=True,
        width="stretch",
        column_config={
            "Explains": st.column_config.NumberColumn(
                "Share of the change explained",
                help="signed: a negative share moved the other way and offset part of the change",
            ),
            "Score": st.column_config.NumberColumn(
                help="the cause's share of every leaf's absolute change (sign ignored): what "
                "ranks the causes, highest first"
            ),
            "Leaves": st.column_config.NumberColumn(
                help="the finest combinations (one value of every dimension) inside the cause"
            ),
        },
    )
    bar = go.Figure(
        go.Bar(
            x=df.Explains,
            y=df.Cause,
            orientation="h",
            hovertemplate="%{y}: %{x:.0%}<extra></extra>",
        )
    )
    bar.update_layout(
        title="Share of the change explained",
        xaxis=dict(tickformat=".0%"),
        yaxis=dict(autorange="reversed", automargin=True),
        # Plotly's default margins (80 px top, 80 bottom) come out of the height: a bar per
        # cause needs its 40 px after them, or the plot area shrinks until one label fits.
        height=180 + 40 * len(df),
    )
    st.plotly_chart(bar, width="stretch")
    st.caption(RANKED + " " + (NEGATIVE_SHARES if (df.Explains < 0).any() else SHARES))
    if loc.notes:  # what the search left out or bounded (e.g. labels the source does not carry)
        st.caption("The search: " + "; ".join(loc.notes) + ".")


def engine_root_cause(start: float, end: float) -> None:
    """Engine metrics only: the window in hours before the end (engine phases are minutes), the
    leaves of model × instance × engine and their localisation; no trap checks."""
    st.info(
        engine_view.COLLECTORS_NOTE
        + " Here the change is localised over model × instance × engine."
    )
    freq = engine_view.bucket(start, end)
    t = cached.rates(start, end, freq=freq, engine=True)
    if t.empty or not t.lookups.sum():
        engine_view.no_engine_data()
    span_h = max((end - start) / 3600, 0.1)
    a0, a1 = st.slider(
        "Anomaly window (hours before the end)",
        0.0,
        span_h,
        (0.0, min(0.25, span_h / 2)),
        step=0.01,
        key="engine-rc-win",
    )
    anomaly = (end - a1 * 3600, end - a0 * 3600)
    baseline = (anomaly[0] - (anomaly[1] - anomaly[0]), anomaly[0])
    title = f"Prefix-cache hit rate, all engines (token-weighted, {freq // 60:g}-minute buckets)"
    window_chart(start, end, t, anomaly, baseline, title, brush=False)
    st.caption(
        f"Anomaly {fmt.when(anomaly[0])} → {fmt.when(anomaly[1])}; baseline "
        f"{fmt.when(baseline[0])} → {fmt.when(baseline[1])} (UTC). Hit rate = cached prompt "
        "tokens / prompt tokens."
    )
    leaves, loc = cached.engine_causes(start, end, anomaly, baseline)
    dims = [d for d in engine_view.DIMS if d in leaves.columns]

    def rate(hits: pd.Series, tokens: pd.Series) -> pd.Series:
        return (hits / tokens.where(tokens > 0)).map(
            lambda x: "no traffic" if x != x else fmt.pct(x)
        )

    # the baseline's rate: the expected hits per prompt token, where the baseline had traffic
    # (volume_exp: its prompt tokens, scaled to the window's length)
    st.dataframe(
        leaves[dims].assign(
            prompt_tokens=leaves.lookups.map("{:,.0f}".format),
            hit_rate=rate(leaves.hits, leaves.lookups),
            baseline=rate(leaves.hits_exp, leaves.lookups_exp.where(leaves.volume_exp > 0, 0)),
        ),
        hide_index=True,
        width="stretch",
    )
    if loc is None:
        st.subheader("Ranked explanations")
        st.info(
            "The anomaly window or the baseline before it holds no engine traffic, so there "
            "is no "
            "change to explain: move the anomaly window (the baseline is the same length just "
            "before it) or widen the time range."
        )
    else:
        explanations(loc, "Prefix-cache hit rate (tokens)")
    st.caption(TRAPS_NEED_COLLECTORS)


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC).replace(tzinfo=None)


def _ts(d: datetime) -> float:
    return pd.Timestamp(d).to_pydatetime().replace(tzinfo=UTC).timestamp()


def render() -> None:
    start, end = state.time_range()
    if engine_view.active(start, end):  # engine metrics only
        engine_root_cause(start, end)
        st.stop()
    state.resolution_note(start, end)
    lo, hi = _dt(start), _dt(end)
    _window_from_url(lo, hi)
    anomaly = _anomaly_window(start, end, lo, hi)
    length = anomaly[1] - anomaly[0]
    baseline = (max(start, anomaly[0] - length), anomaly[0])
    _chart_and_brush(start, end, anomaly, baseline, lo, hi)
    dd = cached.drill(start, end, anomaly, baseline)
    loc = dd.localization
    verdicts = cached.traps(start, end, anomaly, baseline)
    _security_findings(start, end, verdicts)
    explanations(loc, "Hit rate (every layer, weights included)")
    _miss_classes(start, end, anomaly, baseline)
    _traps(verdicts)


def _window_from_url(lo: datetime, hi: datetime) -> None:
    # The window from the URL (a shared link) or a brush on the chart, kept while it fits the range.
    if "rc-win" not in st.session_state:
        w = state.url_get("window") or ""
        try:
            a0, a1 = (datetime.strptime(x, "%Y-%m-%dT%H:%M") for x in w.split("~"))
            if lo <= a0 < a1 <= hi:
                st.session_state["rc-win"] = (a0, a1)
                st.session_state["rc-mode"] = "choose"
        except ValueError:
            pass
    if st.session_state.get("rc-win") and not (
        lo <= st.session_state["rc-win"][0] < st.session_state["rc-win"][1] <= hi
    ):
        st.session_state.pop("rc-win")


def _anomaly_window(start: float, end: float, lo: datetime, hi: datetime) -> Window:
    """The regression window: the detected change point to the range's end, or the one chosen
    (slider, brush or URL); stops the page when no change point can be found."""
    mode = st.radio(
        "Regression window",
        ["detected change point", "choose"],
        horizontal=True,
        key="rc-mode",
        help="'choose': set the window with the slider, or drag a box on the chart.",
    )
    if mode == "choose":
        default = (max(lo, hi - pd.Timedelta(minutes=30)), hi)
        a0, a1 = st.slider(
            "Anomaly window (UTC)",
            min_value=lo,
            max_value=hi,
            value=st.session_state.get("rc-win", default),
            step=pd.Timedelta(minutes=5).to_pytimedelta(),
            format="MM-DD HH:mm",
        )
        st.session_state["rc-win"] = (a0, a1)
        anomaly = (_ts(a0), _ts(a1))
        state.url_set(window=f"{a0:%Y-%m-%dT%H:%M}~{a1:%Y-%m-%dT%H:%M}")
    else:
        state.url_set(window=None)
        cp = cached.change_point(start, end)
        if cp is None:
            st.info(
                "Too little data to find a change point; choose the window, or widen the time "
                "range."
            )
            st.stop()
        anomaly = (cp, end)
    return anomaly


def _chart_and_brush(
    start: float, end: float, anomaly: Window, baseline: Window, lo: datetime, hi: datetime
) -> None:
    """The hit rate with both windows shaded; a box dragged on it becomes the chosen window."""
    freq = max(300, state.step(start, end) or 0)
    t = cached.rates(start, end, freq=freq)  # cached per range
    ev = window_chart(
        start,
        end,
        t,
        anomaly,
        baseline,
        f"Hit rate, every layer with model weights ({freq // 60:g}-minute buckets) · drag a box "
        "to choose the window",
        brush=True,
    )
    box = ev.selection.get("box", []) if ev and ev.selection else []
    if box and box[0].get("x"):
        x0, x1 = sorted(
            pd.Timestamp(x).to_pydatetime().replace(tzinfo=None) for x in box[0]["x"][:2]
        )
        x0, x1 = max(lo, x0), min(hi, x1)
        st.session_state.pop(
            "rc-brush", None
        )  # applied once: picking "detected" later must stay detected
        if x1 > x0:
            st.session_state["rc-win"] = (x0, x1)
            state.defer(**{"rc-mode": "choose"})
        st.rerun()
    st.caption(
        f"Anomaly {fmt.when(anomaly[0])} → {fmt.when(anomaly[1])}; baseline "
        f"{fmt.when(baseline[0])} → "
        f"{fmt.when(baseline[1])} (UTC). Hit rate = hits / (hits + misses) over every layer."
    )


def _security_findings(start: float, end: float, verdicts: list[TrapVerdict]) -> None:
    # Security findings first, in red: a cross-tenant read is a data leak whatever the hit rate
    # does.
    for v in verdicts:
        if v.detected and v.trap == "tenant_isolation":
            said = (
                v.evidence[len("SECURITY:") :].strip()
                if v.evidence.upper().startswith("SECURITY:")
                else v.evidence
            )
            leak = cached.leak(start, end)  # the onset every page shows: the first flush
            began = (
                f"; began {fmt.when(fmt.num(leak['first']))} UTC (the first flush that shows it)"
                if leak is not None
                else ""
            )
            st.error(
                f"**SECURITY · cross-tenant cache read** (confidence {v.confidence:.0%}): "
                f"{said.rstrip('. ')}{began}."
            )


def _miss_classes(start: float, end: float, anomaly: Window, baseline: Window) -> None:
    """Missed prefix-KV tokens by class in the window against the baseline."""
    shift, mdd = cached.miss_shift(start, end, anomaly, baseline)
    if len(shift):
        st.subheader("Why prefix-KV tokens missed")
        st.caption(
            "Missed prompt tokens by class in the window and the baseline (see the Why misses "
            "page): a key drift shows as drifted, a too-small cache as evicted, tenant scoping "
            "as isolated."
        )
        sh = shift.assign(
            share=shift["share"].map(fmt.pct),
            share_base=shift["share_base"].map(fmt.pct),
            change=shift["change"].map(lambda x: "–" if x != x else f"{100 * x:+.1f}"),
        )
        st.dataframe(
            sh,
            hide_index=True,
            width="stretch",
            column_config={
                "miss_class": st.column_config.TextColumn("Class"),
                "tokens": st.column_config.NumberColumn("Tokens in the window", format="localized"),
                "share": st.column_config.TextColumn("Share"),
                "tokens_base": st.column_config.NumberColumn(
                    "Tokens in the baseline", format="localized"
                ),
                "share_base": st.column_config.TextColumn("Baseline share"),
                "change": st.column_config.TextColumn("Change (pts)"),
            },
        )
        if mdd is not None and mdd.localization.causes:
            c = mdd.localization.ranked()[0]
            where = " · ".join(f"{k} = {v}" for k, v in c.element.items())
            st.caption(
                f"Largest change in missed tokens: {where}"
                + f" ({c.change:+,.0f} tokens against the baseline's rate over the window)"
            )


def _traps(verdicts: list[TrapVerdict]) -> None:
    st.subheader("Cold-start traps")
    st.caption(TRAPS_ARE_ALERTS)
    seen = [v for v in verdicts if v.detected and v.trap != "tenant_isolation"]
    if not seen and not any(v.detected for v in verdicts):
        st.success("No cold-start trap detected in this window.")
    elif not seen:
        st.caption("Only the cross-tenant read above was detected.")
    for v in seen:
        alert = TRAP_ALERTS.get(v.trap, ("",))[0]
        named = f"; on the Alerts page: {alert}" if alert else ""
        st.warning(
            f"**{v.trap.replace('_', ' ')}** (confidence {v.confidence:.0%}{named}): {v.evidence}"
        )
    with st.expander("Traps not seen"):
        for v in verdicts:
            if not v.detected:
                st.write(f"**{v.trap.replace('_', ' ')}** — {v.evidence}")
