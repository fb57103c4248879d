"""What if: the block trace a gateway recorded (or one imported) replayed through an exact model of
vLLM's prefix cache — the miss-ratio curve with today's capacity on it, and the table of fixes
(more capacity, prefix-aware routing, a dropped salt, a stable template, warm-up) with what each
buys and its interval. The method: docs/whatif.md."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from warmscope.analysis.whatif.fixes import isolation_pair
from warmscope.analysis.whatif.report import WhatIf, whatif
from warmscope.app.dashboard import cached, data, fmt, state
from warmscope.model.blocktrace import BlockTrace, TraceError
from warmscope.sources.base import SourceError

CLASS_COLOURS = {
    "elsewhere": "#8250df",
    "evicted": "#cf222e",
    "isolated": "#bf8700",
    "drifted": "#0969da",
    "cold": "#57606a",
    "hit": "#1a7f37",
    "unknown": "#afb8c1",
}


@st.cache_resource(show_spinner=False, max_entries=16)
def _answer(
    path: str,
    start: float | None,
    end: float | None,
    version: Any,
    capacity: int,
    concurrent: bool,
    unsalt: tuple[str, ...],
    points: int,
    tenant: str,
) -> WhatIf:
    tr = cached.block_trace(start, end)
    if tenant:
        tr = tr.subset(np.asarray([tr.tenants[k] == tenant for k in tr.tenant]))
    bar = st.progress(0.0, text="replaying the trace at each capacity…")

    def tick(done: int, total: int) -> None:
        bar.progress(min(1.0, done / max(total, 1)), text=f"replaying: {done} of {total}")

    try:
        return whatif(
            tr,
            capacity,
            "",
            concurrent=concurrent,
            unsalt=unsalt or None,
            vllm_points=points,
            progress=tick,
        )
    finally:
        bar.empty()


def _curve_chart(w: WhatIf, today: int) -> go.Figure:
    c, B = w.lru, w.trace.block_size
    fig = go.Figure()
    fig.add_scatter(
        x=c.capacity * B,
        y=c.hit_rate,
        mode="lines",
        name="block LRU (one pass)",
        line={"color": "#57606a"},
    )
    if w.vllm is not None:
        fig.add_scatter(
            x=w.vllm.capacity * B,
            y=w.vllm.hit_rate,
            mode="lines+markers",
            name="vLLM's policy (exact replay)",
            line={"color": "#0969da"},
        )
    marks = [
        ("half of the max", c.capacity_for(0.5), "#8c959f", "dot", 0.08),
        ("95 % of the max", c.capacity_for(0.95), "#8c959f", "dot", 0.18),
        ("knee", c.knee, "#8c959f", "dash", 0.28),
        (f"today: {today:,} blocks", float(today), "#cf222e", "solid", 0.9),
    ]
    for label, blocks, colour, dash, y in marks:
        if blocks != blocks or blocks <= 0:
            continue
        fig.add_vline(x=blocks * B, line={"color": colour, "dash": dash, "width": 1.5})
        # on a log axis an annotation's x is the value's log10
        fig.add_annotation(
            x=math.log10(blocks * B),
            y=y,
            yref="paper",
            text=label,
            showarrow=False,
            xanchor="left",
            font={"color": colour, "size": 11},
            bgcolor="rgba(255,255,255,0.85)",
        )
    fig.add_hline(
        y=c.max_hit,
        line={"color": "#1a7f37", "dash": "dot"},
        annotation_text=f"infinite cache {c.max_hit:.1%}",
    )
    fig.update_layout(
        height=400,
        margin={"l": 10, "r": 10, "t": 30, "b": 10},
        xaxis={"type": "log", "title": "cache capacity per engine (tokens, log scale)"},
        yaxis={"title": "token hit rate", "tickformat": ".0%", "rangemode": "tozero"},
        legend={"orientation": "h", "y": 1.12},
    )
    return fig


def _gain_chart(w: WhatIf) -> go.Figure:
    rows = [f for f in w.table.fixes if f.available]
    fig = go.Figure()
    fig.add_bar(
        y=[f.name for f in rows],
        x=[f.gained_tokens for f in rows],
        orientation="h",
        marker_color=["#1a7f37" if f.gained_tokens >= 0 else "#cf222e" for f in rows],
        error_x={
            "type": "data",
            "symmetric": False,
            "array": [max(0.0, f.gained_ci[1] - f.gained_tokens) for f in rows],
            "arrayminus": [max(0.0, f.gained_tokens - f.gained_ci[0]) for f in rows],
        },
        hovertemplate="%{y}: %{x:,} tokens<extra></extra>",
    )
    fig.update_layout(
        height=80 + 40 * len(rows),
        margin={"l": 10, "r": 10, "t": 10, "b": 10},
        # two lines: in its half-width column one line was cut ("… 95 % interv")
        xaxis={
            "title": "cached tokens gained<br>(= prefill tokens saved), 95 % interval",
            "automargin": True,
        },
        yaxis={"autorange": "reversed", "automargin": True},
    )
    return fig


def _classes_chart(w: WhatIf) -> go.Figure:
    rows = [f for f in w.table.fixes if f.available and f.by_class]
    fig = go.Figure()
    names = sorted({k for f in rows for k in f.by_class})
    for k in names:
        fig.add_bar(
            y=[f.name for f in rows],
            x=[f.by_class.get(k, 0) for f in rows],
            name=k,
            orientation="h",
            marker_color=CLASS_COLOURS.get(k, "#afb8c1"),
        )
    fig.update_layout(
        barmode="stack",
        height=80 + 40 * len(rows),
        margin={"l": 10, "r": 10, "t": 10, "b": 10},
        xaxis={"title": "tokens gained,<br>by why they missed before", "automargin": True},
        yaxis={"autorange": "reversed", "automargin": True},
        legend={"orientation": "h"},
    )
    return fig


def _table(w: WhatIf) -> pd.DataFrame:
    priced = w.table.cost is not None
    out = []
    for f in w.table.fixes:
        if not f.available:
            continue
        lo, hi = f.gained_ci
        row: dict[str, Any] = {
            "fix": f.name,
            "hit rate": fmt.pct(f.hit_rate),
            "tokens gained (95 % CI)": f"{f.gained_tokens:+,} ({lo:+,.0f} to {hi:+,.0f})",
            "aimed at": f.removes,
        }
        if priced:
            row["GPU-s saved"] = f"{f.gpu_s:+,.2f}"
            row["TTFT saved per request"] = (
                f"{f.ttft_s_per_request * 1e3:+.2f} ms ({f.ttft_ci[0] * 1e3:+.2f} to "
                f"{f.ttft_ci[1] * 1e3:+.2f})"
            )
        out.append(row)
    return pd.DataFrame(out)


def _controls(tr: BlockTrace) -> tuple[str, int, bool, tuple[str, ...]]:
    """The pickers: (tenant or "" for the pool, capacity in blocks, in-flight replay, tenants
    whose salt the table drops)."""
    known = sorted(set(tr.capacity.values()))
    default_cap = known[0] if known else max(2, 3_000_000 // tr.block_size)
    c1, c2, c3 = st.columns([1.2, 1, 1])
    tenants = [""] + [t for t in tr.tenants if t]
    tenant = c1.selectbox(
        "Pool or tenant",
        tenants,
        format_func=lambda t: t or "the whole pool",
        help="a tenant's requests alone, replayed on the same engines",
    )
    capacity = int(
        c2.number_input(
            "Capacity per engine (blocks)",
            min_value=2,
            value=int(default_cap),
            step=16,
            help="vLLM's num_gpu_blocks (one block is its null block). "
            + (
                "As the engines reported it when recorded."
                if known
                else "The trace does not say: 3 M tokens by default (the Mooncake paper's local "
                "cache)."
            ),
        )
    )
    concurrent = c3.toggle(
        "Concurrent replay",
        value=False,
        help="in-flight requests hold their blocks: each request replayed from its arrival to its "
        "recorded end (default: one after another, which is exact when requests reach an engine "
        "one at a time)",
    )
    pair = isolation_pair(tr)
    salted = [t for t in tr.tenants if t]
    unsalt: list[str] = []
    if salted:
        unsalt = st.multiselect(
            "Tenants whose salt the table drops",
            salted,
            default=list(pair) if pair else [],
            help="their blocks identified by content: their common prefixes would be shared",
        )
    return str(tenant), capacity, bool(concurrent), tuple(unsalt)


def _headline(w: WhatIf) -> None:
    t, tab = w.trace, w.table
    m1, m2, m3, m4 = st.columns(4)
    m1.metric(
        "Requests",
        fmt.integer(len(t)),
        help=f"{t.n_blocks:,} block references of {t.block_size} tokens, "
        f"{len(t.engines) or 1} engine(s), {t.span_s / 60:.1f} min",
    )
    m2.metric(
        "Token hit rate, replayed",
        fmt.pct(tab.baseline_hit_rate),
        help="cached prompt tokens / prompt tokens, at today's capacity and routing",
    )
    if tab.recorded_hit_rate == tab.recorded_hit_rate:
        m3.metric(
            "Reported by the engines",
            fmt.pct(tab.recorded_hit_rate),
            help=f"{tab.agreement:.1%} of requests replayed to the token",
        )
    else:
        half = w.lru.capacity_for(0.5)
        m3.metric(
            "Tokens for half the max",
            fmt.tokens(half * t.block_size, unit=False),
            help="the smallest cache (block LRU, in tokens per engine) that reaches half of an "
            "infinite one's hit rate",
        )
    m4.metric(
        "Infinite cache",
        fmt.pct(w.lru.max_hit),
        help="every block kept forever (block LRU): no capacity can do better",
    )


def _curves(w: WhatIf, capacity: int) -> None:
    st.subheader("Hit rate against capacity")
    st.plotly_chart(_curve_chart(w, capacity), width="stretch")
    c = w.lru
    bits = []
    for label, blocks in (
        ("half of the maximum", c.capacity_for(0.5)),
        ("95 %", c.capacity_for(0.95)),
        ("the knee", c.knee),
    ):
        if blocks == blocks:
            bits.append(
                f"{label} at {blocks:,.0f} blocks ({fmt.tokens(blocks * w.trace.block_size)})"
            )
    st.caption(
        "Block LRU reaches " + "; ".join(bits) + ". The knee is where the curve, on the log "
        "axis, is furthest above the line from its first to its last point: past it each "
        "doubling buys less. vLLM's curve is its own policy replayed exactly (it also holds "
        "each request's partial and output blocks)."
    )


def _fixes(w: WhatIf) -> None:
    tab = w.table
    st.subheader("What each fix buys")
    st.table(_table(w).set_index("fix"))
    for f in tab.fixes:
        if f.available and f.note:
            st.caption(f"**{f.name}** — {f.note}")
    missing = [f"{f.name} ({f.note})" for f in tab.fixes if not f.available]
    if missing:
        st.caption("Not shown, nothing to replay: " + "; ".join(missing) + ".")
    g1, g2 = st.columns(2)
    g1.plotly_chart(_gain_chart(w), width="stretch")
    g2.plotly_chart(_classes_chart(w), width="stretch")
    missed = tab.baseline_missed
    if missed:
        total = sum(missed.values())
        st.caption(
            "Today the cache could have served "
            + ", ".join(
                f"{v / total:.0%} {k}" for k, v in sorted(missed.items(), key=lambda kv: -kv[1])
            )
            + " of the prompt tokens it missed (elsewhere: on another engine; evicted: stored "
            "before, pushed out; isolated: held under another tenant's salt; drifted: a few "
            "changed tokens changed the key; cold: never seen)."
        )
    st.caption(
        f"Prices: {tab.cost_note}. Intervals: the gain's 95 % t interval over 20 consecutive "
        "time slices of the trace"
        + (", combined with the interval of the cost per token." if tab.cost is not None else ".")
    )
    if not math.isnan(w.lru.rate) and w.lru.rate < 1:
        st.caption(f"The LRU curve is sampled (SHARDS, rate {w.lru.rate:g}).")


def render() -> None:
    st.caption(
        "The recorded block trace replayed through an exact model of vLLM's prefix cache (its "
        "block pool, freeing order and last-token rule), as recorded and once per fix. The "
        "replay reproduces what real engines report request by request (docs/whatif.md)."
    )
    path = data.store_path()
    start, end = state.range_or_whole_trace()
    version = data.version()
    try:
        tr = cached.block_trace(start, end)
    except (TraceError, SourceError) as e:
        st.info(
            f"{e}. A block trace comes from `warmscope gateway --kv-events` (every chat request's "
            "KV blocks, as keyed digests) or from a trace file: `warmscope trace import "
            "FILE` (the Mooncake format). `warmscope demo` imports a real production hour "
            "(Mooncake's conversation trace)."
        )
        return
    tenant, capacity, concurrent, unsalt = _controls(tr)
    points = 8 if tr.n_blocks <= 2_000_000 else 4
    try:
        w = _answer(path, start, end, version, capacity, concurrent, unsalt, points, tenant)
    except TraceError as e:
        st.error(str(e))
        return
    if not len(w.trace):
        st.info(f"No traced request of {tenant} in this range.")
        return
    _headline(w)
    _curves(w, capacity)
    _fixes(w)
