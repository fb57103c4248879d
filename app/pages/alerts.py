"""Alerts: the alert conditions, evaluated over the store (embedded mode)."""

from __future__ import annotations

import streamlit as st

from analysis.alerts import evaluate
from app import ui

st.title("Alerts")
start, end = ui.time_range()
fr = ui.load(["lookups", "writes", "hot_keys", "warmup_runs", "warmed_keys", "early_keys"], start, end)
st.caption("Embedded mode: the conditions of the Prometheus alerting rules, evaluated by the analysis over the "
           "selected range (the latest third against the third before it).")
alerts = evaluate(fr, start, end)
if alerts.empty:
    st.success("No alert conditions hold in this range.")
    st.stop()
c = st.columns(3)
for i, sev in enumerate(("critical", "warning", "info")):
    c[i].metric(sev.capitalize(), int((alerts.severity == sev).sum()))
for r in alerts.itertuples():
    icon = "🔴" if r.severity == "critical" else "🟠"
    st.warning(f"{icon} **{r.alert}** ({r.severity}) · {r.summary} · since {ui.when(r.since)}")
