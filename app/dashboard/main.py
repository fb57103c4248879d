"""warmscope dashboard entry point: `streamlit run app/dashboard/main.py` (or `warmscope dashboard`)."""

from __future__ import annotations

from pathlib import Path

import streamlit as st
from warmscope.app.dashboard import data, ui

# Material icons ship with Streamlit's own font: no emoji font needed on the viewer's machine.
st.set_page_config(page_title="warmscope", page_icon=":material/local_fire_department:", layout="wide")
ui.apply_deferred()
PAGES = Path(__file__).with_name("views")  # not "pages/": that name turns on Streamlit's folder navigation
nav = st.navigation([
    st.Page(str(PAGES / "overview.py"), title="Overview", icon=":material/dashboard:", default=True),
    st.Page(str(PAGES / "hitrate.py"), title="Hit rate explorer", icon=":material/target:"),
    st.Page(str(PAGES / "latency.py"), title="Latency", icon=":material/speed:"),
    st.Page(str(PAGES / "warmup.py"), title="Warm-up runs", icon=":material/whatshot:"),
    st.Page(str(PAGES / "advisor.py"), title="Advisor", icon=":material/explore:", url_path="advisor"),
    st.Page(str(PAGES / "hotkeys.py"), title="Hot keys", icon=":material/key:"),
    st.Page(str(PAGES / "misses.py"), title="Why misses", icon=":material/help_center:"),
    st.Page(str(PAGES / "rootcause.py"), title="Root cause", icon=":material/troubleshoot:"),
    st.Page(str(PAGES / "ab.py"), title="A/B", icon=":material/science:"),
    st.Page(str(PAGES / "alerts.py"), title="Alerts", icon=":material/notifications_active:"),
])


@st.fragment(run_every=5)
def _watch() -> None:
    try:
        b = data.time_bounds()
    except data.SourceError:
        return
    last = b[1] if b else None
    if st.session_state.get("_last_ts") not in (None, last):
        st.session_state["_last_ts"] = last
        st.rerun(scope="app")
    st.session_state["_last_ts"] = last


_problem = data.config_problem()
if _problem:  # one clear message instead of a traceback on every page
    st.error(_problem)
    st.stop()
with st.sidebar:
    st.caption(f"Source: {data.source_label()}")
    ui.sidebar_range()
    live = st.toggle("Live (refresh when new data lands)", key="live")
if live:
    with st.sidebar:
        _watch()
try:
    with ui.foreground():  # the background warm-up of the caches waits while a page runs: it would slow it
        nav.run()
finally:  # after the page, so that it does not delay the page's first paint
    ui.prewarm()
