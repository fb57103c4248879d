"""Hot keys per tenant × layer (hashed), and warmed keys nobody read."""

from __future__ import annotations

import streamlit as st
from warmscope.analysis.coverage import read_in_time
from warmscope.app.dashboard import engine_view, state


def render() -> None:
    start, end = state.time_range()
    if engine_view.only_engines(start, end):  # no collector records anywhere
        engine_view.needs_collectors("Hot keys and warmed-but-unread keys")
    fr = state.load(["hot_keys", "warmed_keys"], start - 3600, end)
    hk = fr["hot_keys"]
    if hk.empty:
        st.info("No hot keys recorded in this range (they are flushed every few minutes).")
        st.stop()
    st.caption(
        "Keys are shown as keyed hashes: the raw key never leaves the serving process. Counts come "
        "from a Space-Saving sketch: true count between hits + misses and hits + misses + err."
    )
    c1, c2 = st.columns(2)
    tenants = sorted(hk.tenant.unique())
    state.init_from_url("hk-tenant", "tenant")
    if st.session_state.get("hk-tenant") not in tenants:
        st.session_state["hk-tenant"] = tenants[0]
    tenant = c1.selectbox("Tenant", tenants, key="hk-tenant")
    layers = sorted(hk[hk.tenant == tenant].layer.unique())
    state.init_from_url("hk-layer", "layer")
    if st.session_state.get("hk-layer") not in layers:
        st.session_state["hk-layer"] = layers[0]
    layer = c2.selectbox("Layer", layers, key="hk-layer")
    state.url_set(tenant=tenant, layer=layer)
    sel = hk[(hk.tenant == tenant) & (hk.layer == layer)]
    agg = sel.groupby(["key_hash", "family"], as_index=False)[["hits", "misses", "err"]].sum()
    agg["lookups"] = agg.hits + agg.misses
    agg["hit_rate"] = 100 * agg.hits / agg.lookups  # shown in percent, one decimal
    warmed = set(fr["warmed_keys"].key_hash) if len(fr["warmed_keys"]) else set()
    agg["warmed"] = agg.key_hash.isin(warmed)
    st.subheader(f"Top keys · {tenant} · {layer}")
    top = agg.sort_values("lookups", ascending=False).head(50)
    st.dataframe(
        top[["key_hash", "family", "lookups", "hits", "misses", "err", "hit_rate", "warmed"]],
        hide_index=True,
        width="stretch",
        column_config={
            "key_hash": st.column_config.TextColumn("Key (keyed hash)"),
            "family": st.column_config.TextColumn("Key family"),
            "lookups": st.column_config.NumberColumn("Lookups", format="localized"),
            "hits": st.column_config.NumberColumn("Hits", format="localized"),
            "misses": st.column_config.NumberColumn("Misses", format="localized"),
            "err": st.column_config.NumberColumn("Count error ±", format="localized"),
            "hit_rate": st.column_config.NumberColumn("Hit rate", format="%.1f%%"),
            "warmed": st.column_config.CheckboxColumn("Warmed in range"),
        },
    )
    wk = fr["warmed_keys"]
    st.subheader("Warmed but never read")
    if wk.empty:
        st.info("No warm-up runs wrote keys in this range.")
    else:
        unread = wk[~read_in_time(wk)]
        st.caption(
            f"{len(unread):,} of {len(wk):,} warmed keys ({len(unread) / len(wk):.0%}) were "
            "never read "
            f"while warm: {unread.gpu_s.sum():,.2f} GPU-seconds of warm-up spent for nothing."
        )
        st.dataframe(
            unread.groupby(["layer", "family"], as_index=False)
            .agg(keys=("key_hash", "size"), gpu_s=("gpu_s", "sum"))
            .sort_values("keys", ascending=False),
            hide_index=True,
            width="stretch",
            column_config={
                "layer": "Layer",
                "family": "Key family",
                "keys": st.column_config.NumberColumn("Keys never read", format="localized"),
                "gpu_s": st.column_config.NumberColumn("GPU-s wasted", format="%.2f"),
            },
        )
