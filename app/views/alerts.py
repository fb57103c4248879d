"""Alerts: the alert conditions, evaluated over the store (embedded mode)."""

from __future__ import annotations

import streamlit as st

from warmscope.app import data, engine_view, ui

st.title("Alerts")
if data.alertmanager_url():
    try:
        active = data.external_alerts("alertmanager")
        st.subheader(f"Firing in Alertmanager ({data.alertmanager_url()})")
        if active.empty:
            st.success("Alertmanager has no active alerts.")
        for a in active.itertuples():
            ui.alert_row(a.severity or "warning", a.alertname, a.summary)
    except data.SourceError as e:
        st.warning(f"{e}; showing the conditions evaluated here instead.")
start, end = ui.time_range()
if engine_view.active(start, end):  # engine metrics only
    engine_view.alerts()
st.caption("The conditions of the Prometheus alerting rules, evaluated by the analysis over the selected range "
           "(the latest third against the third before it).")
alerts = ui.alerts(start, end)
if alerts.empty:
    st.success("No alert conditions hold in this range.")
    st.stop()
c = st.columns(4)
for i, sev in enumerate(("critical", "warning", "info")):
    c[i].metric(sev.capitalize(), int((alerts.severity == sev).sum()))
c[3].metric("Security findings", int(alerts.alert.map(ui.is_security).sum()),
            help="Cross-tenant cache reads: one tenant's request served another tenant's entry (a data leak).")
# Security findings first, then by severity; each in its colour (red for security and critical).
alerts = alerts.assign(_sec=~alerts.alert.map(ui.is_security)).sort_values("_sec", kind="stable")
for r in alerts.itertuples():
    ui.alert_row(r.severity, r.alert, r.summary, r.since)
