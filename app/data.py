"""Cached loaders over the active source: the only place pages get data from.

Today the source is the embedded store named by ``WARMSCOPE_STORE`` (default
``var/warmscope.sqlite``). Loaders return canonical frames or raise
:class:`SourceError` with a message a page can show as is.
"""

from __future__ import annotations

import os

import pandas as pd
import streamlit as st

from collectors.config import CollectorConfig
from collectors.store import EmbeddedStore, StoreError

__all__ = ["SourceError", "store_path", "frame", "source_label"]


class SourceError(RuntimeError):
    pass


def store_path() -> str:
    return os.environ.get("WARMSCOPE_STORE") or str(CollectorConfig.load().resolved_store_path())


def source_label() -> str:
    return f"embedded store · {store_path()}"


def frame(name: str) -> pd.DataFrame:
    return _frame(store_path(), name)


@st.cache_data(ttl=30, show_spinner=False)
def _frame(path: str, name: str) -> pd.DataFrame:  # the path is part of the cache key
    try:
        return EmbeddedStore(path, readonly=True).frame(name)
    except StoreError as e:
        raise SourceError(str(e)) from None
