"""Hot keys per tenant × layer (hashed), and warmed keys nobody read."""

from __future__ import annotations

import streamlit as st

from warmscope.analysis.coverage import read_in_time
from warmscope.app import engine_view, ui

st.title("Hot keys")
start, end = ui.time_range()
if engine_view.only_engines(start, end):  # no collector records anywhere
    engine_view.needs_collectors("Hot keys and warmed-but-unread keys")
fr = ui.load(["hot_keys", "warmed_keys"], start - 3600, end)
hk = fr["hot_keys"]
if hk.empty:
    st.info("No hot keys recorded in this range (they are flushed every few minutes).")
    st.stop()
st.caption("Keys are shown as keyed hashes: the raw key never leaves the serving process. Counts come from a "
           "Space-Saving sketch: true count between hits + misses and hits + misses + err.")
c1, c2 = st.columns(2)
tenant = c1.selectbox("Tenant", sorted(hk.tenant.unique()), key="hk-tenant")
layer = c2.selectbox("Layer", sorted(hk[hk.tenant == tenant].layer.unique()), key="hk-layer")
sel = hk[(hk.tenant == tenant) & (hk.layer == layer)]
agg = sel.groupby(["key_hash", "family"], as_index=False)[["hits", "misses", "err"]].sum()
agg["lookups"] = agg.hits + agg.misses
agg["hit_rate"] = agg.hits / agg.lookups
warmed = set(fr["warmed_keys"].key_hash) if len(fr["warmed_keys"]) else set()
agg["warmed"] = agg.key_hash.isin(warmed)
st.subheader(f"Top keys · {tenant} · {layer}")
st.dataframe(agg.sort_values("lookups", ascending=False).head(50).style.format({"hit_rate": "{:.1%}"}),
             hide_index=True, width="stretch")
wk = fr["warmed_keys"]
st.subheader("Warmed but never read")
if wk.empty:
    st.info("No warm-up runs wrote keys in this range.")
else:
    unread = wk[~read_in_time(wk)]
    st.caption(f"{len(unread):,} of {len(wk):,} warmed keys ({len(unread) / len(wk):.0%}) were never read while "
               f"warm: {unread.gpu_s.sum():.2f} GPU-seconds of warm-up spent for nothing.")
    st.dataframe(unread.groupby(["layer", "family"], as_index=False).agg(keys=("key_hash", "size"),
                                                                          gpu_s=("gpu_s", "sum"))
                 .sort_values("keys", ascending=False), hide_index=True, width="stretch")
