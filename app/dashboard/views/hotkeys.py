"""Hot keys per tenant × layer (hashed), and warmed keys nobody read: the range's total (the
Warm-up runs page's figures) and the picked tenant × layer's part."""

from __future__ import annotations

import pandas as pd
import streamlit as st
from warmscope.analysis.coverage import read_in_time
from warmscope.app.dashboard import engine_view, state
from warmscope.app.dashboard.views.warmup import spend_metrics

MISSES_HELP = (
    "Summed over every replica (each has its own cache) and every hot-key window in the range. "
    "A hot key misses only when its entry is gone: about once per replica after a restart that "
    "no warm-up followed, an eviction or a TTL expiry, whatever its traffic. So the top keys "
    "share one count: e.g. two replicas without warm-up restarting every hour give two misses "
    "per key an hour, 12 to 14 over 6 h."
)


def render() -> None:
    start, end = state.time_range()
    if engine_view.only_engines(start, end):  # no collector records anywhere
        engine_view.needs_collectors("Hot keys and warmed-but-unread keys")
    hk = state.load(["hot_keys"], start - 3600, end)["hot_keys"]
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
    wk = state.load(["warmed_keys"], start, end)["warmed_keys"]
    warmed = set(wk["key_hash"]) if len(wk) else set()
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
            "misses": st.column_config.NumberColumn(
                "Misses",
                format="localized",
                help=MISSES_HELP,
            ),
            "err": st.column_config.NumberColumn(
                "Count error ±",
                format="localized",
                help="the hot-key sketch's bound: the key's true lookups are within ± this of the "
                "count shown",
            ),
            "hit_rate": st.column_config.NumberColumn("Hit rate", format="%.1f%%"),
            "warmed": st.column_config.CheckboxColumn("Warmed in range"),
        },
    )
    st.caption(_misses_sentence(sel, top))
    _unread(wk, tenant, layer, start, end)


def _misses_sentence(sel: pd.DataFrame, top: pd.DataFrame) -> str:
    """The top keys' misses per hot-key window: near one value whatever their lookups, as misses
    come with restarts, evictions and expiries rather than with traffic."""
    shown = sel[sel.key_hash.isin(top.key_hash)]
    per = shown.groupby("key_hash").agg(misses=("misses", "sum"), windows=("window", "nunique"))
    rate = per.misses / per.windows
    starts = sorted(sel.window.unique())
    span = min(b - a for a, b in zip(starts, starts[1:], strict=False)) if len(starts) > 1 else 0
    unit = f"{span / 3600:g} h " if span else ""
    many = per[per.windows > 1]  # keys hot in several windows: the steadier figure
    steady = (
        f"; the {len(many)} hot in more than one window, a median "
        f"{(many.misses / many.windows).median():.1f}"
        if 0 < len(many) < len(per)
        else ""
    )
    return (
        f"The {len(top)} top keys miss a median {rate.median():.1f} times per {unit}hot-key "
        f"window in which they were counted (from {rate.min():.1f} to {rate.max():.1f}{steady}) "
        "while their lookups run from "
        f"{top.lookups.min():,.0f} to {top.lookups.max():,.0f}: a hot key misses when a replica "
        "lost it (restart without warm-up, eviction, TTL expiry), not in step with its traffic."
    )


def _unread(wk: pd.DataFrame, tenant: str, layer: str, start: float, end: float) -> None:
    """Warmed keys never read while warm: the range's totals over every tenant and layer (the
    Warm-up runs page's), then the picked tenant × layer's part and its key families."""
    st.subheader("Warmed but never read")
    spend_metrics(start, end)
    if wk.empty:
        st.info("No warm-up runs wrote keys in this range.")
        return
    mine = wk[(wk["tenant"] == tenant) & (wk["layer"] == layer)]
    unread = mine[~read_in_time(mine)] if len(mine) else mine
    if mine.empty:
        st.caption(f"No warm-up run warmed {layer} keys of {tenant} in this range.")
        return
    st.caption(
        f"{tenant} · {layer}: {len(unread):,} of {len(mine):,} warmed keys "
        f"({len(unread) / len(mine):.0%}) were never read while warm, "
        f"{unread['gpu_s'].sum():,.2f} GPU-s of warm-up spent for nothing."
    )
    st.dataframe(
        unread.groupby("family", as_index=False)
        .agg(keys=("key_hash", "size"), gpu_s=("gpu_s", "sum"))
        .sort_values("keys", ascending=False),
        hide_index=True,
        width="stretch",
        column_config={
            "family": "Key family",
            "keys": st.column_config.NumberColumn("Keys never read", format="localized"),
            "gpu_s": st.column_config.NumberColumn("GPU-s wasted", format="%.2f"),
        },
    )
