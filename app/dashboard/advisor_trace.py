"""The Advisor page's judgement of warm-up strategies on real traffic: the store's block trace (what
``warmscope gateway --kv-events`` records, or a trace imported with ``warmscope trace import``)
replayed through the exact prefix-cache model with a restart at 30 points, each strategy warming
the emptied cache from the traffic before the restart (:func:`warmscope.analysis.whatif.warmup.
advise`, the same evaluation ``warmscope advise --block-trace`` prints). Paired: every strategy
meets the same restarts and the same traffic. The method: docs/warmup-evaluation.md."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from warmscope.analysis.whatif.warmup import (
    OBJECTIVES,
    ORACLES,
    Evaluation,
    Recommendation,
    advise,
    reuse_profile,
)
from warmscope.app.dashboard import cached, data, fmt
from warmscope.model.blocktrace import TraceError
from warmscope.sources.base import SourceError

__all__ = ["render"]

NAMES = {
    "static_topk": "static top-K",
    "recency": "recency",
    "heat": "heat decay",
    "predictive": "predictive",
    "oracle_seen": "seen oracle (bound)",
    "oracle": "oracle (bound)",
}
COLOURS = {
    "static_topk": "#636efa",
    "recency": "#00cc96",
    "heat": "#ef553b",
    "predictive": "#ab63fa",
    "oracle_seen": "#8c959f",
}
GLOSSARY = (
    "**K**: the warm-up budget, blocks warmed at each restart (a chosen block brings the blocks "
    "before it in its chain). **Static top-K**: the K blocks read most often in the hour before "
    "the restart. **Recency**: the K read last. **Heat decay**: reads weighted by e^(−λ·age), "
    "λ from the TTFT SLO (λ = 1 / max(0.1 × SLO, 10 s)). **Predictive**: each block's rate from "
    "the last hour, confirmed by the last ten minutes, warmed only where a read within the "
    "horizon is likely. **Seen oracle**: the blocks the next minutes actually read, among those "
    "traffic had shown before the restart: the bound for any strategy that learns from traffic. "
    "**Oracle**: the same including content nobody had sent yet. **Precision**: the share of "
    "warmed blocks some request read. Intervals: 95 %, from the paired differences over the "
    "restarts."
)


@st.cache_resource(show_spinner=False, max_entries=8)
def _judged(
    path: str, start: float | None, end: float | None, version: Any, capacity: int
) -> tuple[Evaluation, Recommendation, dict[str, float]]:
    tr = cached.block_trace(start, end)
    from warmscope.analysis.value import fit_token_latency

    fit = fit_token_latency((tr.prompt - np.maximum(tr.cached, 0)).astype(float), tr.ttft)
    per_token = math.nan if isinstance(fit, str) else fit.per_token_s
    bar = st.progress(0.0, text="replaying the restarts…")

    def tick(done: int, total: int) -> None:
        bar.progress(min(1.0, done / max(total, 1)), text=f"replaying: {done} of {total} restarts")

    try:
        ev, rec = advise(tr, capacity, per_token_s=per_token, progress=tick, names=NAMES)
    finally:
        bar.empty()
    return ev, rec, reuse_profile(tr)


def render(start: float | None, end: float | None) -> None:
    st.subheader("Warm-up strategies on the recorded traffic")
    st.caption(
        "The store's block trace replayed through the exact prefix-cache model with a restart at "
        "30 points; at each, every strategy warms the emptied cache with K blocks chosen from the "
        "traffic before the restart, and the next 1, 5 and 15 minutes are replayed. Paired: the "
        "same restarts and traffic for every strategy (`warmscope advise --block-trace` prints "
        "the same; the method: docs/warmup-evaluation.md)."
    )
    path, version = data.store_path(), data.version()
    try:
        tr = cached.block_trace(start, end)
    except (TraceError, SourceError) as e:
        st.info(
            f"{e}. Record one with `warmscope gateway --kv-events` in front of vLLM, or import "
            "a trace file with `warmscope trace import FILE`."
        )
        return
    known = sorted(set(tr.capacity.values()))
    a, b = st.columns([1, 2])
    capacity = int(
        a.number_input(
            "Engine capacity (blocks)",
            min_value=2,
            value=int(known[0] if known else max(2, 3_000_000 // tr.block_size)),
            step=16,
            key="adv_trace_capacity",
            help="vLLM's num_gpu_blocks: the warm-up budgets tried go up to it. "
            + ("As the engines reported it." if known else "The trace does not say: 3 M tokens."),
        )
    )
    b.caption(
        f"{len(tr):,} traced requests over {tr.span_s / 60:.0f} min, {tr.n_blocks:,} block "
        f"references of {tr.block_size} tokens."
    )
    key = (path, start, end, str(version), capacity)
    if st.session_state.get("adv_trace_done") != key and not st.button(
        "Judge the warm-up strategies on this trace",
        key="adv_trace_go",
        help="about a minute for an hour of a busy engine's traffic",
    ):
        return
    try:
        ev, rec, profile = _judged(path, start, end, version, capacity)
    except TraceError as e:
        st.warning(f"No judgement: {e}")
        return
    st.session_state["adv_trace_done"] = key
    _recommendation(ev, rec)
    st.plotly_chart(_chart(ev), width="stretch")
    st.table(_table(ev).set_index(["K (blocks)", "strategy"]))  # wraps: no column cut
    settled = ev.settled_by()
    if settled is not None:
        st.caption(ev.settled_note(settled))
    st.caption(GLOSSARY)
    if profile:
        st.caption(
            "Why the strategies land where they do, the trace's reuse: "
            f"{profile['first_reads']:.0%} of block reads are a block's first (no strategy can "
            f"warm those); of the rereads, {profile['reread_within_1min']:.0%} come within a "
            f"minute, {profile['reread_within_15min']:.0%} within 15 minutes; the 1 % most read "
            f"blocks take {profile['top_1pct_share']:.0%} of the reads."
        )


def _recommendation(ev: Evaluation, rec: Recommendation) -> None:
    h = f"{rec.horizon_s / 60:.0f} min"
    if rec.strategy == "none":
        st.warning("Recommendation: no warm-up. " + " ".join(rec.notes))
        return
    st.markdown(
        f"**Recommendation: {NAMES.get(rec.strategy, rec.strategy)}, K = {rec.k:,} blocks** "
        f"({rec.k * ev.block_size:,} tokens) — objective {rec.objective}: "
        f"{OBJECTIVES[rec.objective]}."
    )
    c1, c2, c3, c4 = st.columns(4)
    c1.metric(
        "Tokens saved per restart",
        f"{rec.gain_tokens:+,.0f}",
        help=f"prefill tokens saved over no warm-up, in the {h} after a restart; 95 % CI "
        f"{rec.gain_ci[0]:+,.0f} to {rec.gain_ci[1]:+,.0f}",
    )
    if rec.restarts_per_hour == rec.restarts_per_hour:
        c2.metric(
            "Tokens saved per hour",
            f"{rec.gain_tokens * rec.restarts_per_hour:+,.0f}",
            help=f"prefill tokens, at the trace's {rec.restarts_per_hour:.2g} restarts per hour",
        )
    else:
        c2.metric(
            "Tokens saved per request",
            f"{rec.gain_tokens / max(rec.requests, 1.0):+,.0f}",
            help=f"prefill tokens, over the {rec.requests:,.0f} requests in the {h} after a "
            "restart",
        )
    if rec.per_token_s == rec.per_token_s:
        c3.metric(
            "TTFT saved per request",
            f"{rec.ttft_saved_s_per_request * 1e3:+.1f} ms",
            help=f"in the {h} after a restart, at the trace's measured cost of a missed token; "
            f"the warm-up's own prefill takes {rec.lead_s:.1f} s before the replica is ready",
        )
    else:
        c3.metric(
            "Warm-up's prefill, tokens",
            fmt.tokens(rec.warm_tokens, unit=False),
            help=f"{rec.warm_tokens:,.0f} tokens per restart; the trace has no time to first "
            "token to price a token in seconds with",
        )
    c4.metric(
        "Of the seen oracle's gain",
        fmt.pct(rec.seen_share),
        help="the share of what warming the blocks the next minutes read (among those the trace "
        f"had already sent) would save; 95 % CI {rec.seen_share_ci[0]:.0%} to "
        f"{rec.seen_share_ci[1]:.0%}; of the full oracle's (which knows content nobody had sent "
        f"yet): {rec.oracle_share:.0%}",
    )
    notes = list(rec.notes)
    if rec.widened:
        notes.insert(0, f"Search: {rec.widened}.")
    for n in notes:
        st.markdown(f"- {n}")


def _chart(ev: Evaluation) -> go.Figure:
    """Gain over no warm-up at the longest horizon, per budget and strategy, with the seen oracle
    as the bound."""
    h = max(ev.horizons)
    fig = go.Figure()
    for s, colour in COLOURS.items():
        cells = [
            c for k in ev.ks for c in ev.cells if c.strategy == s and c.k == k and c.horizon_s == h
        ]
        if not cells:
            continue
        fig.add_trace(
            go.Bar(
                x=[f"K = {c.k:,}" for c in cells],
                y=[c.gain_tokens for c in cells],
                name=NAMES[s],
                marker_color=colour,
                opacity=0.45 if s in ORACLES else 1.0,
                error_y=dict(
                    type="data",
                    symmetric=False,
                    array=[c.gain_ci[1] - c.gain_tokens for c in cells],
                    arrayminus=[c.gain_tokens - c.gain_ci[0] for c in cells],
                ),
            )
        )
    fig.update_layout(
        barmode="group",
        title=f"Prefill tokens saved per restart over no warm-up, {h / 60:.0f} min after it "
        "(95 % CI)",
        yaxis_title="tokens per restart",
        height=400,
        margin=dict(t=50, b=20),
        legend=dict(orientation="h", y=-0.12),
    )
    return fig


def _table(ev: Evaluation) -> pd.DataFrame:
    rows = []
    for k, s, cells in ev.table_rows():
        row: dict[str, Any] = {"K (blocks)": f"{k:,}", "strategy": NAMES[s]}
        for c in cells:
            row[f"saved within {c.horizon_s / 60:g} min"] = (
                f"{c.gain_tokens:+,.0f} ({c.gain_ci[0]:+,.0f} to {c.gain_ci[1]:+,.0f})"
            )
        last = cells[-1]
        row["share of seen oracle"] = (
            "(a bound)"
            if s in ("oracle_seen", "oracle")
            else f"{last.seen_share:.0%} ({last.seen_share_ci[0]:.0%}–{last.seen_share_ci[1]:.0%})"
            if last.seen_share == last.seen_share
            else "—"
        )
        row["precision"] = fmt.pct(last.precision) if last.precision == last.precision else "—"
        rows.append(row)
    return pd.DataFrame(rows)
