"""Why misses: prefix-KV missed tokens by why they missed (elsewhere, evicted, isolated,
drifted, cold, partial), over time and per tenant, engine and key family; the
warm-up-addressable share beside what warm-up prevented; warmed keys lost before their first
reader; engine block rates per salt."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import streamlit as st
from warmscope.app.dashboard import cached, charts, fmt, state

# One colour per class, the same on every chart of the page.
COLOURS = {
    "elsewhere": "#8250df",
    "evicted": "#cf222e",
    "isolated": "#bf8700",
    "drifted": "#0969da",
    "cold": "#57606a",
    "partial": "#afb8c1",
    "unknown": "#e6e6e6",
}
MEANING = {
    "elsewhere": "held by another replica (routing)",
    "evicted": "stored before, held by none now (capacity)",
    "isolated": "held only under another tenant's scope",
    "drifted": "a few changed tokens changed the key (e.g. a timestamp)",
    "cold": "new content, never stored",
    "partial": "the tail no cache can serve (last partial block)",
    "unknown": "the engine's events for these blocks never arrived",
}


def render() -> None:
    start, end = state.time_range()
    mt = cached.miss_tables(start, end)
    state.resolution_note(start, end)

    if mt.tokens <= 0:
        st.info(
            "No missed-token classes in this range: they come from the simulator (`warmscope "
            "demo`) "
            "or from a classifier that calls `Telemetry.record_misses`; nothing has recorded any "
            "yet."
        )
    else:
        _classes(mt, start, end)
    _lost(mt.lost)
    if len(mt.blocks):
        _kv_blocks(mt.blocks)


def _classes(mt: cached.MissTables, start: float, end: float) -> None:
    """Missed tokens by class: the totals, over time, the table, warm-up addressable against
    prevented, and per tenant, engine and key family."""
    table = mt.classes
    total = float(table["tokens"].sum())
    top = table.sort_values("tokens", ascending=False).iloc[0]
    addr = mt.addressable
    c1, c2, c3 = st.columns(3)
    c1.metric(
        "Missed prompt tokens",
        fmt.integer(total),
        help="prompt − cached tokens of every classified request in the range; the classes add "
        "up to it",
    )
    c2.metric(
        "Largest class",
        f"{top.miss_class} · {fmt.pct(top.share)}",
        help=MEANING[str(top.miss_class)],
    )
    c3.metric(
        "Warm-up-addressable",
        fmt.pct(addr["share"]),
        help="cold + evicted tokens of the (tenant, key family) pairs that a warm-up run in "
        "the "
        "range warmed, over all missed tokens",
    )

    st.subheader("Missed tokens by class over time")
    freq = cached.miss_freq(start, end)
    ot = mt.over_time
    ot = ot[
        ot["miss_class"].isin(table.loc[table["tokens"] > 0, "miss_class"])
    ]  # no flat zero band
    ot["time"] = pd.to_datetime(ot["ts"], unit="s")
    # per minute over the part of each bucket the data covers: the range's first and last
    # buckets are cut by its edges and would read as drops as counts
    fig = px.area(
        ot,
        x="time",
        y="per_min",
        color="miss_class",
        color_discrete_map=COLOURS,
        category_orders={"miss_class": list(COLOURS)},
        labels={
            "per_min": f"missed tokens per minute ({freq / 60:.0f}-min buckets)",
            "time": "",
            "miss_class": "class",
        },
    )
    fig.update_traces(line=dict(width=0.5))
    fig.update_layout(height=340, margin=dict(l=10, r=10, t=10, b=10), legend_title_text="")
    charts.annotate(fig, start, end)
    st.plotly_chart(fig, width="stretch")

    shown = table.assign(meaning=table["miss_class"].map(MEANING), share=100 * table["share"])
    st.dataframe(
        shown[["miss_class", "meaning", "tokens", "requests", "share"]],
        hide_index=True,
        width="stretch",
        column_config={
            "miss_class": st.column_config.TextColumn("Class"),
            "meaning": st.column_config.TextColumn("Why the tokens missed"),
            "tokens": st.column_config.NumberColumn("Missed tokens", format="localized"),
            "requests": st.column_config.NumberColumn(
                "Requests", format="localized", help="requests with tokens in this class"
            ),
            "share": st.column_config.NumberColumn("Share", format="%.1f%%"),
        },
    )

    st.subheader("Warm-up: addressable vs prevented")
    a1, a2, a3 = st.columns(3)
    a1.metric(
        "Addressable tokens",
        fmt.integer(addr["addressable"]),
        help=f"{fmt.integer(addr['cold_evicted'])} cold + evicted tokens in all; "
        f"{int(addr['families'])} warmed (tenant, family) pairs",
    )
    a2.metric("Warmed prefix_kv keys", fmt.integer(addr["warmed_keys"]))
    a3.metric(
        "Hits on warmed keys",
        fmt.integer(addr["warm_hits"]),
        help="what warm-up prevented: reads of prefix_kv keys while they held what a run "
        "warmed "
        "(in the layer's lookup unit: blocks in the simulator, tokens for an engine client)",
    )
    if not addr["warmed_keys"]:
        st.caption(
            "No warm-up run warmed prefix_kv keys in this range, so no missed token is "
            "addressable by the families warm-up targets."
        )
    else:
        st.caption(
            f"Addressable: {fmt.pct(addr['share'])} of missed tokens are cold or evicted in "
            "families that warm-up already targets — warming them at the right time would have "
            "prevented them."
        )

    st.subheader("Per tenant, engine and key family")
    tabs = st.tabs(["Tenant", "Engine", "Key family"])
    for tab, dim in zip(tabs, ("tenant", "engine", "family"), strict=True):
        t = mt.by[dim]
        t[["evicted_share", "addressable_share"]] *= 100  # shown in percent, one decimal
        cfg = {
            c: st.column_config.NumberColumn(c, format="localized")
            for c in t.columns
            if c not in (dim, "evicted_share", "addressable_share")
        }
        cfg[dim] = st.column_config.TextColumn({"family": "Key family"}.get(dim, dim.capitalize()))
        cfg["total"] = st.column_config.NumberColumn("Total", format="localized")
        cfg["evicted_share"] = st.column_config.NumberColumn("Evicted share", format="%.1f%%")
        cfg["addressable_share"] = st.column_config.NumberColumn("Cold + evicted", format="%.1f%%")
        tab.dataframe(t, hide_index=True, width="stretch", column_config=cfg)


def _lost(lost: pd.DataFrame) -> None:
    st.subheader("Warmed keys lost before their first reader")
    if lost.empty:
        st.info("No warm-up run warmed prefix_kv keys in this range.")
    else:
        n_keys, n_lost = int(lost["keys"].sum()), int(lost["lost"].sum())
        st.caption(
            f"{n_lost:,} of {n_keys:,} warmed prefix_kv keys ({fmt.pct(n_lost / n_keys)}) were "
            "evicted or expired before anyone read them: their first read after warming missed. "
            "The time is from warming to that first miss (the key was gone by then). A run id "
            "pasted in *Find a run id* on the Warm-up runs page opens its warm-up."
        )

        def _secs(x: float) -> str:
            return "–" if x != x else f"{x:,.0f} s"

        if len(lost) > 10:
            st.caption(
                f"The 10 of {len(lost)} runs that lost the largest share of their warmed keys:"
            )
            lost = lost.head(10)
        shown_lost = lost.assign(
            median=lost["median_s"].map(_secs),
            latest=lost["max_s"].map(_secs),
            lost_share=100 * lost["lost_share"],
        )
        st.dataframe(
            shown_lost[["run_id", "keys", "lost", "lost_share", "median", "latest"]],
            hide_index=True,
            width="stretch",
            column_config={
                "run_id": st.column_config.TextColumn(
                    "Run",
                    help="the warm-up run's id (its prefix_kv layer's run): paste it in "
                    "*Find a run id* on the Warm-up runs page to open that warm-up",
                ),
                "keys": st.column_config.NumberColumn("Keys warmed", format="localized"),
                "lost": st.column_config.NumberColumn("Lost before read", format="localized"),
                "lost_share": st.column_config.NumberColumn("Share", format="%.1f%%"),
                "median": st.column_config.TextColumn("Median time to loss"),
                "latest": st.column_config.TextColumn("Latest loss"),
            },
        )


def _kv_blocks(kvb: pd.DataFrame) -> None:
    st.subheader("Engine KV blocks per salt")
    st.caption(
        "From `Telemetry.record_kv_stats`: blocks stored, reused and evicted per second over "
        "the range, and the blocks resident at its end. Salts are hashed."
    )
    rates = kvb
    rates["reuse_ratio"] = rates["reuse_ratio"].map(
        fmt.pct
    )  # "–" when nothing was stored or reused
    st.dataframe(
        rates,
        hide_index=True,
        width="stretch",
        column_config={
            "engine": st.column_config.TextColumn("Engine"),
            "salt": st.column_config.TextColumn("Salt (hashed)"),
            "stored_per_s": st.column_config.NumberColumn("Stored / s", format="%.2f"),
            "reused_per_s": st.column_config.NumberColumn("Reused / s", format="%.2f"),
            "evicted_per_s": st.column_config.NumberColumn("Evicted / s", format="%.2f"),
            "reuse_ratio": st.column_config.TextColumn("Reuse ratio"),
            "resident": st.column_config.NumberColumn("Resident blocks", format="localized"),
        },
    )
