"""warmscope dashboard entry point: `streamlit run app/main.py` (or `warmscope dashboard`)."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from warmscope.app import data, ui

st.set_page_config(page_title="warmscope", page_icon="🔥", layout="wide")
PAGES = Path(__file__).with_name("pages")
nav = st.navigation([
    st.Page(str(PAGES / "overview.py"), title="Overview", icon="🏠", default=True),
    st.Page(str(PAGES / "hitrate.py"), title="Hit rate explorer", icon="🎯"),
    st.Page(str(PAGES / "warmup.py"), title="Warm-up runs", icon="🔥"),
    st.Page(str(PAGES / "advisor.py"), title="Advisor", icon="🧭", url_path="advisor"),
    st.Page(str(PAGES / "hotkeys.py"), title="Hot keys", icon="🔑"),
    st.Page(str(PAGES / "rootcause.py"), title="Root cause", icon="🔍"),
    st.Page(str(PAGES / "ab.py"), title="A/B", icon="🧪"),
    st.Page(str(PAGES / "alerts.py"), title="Alerts", icon="🚨"),
])
with st.sidebar:
    st.caption(f"Source: {data.source_label()}")
    st.selectbox("Time range", list(ui.RANGES), index=1, key="range")
    live = st.toggle("Live (refresh when new data lands)", key="live")


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


if live:
    with st.sidebar:
        _watch()
nav.run()
