"""Alerts: the alert conditions holding now, evaluated over the store (embedded mode), and their
history — when each fired and resolved over the range."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from warmscope.app.dashboard import cached, charts, data, engine_view, fmt, state


def _alertmanager() -> None:
    """The alerts firing in the configured Alertmanager, if one is."""
    if not data.alertmanager_url():
        return
    try:
        active = data.external_alerts("alertmanager")
        st.subheader(f"Firing in Alertmanager ({data.alertmanager_url()})")
        if active.empty:
            st.success("Alertmanager has no active alerts.")
        for a in active.to_dict("records"):
            fmt.alert_row(str(a["severity"] or "warning"), str(a["alertname"]), str(a["summary"]))
    except data.SourceError as e:
        st.warning(f"{e}; showing the conditions evaluated here instead.")


@st.fragment(run_every=2)
def _wait_for_history(start: float, end: float) -> None:
    if cached.alert_history(start, end) is not None:
        st.rerun(scope="app")


def _history(start: float, end: float) -> None:
    """When each alert fired and resolved: a timeline and a table."""
    st.subheader("Alert history")
    every = cached.history_every(start, end)
    hist = cached.alert_history(start, end)
    if hist is None:
        st.info(
            f"Re-evaluating the alert conditions every {every / 60:g} minutes over the range… "
            "the history appears here when it is done.",
            icon=":material/hourglass_top:",
        )
        _wait_for_history(start, end)
        return
    st.caption(
        f"The conditions re-evaluated every {every / 60:g} minutes, each time over the hour "
        "before (as an alerting rule with a one-hour range would be): an alert fired at the first "
        "evaluation where it held and resolved at the first one where it no longer did."
    )
    if hist.empty:
        st.success("No alert fired in this range.")
        return
    st.plotly_chart(_timeline(hist, start, end), width="stretch")
    _history_table(hist, end)


def _timeline(hist: pd.DataFrame, start: float, end: float) -> go.Figure:
    """One row per alert (its subjects, layers or runs, share it; the hover names them), a bar
    per episode in its severity's colour (security findings red)."""
    hist = hist.assign(name=hist.alert)
    order = list(dict.fromkeys(hist.sort_values("fired").name))
    fig = go.Figure()
    for sev in ("critical", "warning", "info"):
        for security in (True, False):
            g = hist[(hist.severity == sev) & (hist.alert.map(fmt.is_security) == security)]
            if g.empty:
                continue
            kind = "security" if security else sev
            x0 = pd.to_datetime(g.fired, unit="s")
            x1 = pd.to_datetime(g.resolved.fillna(end), unit="s")
            fig.add_trace(
                go.Bar(
                    base=x0,
                    x=(x1 - x0).dt.total_seconds() * 1000,
                    y=g.name,
                    orientation="h",
                    marker_color=fmt.STATUS[kind][1],
                    name=fmt.STATUS[kind][0].lower(),
                    opacity=0.8,
                    customdata=list(
                        zip(
                            g.fired.map(fmt.when),
                            g.resolved.map(lambda r: "still firing" if r != r else fmt.when(r)),
                            g.summary,
                            g.subject.replace("", "–"),
                            strict=True,
                        )
                    ),
                    hovertemplate=(
                        "%{customdata[3]}: fired %{customdata[0]} · resolved "
                        "%{customdata[1]}<br>"
                        "%{customdata[2]}<extra>%{y}</extra>"
                    ),
                )
            )
    fig.update_layout(
        barmode="overlay",
        height=140 + 30 * len(order),
        xaxis=dict(
            type="date",
            title="time (UTC)",
            range=[pd.Timestamp(start, unit="s"), pd.Timestamp(end, unit="s")],
        ),
        yaxis=dict(categoryorder="array", categoryarray=order[::-1], title=""),
        legend_title_text="severity",
        margin=dict(t=30, b=40),
        title="When each alert was firing",
    )
    charts.annotate(fig, start, end)
    return fig


