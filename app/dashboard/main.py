"""warmscope dashboard entry point: `streamlit run app/dashboard/main.py` (or `warmscope
dashboard`)."""

from __future__ import annotations

import streamlit as st
from warmscope.app.dashboard import data, prewarm, state
from warmscope.app.dashboard.pages import PAGES

# Material icons ship with Streamlit's own font: no emoji font needed on the viewer's machine.
st.set_page_config(
    page_title="warmscope", page_icon=":material/local_fire_department:", layout="wide"
)
state.apply_deferred()
nav = st.navigation(
    [  # every page of pages.PAGES, in its order
        st.Page(
            str(p.file), title=p.title, icon=p.icon, default=p.default, url_path=p.url_path or None
        )
        for p in PAGES
    ]
)


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
    state.sidebar_range()
    live = st.toggle("Live (refresh when new data lands)", key="live")
if live:
    with st.sidebar:
        _watch()
try:
    with (
        prewarm.foreground()
    ):  # the background warm-up of the caches waits while a page runs: it would slow it
        nav.run()
finally:  # after the page, so that it does not delay the page's first paint
    prewarm.prewarm()
