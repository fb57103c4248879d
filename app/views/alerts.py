"""Alerts: the alert conditions, evaluated over the store (embedded mode)."""

from __future__ import annotations

import json
import os
import urllib.request

import streamlit as st

from warmscope.app import engine_view, ui

st.title("Alerts")
am = os.environ.get("WARMSCOPE_ALERTMANAGER_URL", "")
if am:
    try:
        with urllib.request.urlopen(f"{am.rstrip('/')}/api/v2/alerts?active=true", timeout=5) as r:
            active = json.loads(r.read())
        st.subheader(f"Firing in Alertmanager ({am})")
        if not active:
            st.success("Alertmanager has no active alerts.")
        for a in active:
            lab, ann = a.get("labels", {}), a.get("annotations", {})
            ui.alert_row(lab.get("severity", "warning"), lab.get("alertname", "?"), ann.get("summary", ""))
    except (OSError, ValueError) as e:
        st.warning(f"Alertmanager at {am} could not be read ({e}); showing the conditions evaluated here instead.")
start, end = ui.time_range()
if engine_view.active(start, end):  # engine metrics only
    engine_view.alerts()
st.caption("The conditions of the Prometheus alerting rules (same thresholds), evaluated by the analysis over the "
           "selected range: hit-rate regressions and trap checks compare its latest third with the third before it; "
           "cross-tenant reads, bypass spikes and warm-set precision cover the whole range.")
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
