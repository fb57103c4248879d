"""The Advisor page for a recording of an engine's prefix cache only (what ``warmscope gateway``
records in front of vLLM or SGLang): warm-set size and lead time from
:func:`warmscope.analysis.advisor.advise_prefix`, the same recommendation ``warmscope advise``
prints for such a store.

The page's forecast and replay tuning need the response and embedding layers and two hours of
lookups; a prefix-only store has neither, so the page hands it to :func:`render` instead of
refusing it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from warmscope.analysis.advisor import NoRecommendation, PrefixAdvice, advise_prefix
from warmscope.analysis.value import values_for
from warmscope.app.dashboard import data, fmt
from warmscope.sources import empty_frame

__all__ = ["render"]

OBJECTIVES = {
    "default (from the data)": None,
    "value": "value",
    "SLO": "slo",
    "net GPU-s": "net_gpu_s",
}


@st.cache_data(ttl=data.TTL, show_spinner=False)
def _advise(
    store: str,
    start: float,
    end: float,
    objective: str | None,
    slo_ttft_s: float | None,
    penalty: float | None,
    _fr: dict[str, Any],
) -> tuple[PrefixAdvice | None, str]:
    src = data.source()
    vm = values_for(src, _fr, start, end, slo_ttft_s, penalty, objective)
    try:
        # every experiment's units (a source's units() reads one experiment at a time)
        per = [src.units(e) for e in src.experiments()]
        units = pd.concat(per, ignore_index=True) if per else empty_frame("ab_units")
        return advise_prefix(_fr, units, vm, objective), ""
    except (NoRecommendation, ValueError) as e:
        return None, str(e)


def _curve(adv: PrefixAdvice) -> go.Figure:
    """Replayed token hit rate and the objective's sum against the warm-set size."""
    t = adv.table
    ks = np.arange(0, len(t) + 1)
    hit = [adv.outcome_for(int(k)).hit_rate for k in ks]
    worth = np.concatenate([[0.0], np.cumsum(t["worth"].to_numpy(float))])
    fig = go.Figure()
    fig.add_scatter(x=ks, y=hit, name="replayed token hit rate", yaxis="y")
    fig.add_scatter(x=ks, y=worth, name=f"{adv.objective} gained (sum)", yaxis="y2")
    fig.add_vline(
        x=adv.warm_keys,
        line_dash="dot",
        annotation_text=f"recommended: {adv.warm_keys}",
        annotation_position="top",
    )
    fig.update_layout(
        height=340,
        margin=dict(l=10, r=10, t=30, b=10),
        xaxis_title="warm set: the k most requested prefixes",
        yaxis=dict(title="token hit rate", tickformat=".0%", rangemode="tozero"),
        yaxis2=dict(title=f"{adv.objective} gained", overlaying="y", side="right"),
        legend=dict(orientation="h", y=-0.25),
    )
    return fig


def render(fr: dict[str, Any], start: float, end: float) -> None:
    """Draw the prefix-cache recommendation for ``fr`` (a prefix-only range)."""
    st.info(
        "This range records one cache layer, an engine's prefix cache (a gateway's recording): "
        "the advisor sizes the warm set a fresh replica should get and how long before it takes "
        "traffic to start warming (`warmscope advise` prints the same). The forecast and replay "
        "tuning need the response and embedding layers."
    )
    a, b, c = st.columns(3)
    obj = a.selectbox("Objective", list(OBJECTIVES), key="adv_prefix_objective")
    target = b.number_input(
        "TTFT target (s, SLO objective)", min_value=0.0, value=0.0, step=0.05, key="adv_prefix_slo"
    )
    penalty = c.number_input(
        "Penalty per request over the target",
        min_value=0.0,
        value=0.0,
        step=0.01,
        key="adv_prefix_penalty",
    )
    with st.spinner("Sizing the warm set…"):
        adv, why = _advise(
            data.store_path(),
            start,
            end,
            OBJECTIVES[obj],
            target or None,
            penalty or None,
            fr,
        )
    if adv is None:
        st.warning(f"No recommendation. {why}")
        return
    o = adv.outcome
    m1, m2, m3, m4 = st.columns(4)
    m1.metric("Warm set (prefixes)", f"{adv.warm_keys} of {adv.keys}")
    m2.metric(
        "Lead time",
        f"{adv.lead_s:.1f} s",
        help="the warm-up's duration: start it this long before the replica takes traffic",
    )
    m3.metric(
        "Token hit rate, replayed",
        fmt.pct(o.hit_rate),
        delta=f"{(o.hit_rate - adv.recorded_hit_rate) * 100:+.1f} pts vs recorded",
    )
    unit = "GPU-s" if adv.objective == "net_gpu_s" else "value"
    m4.metric(
        f"Expected gain ({adv.objective})",
        f"{adv.gain:+.4g} {unit}",
        help=f"over the next span like the recorded one; 95 % interval {adv.gain_low:+.4g} to "
        f"{adv.gain_high:+.4g}",
    )
    st.caption(
        f"Replay fidelity: with no warm-up the model gives {fmt.pct(adv.replayed_hit_rate)} "
        f"against {fmt.pct(adv.recorded_hit_rate)} recorded; "
        f"{fmt.pct(adv.re_miss_share)} of requests missed a prefix read before. "
        f"{adv.latency.sentence()} {adv.values.prices().rstrip('.')}."
    )
    st.plotly_chart(_curve(adv), width="stretch")
    for n in adv.notes:
        st.markdown(f"- {n}")
    top = adv.table.head(20)
    st.dataframe(
        pd.DataFrame(
            {
                "Rank": np.arange(1, len(top) + 1),
                "Tenant": top["tenant"].astype(str),
                "Requests": top["requests"].astype(int),
                "Cached tokens when read": top["tokens"].round(0).astype(int),
                "Chance of a read next span": [fmt.pct(p) for p in top["p_read"]],
                f"Worth ({adv.objective})": top["worth"].map(lambda v: f"{v:+.4g}"),
                "Warmed": ["yes" if i < adv.warm_keys else "no" for i in range(len(top))],
            }
        ),
        hide_index=True,
        width="stretch",
    )
    st.caption("Prefixes appear by rank only: their text and key are never stored.")
