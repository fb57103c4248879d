"""Overview: hit rate by cache layer over time."""

from __future__ import annotations

import plotly.express as px
import streamlit as st

from app import data

st.title("Cache warm-up overview")
try:
    lookups = data.frame("lookups")
except data.SourceError as e:
    st.error(f"{e}")
    st.stop()
if lookups.empty:
    st.info("No lookups recorded yet. Run `warmscope demo` for demo data, or instrument a cache with "
            "`collectors.InstrumentedCache` and let it flush.")
    st.stop()

hm = lookups[lookups.result.isin(["hit", "miss"])]
by_layer = hm.pivot_table(index="layer", columns="result", values="count", aggfunc="sum", fill_value=0)
by_layer["hit_rate"] = by_layer["hit"] / (by_layer["hit"] + by_layer["miss"])
total = hm["count"].sum()
hits = hm.loc[hm.result == "hit", "count"].sum()
cols = st.columns(3)
cols[0].metric("Lookups", f"{total:,}")
cols[1].metric("Hit rate", f"{hits / total:.1%}" if total else "no data")
cols[2].metric("Layers", len(by_layer))

hm = hm.assign(minute=(hm.ts // 600) * 600)
ts = hm.pivot_table(index=["minute", "layer"], columns="result", values="count", aggfunc="sum",
                    fill_value=0).reset_index()
ts["hit_rate"] = ts["hit"] / (ts["hit"] + ts["miss"])
ts["time"] = ts["minute"].astype("datetime64[s]")
st.plotly_chart(px.line(ts, x="time", y="hit_rate", color="layer", title="Hit rate by layer (10-min buckets)",
                        range_y=[0, 1]), use_container_width=True)
st.dataframe(by_layer.style.format({"hit_rate": "{:.1%}"}), use_container_width=True)