HISTORY_ROWS = 12  # episodes shown before the history table scrolls in its own box
HISTORY_HEIGHT = 560  # px
# Column widths (the rest to the summary): dates and durations on one or two lines, the summary
# wide enough to read in a few lines at 1,400 px.
HISTORY_WIDTHS = {
    "Alert": "14%",
    "Subject": "12%",
    "Severity": "7%",
    "Began (UTC)": "8%",
    "Fired (UTC)": "8%",
    "Resolved (UTC)": "8%",
    "Lasted": "6%",
}


def _history_table(hist: pd.DataFrame, end: float) -> None:
    def lasted(fired: float, resolved: float) -> str:
        s = (resolved if resolved == resolved else end) - fired
        text = f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.0f} min"
        return text + ("+" if resolved != resolved else "")

    table = pd.DataFrame(
        {
            "Alert": hist.alert,
            "Subject": hist.subject.replace("", "–"),
            "Severity": hist.severity.str.upper(),
            "Began (UTC)": hist.since.map(lambda t: fmt.when(t) if t == t else "–"),
            "Fired (UTC)": hist.fired.map(fmt.when),
            "Resolved (UTC)": hist.resolved.map(
                lambda r: "still firing" if r != r else fmt.when(r)
            ),
            "Lasted": [
                lasted(float(f), float(r))
                for f, r in zip(hist["fired"], hist["resolved"], strict=True)
            ],
            "Summary": hist.summary,
        }
    ).iloc[::-1]
    # Drawn wrapped (a data grid cuts a summary at its column's width); a long history scrolls
    # inside a box of its own, so the page below stays in reach.
    box = st.container(height=HISTORY_HEIGHT) if len(table) > HISTORY_ROWS else st.container()
    with box:
        fmt.wrapped_table(
            table.style.format(escape="html").set_table_styles(
                {c: [{"selector": "th", "props": f"width: {w}"}] for c, w in HISTORY_WIDTHS.items()}
            )
        )
    st.caption(
        "Newest first. Began: the first data that shows the condition (the same onset at any "
        "range); fired and resolved: the evaluations, every few minutes, at which it first held "
        "and first no longer did (their spacing grows with the range). “+”: still firing at the "
        "end of the range."
    )


def _holding(alerts: pd.DataFrame) -> None:
    """The conditions holding now: counts by severity, then security findings first, then by
    severity, each in its colour; a long list folds after the first few, so the history below
    stays in reach."""
    c = st.columns(4)
    for i, sev in enumerate(("critical", "warning", "info")):
        c[i].metric(sev.capitalize(), int((alerts.severity == sev).sum()))
    c[3].metric(
        "Security findings",
        int(alerts.alert.map(fmt.is_security).sum()),
        help=(
            "Cross-tenant cache reads: one tenant's request served another tenant's entry (a data "
            "leak)."
        ),
    )
    alerts = alerts.assign(_sec=~alerts.alert.map(fmt.is_security)).sort_values(
        "_sec", kind="stable"
    )
    shown = 6
    fmt.alert_rows(alerts, shown)
    if len(alerts) > shown:
        more = len(alerts) - shown
        with st.expander(f"{more} more alert condition{'s' if more != 1 else ''} holding now"):
            fmt.alert_rows(alerts.iloc[shown:])


def render() -> None:
    _alertmanager()
    start, end = state.time_range()
    if engine_view.active(start, end):  # engine metrics only
        engine_view.alerts()
    st.subheader("Holding now")
    st.caption(
        f"The conditions of the Prometheus alerting rules (same thresholds), evaluated at "
        f"{fmt.hhmm(end)} (the range's end) over the hour before it — the alert history's last "
        "evaluation: this list is the history's still-firing episodes, and the overview counts "
        "it. Hit-rate regressions and trap checks compare the hour's latest third with the third "
        "before it. Each onset (“since”) is the first data that shows the condition."
    )
    alerts = cached.alerts(start, end)
    if alerts.empty:
        st.success("No alert conditions hold in this range.")
    else:
        _holding(alerts)
    _history(start, end)
