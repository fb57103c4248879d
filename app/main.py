"""warmscope dashboard entry point: `streamlit run app/main.py` (or `warmscope dashboard`)."""

from __future__ import annotations

import sys
from pathlib import Path

import streamlit as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from app import data  # noqa: E402

st.set_page_config(page_title="warmscope", layout="wide")
PAGES = Path(__file__).with_name("pages")
nav = st.navigation([
    st.Page(str(PAGES / "overview.py"), title="Overview", default=True),
])
with st.sidebar:
    st.caption(f"Source: {data.source_label()}")
nav.run()
