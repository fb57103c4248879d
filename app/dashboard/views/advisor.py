"""Advisor: request forecasts with intervals and the next peak; tuned warm-up parameters with
before/after."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from warmscope.analysis.advisor import Recommendation, layer_table, prefix_only
from warmscope.analysis.forecast import evaluate, forecast_now, forecast_table, series
from warmscope.analysis.replay import FIDELITY_MIN_REQUESTS, FIDELITY_SHARE, FIDELITY_TOL
from warmscope.analysis.replay import Fidelity as ReplayFidelity
from warmscope.app.dashboard import advisor_trace, cached, data, fmt, state

MODEL_NAMES = {"ses": "exponential smoothing", "seasonal_naive": "seasonal naive"}
OBJ = {
    "default (from the data)": None,
    "value": "value",
    "SLO": "slo",
    "net GPU-s": "net_gpu_s",
    "compute ROI ratio": "roi",
}


@st.cache_data(ttl=data.TTL, show_spinner=False)
def _forecast(
    store: str, start: float, end: float, _lk: pd.DataFrame
) -> tuple[pd.DataFrame, pd.DataFrame]:
    tab = forecast_table(_lk, ("family",))
    s = series(_lk, ("layer",))
    ev = evaluate(s)
    return tab, forecast_now(_lk, ("layer",), evaluations=ev)


def _range_hours(rec: Recommendation) -> float:
    """The hours the replay covers (the gain is over them)."""
    m = rec.model
    return max((m.t1 - m.t0) / 3600.0, 1e-9) if m is not None else 24.0


def _trigger(at: float, rec: Recommendation) -> str:
    """A trigger time, or "now" when it falls before the end of the replayed range."""
    m = rec.model
    return "now" if m is not None and at <= m.t1 else fmt.when(at)


def _horizon(s: float) -> str:
    return f"{s / 3600:g} h" if s >= 3600 else (f"{s / 60:g} min" if s >= 60 else f"{s:g} s")


TERMS = (
    "**MAPE**: mean absolute percentage error of a forecast on the held-back last 20 % of the "
    "range (lower is better). **Seasonal naive**: tomorrow repeats today at the same minute. "
    "**Exponential smoothing**: a weighted mean with weights falling geometrically into the "
    "past. **Bayesian optimisation**: the warm-up parameters searched by fitting a Gaussian "
    "process to the replays tried so far and trying next where it expects most (GP sd: its "
    "uncertainty about the gain). **λ (heat decay)**: a key's reads weighted by e^(−λ·age); "
    "1/λ is how long a read counts. **Lead**: how long before the forecast peak a warm-up "
    "starts."
)


def render() -> None:
    st.caption(
        "What to warm and when: request forecasts per key family at 5 s, 3 min and 1 h, checked "
        "against seasonal-naive and exponential-smoothing baselines on the held-back last 20 % "
        "of the "
        "range; warm-up parameters tuned by Bayesian optimisation over a replay of the recorded "
        "traffic (`warmscope advise` prints the same); below, every warm-up strategy judged on "
        "the recorded block trace, when the store holds one."
    )
    start, end = state.range_or_whole_trace()
    if start is None or end is None:  # no lookups: the block trace alone (e.g. one imported)
        st.info(
            "No forecast or tuning: the store has no lookups yet (the collectors record them; "
            "`warmscope demo` simulates a day of them). Below, the warm-up strategies judged on "
            "the store's block trace."
        )
    else:
        _tuning(start, end)
    advisor_trace.render(start, end)


def _tuning(start: float, end: float) -> None:
    """The forecast and the tuned parameters (or the prefix-only advice of a gateway's store)."""
    if state.step(start, end):
        st.info("The advisor needs per-minute lookups: pick a range of 24 hours or less.")
        return
    fr = state.load(
        ["lookups", "warmup_runs", "warmed_keys", "hot_keys", "gauges", "faults", "histograms"],
        start,
        end,
    )
    # a replica's start-up warm-up runs before its first request: read runs from an hour before the
    # range, so a range that begins with the traffic still sees the warm-ups that held the readiness
    # gate
    fr["warmup_runs"] = state.load(["warmup_runs"], start - 3600.0, end)["warmup_runs"]
    lk = fr["lookups"]
    if prefix_only(fr):  # a gateway's recording: an engine's prefix cache, the one layer
        from warmscope.app.dashboard import advisor_prefix

        # a hot-key window is stamped with its start (an hour by default): one that began before the
        # range holds the range's first reads too
        fr["hot_keys"] = state.load(["hot_keys"], start - 3600.0, end)["hot_keys"]

        advisor_prefix.render(fr, start, end)
        return
    if len(lk) == 0 or lk["ts"].max() - lk["ts"].min() < 2 * 3600:
        st.info("The advisor needs at least 2 hours of lookups in the range: pick a longer range.")
        return

    with st.spinner("Forecasting…"):
        tab, fc = _forecast(data.store_path(), start, end, lk)
    _forecast_section(tab, fc)
    _recommendation_section(start, end)
    st.caption(TERMS)


def _forecast_section(tab: pd.DataFrame, fc: pd.DataFrame) -> None:
    st.subheader("Forecast")
    kept = tab[tab.kept]
    cols = st.columns(len(kept) or 1)
    for c, (_, r) in zip(cols, kept.iterrows(), strict=False):
        base = tab[(tab.horizon_s == r.horizon_s) & (tab.model != r.model)]
        best_base = base.mape.min() if len(base) else np.nan
        label = _horizon(float(r.horizon_s))
        c.metric(
            f"MAPE {label} ({MODEL_NAMES.get(r.model, r.model)})",
            f"{r.mape:.1%}",
            delta=None
            if r.model != "regression"
            else f"{r.mape - best_base:+.1%} vs best baseline",
            delta_color="inverse",
            help=f"90 % interval coverage {r.coverage_90:.0%}. {r.note}",
        )
    hs = sorted(fc.horizon_s.unique()) if len(fc) else [3600.0]
    h = st.radio(
        "Horizon",
        hs,
        index=len(hs) - 1,
        horizontal=True,
        key="adv_h",
        format_func=_horizon,
    )
    layer = st.selectbox("Layer", sorted(fc.group.unique()) if len(fc) else [], key="adv_layer")
    f = fc[(fc.horizon_s == h) & (fc.group == layer)].copy()
    f["when"] = pd.to_datetime(f.ts, unit="s")
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(x=f.when, y=f.hi, line=dict(width=0), showlegend=False, hoverinfo="skip")
    )
    fig.add_trace(
        go.Scatter(
            x=f.when,
            y=f.lo,
            fill="tonexty",
            line=dict(width=0),
            name="90 % interval",
            fillcolor="rgba(99,110,250,0.2)",
        )
    )
    fig.add_trace(go.Scatter(x=f.when, y=f.forecast, name="forecast", line=dict(color="#636efa")))
    fig.add_trace(go.Scatter(x=f.when, y=f.actual, name="actual", line=dict(color="#222", width=1)))
    held = f.ts.quantile(0.8) if len(f) else None
    if held is not None:
        fig.add_vline(
            x=pd.to_datetime(held, unit="s"), line_dash="dot", annotation_text="held back →"
        )
    fig.update_layout(
        title=f"{layer}: mean requests/s over the next {h:g} s, forecast at each minute",
        yaxis_title="requests / s",
        height=380,
        margin=dict(t=50, b=20),
    )
    st.plotly_chart(fig, width="stretch")
    with st.expander("Forecast error per horizon and model (per key family)"):
        st.dataframe(
            tab.style.format({"mape": "{:.1%}", "coverage_90": "{:.0%}"}),
            hide_index=True,
            width="stretch",
        )


def _recommendation_section(start: float, end: float) -> None:
    """The tuned parameters: computed in a child process (``cached.advice``), shown when done;
    the forecast above is there meanwhile."""
    st.subheader("Recommendation")
    a, b, c = st.columns(3)
    budget = a.number_input(
        "Warm-up budget (GPU-s per day, 0 = no cap)",
        min_value=0.0,
        value=0.0,
        step=50.0,
        key="adv_budget",
    )
    obj = b.selectbox(
        "Objective",
        list(OBJ),
        key="adv_objective",
        help="value: GPU-s and TTFT saved, TTFT priced by the conversion response to latency "
        "measured "
        "over the A/B units (the default when they record conversions); SLO: TTFT priced by a "
        "penalty "
        "per request over the target; net GPU-s: GPU-s saved minus warm-up GPU-s",
    )
    penalty = c.number_input(
        "SLO penalty per request over the TTFT target (0 = none)",
        min_value=0.0,
        value=0.0,
        step=0.01,
        key="adv_penalty",
    )
    inputs = (float(budget) or None, OBJ[str(obj)], float(penalty) or None)
    try:
        got = cached.advice(start, end, *inputs)
    except ValueError as e:
        st.info(f"No recommendation. {e}")
        return
    if got is None:
        st.info(
            "Tuning the warm-up parameters (Bayesian optimisation over replays of the recorded "
            "traffic, tens of seconds) in the background… the recommendation appears here when "
            "it is done; the forecast above is ready now.",
            icon=":material/hourglass_top:",
        )
        _wait_for_advice(start, end, inputs)
        return
    _recommendation(*got)


@st.fragment(run_every=2)
def _wait_for_advice(
    start: float, end: float, inputs: tuple[float | None, str | None, float | None]
) -> None:
    if cached.start_advice(start, end, *inputs).done():
        st.rerun(scope="app")


def _fidelity(f: ReplayFidelity) -> None:
    t = f.table
    col = st.column_config.Column
    tol = f"±{FIDELITY_TOL * 100:g} pts"
    st.dataframe(
        pd.DataFrame(
            {
                "Layer": t.layer,
                "Buckets scored": t.buckets,
                f"Within {tol}": [f"{w} ({s:.0%})" for w, s in zip(t.within, t.share, strict=True)],
                "Median gap": [
                    f"{x * 100:.1f} pts" if x == x else "no bucket" for x in t.median_abs_diff
                ],
                "Largest gap": [
                    f"{x * 100:.1f} pts" if x == x else "no bucket" for x in t.max_abs_diff
                ],
                "In faults": t.faulted,
                "Trusted": ["yes" if ok else "no" for ok in t.ok],
            }
        ),
        hide_index=True,
        width="stretch",
        # short headers, so that the table fits the page; what each counts, on hover
        column_config={
            "Buckets scored": col(
                help=f"15-minute buckets with at least {FIDELITY_MIN_REQUESTS:g} lookups, outside "
                "fault windows"
            ),
            f"Within {tol}": col(
                help=f"scored buckets whose replayed hit rate is within {tol} of the recorded"
            ),
            "Median gap": col(help="median |replayed − recorded| hit rate over scored buckets"),
            "Largest gap": col(help="largest |replayed − recorded| hit rate of a scored bucket"),
            "In faults": col(help="buckets inside known fault windows: not scored"),
            "Trusted": col(
                help=f"at least {FIDELITY_SHARE:.0%} of the scored buckets within {tol}"
            ),
        },
    )


def _recommendation(rec_: object, before_: object, after_: object) -> None:
    """The Advisor's recommendation: how far the replay is trusted, the objective, when to
    trigger each layer's warm-up, the layers' parameters, the expected outcome against the
    recorded parameters, and the hit rate replayed both ways."""
    if rec_ is None:
        st.warning(f"No recommendation. {before_}")
        if isinstance(after_, ReplayFidelity):
            _fidelity(after_)
        return
    assert isinstance(rec_, Recommendation)
    assert isinstance(before_, pd.DataFrame) and isinstance(after_, pd.DataFrame)
    rec = rec_
    _fidelity_and_objective(rec)
    _peak_triggers(rec)
    st.dataframe(layer_table(rec), width="stretch")
    for la in rec.layers.values():
        for note in la.notes:
            st.markdown(f"- **{la.layer}**: {note}")
    _outcome(rec)
    _roi_falls(rec)
    _replayed_hit_rates(rec, before_, after_)
    _replay_caption(rec)


def _fidelity_and_objective(rec: Recommendation) -> None:
    st.markdown(
        "**Replay fidelity** — the replay with the recorded parameters against the recorded hit "
        "rate, "
        "per 15-minute bucket: trusted when at least 90 % of each layer's buckets are within ±5 "
        "points."
    )
    if rec.fidelity is not None:
        _fidelity(rec.fidelity)
    else:
        st.caption("Fidelity not checked (a given model).")
    st.markdown(
        f"**Objective: {rec.objective}** — {'; '.join(rec.notes) or 'as chosen'}. "
        + (rec.values.prices() if rec.values else "")
    )


def _peak_triggers(rec: Recommendation) -> None:
    if rec.peak:
        a, b = st.columns([1, 2])
        a.metric("Next peak", fmt.when(rec.peak.at), help=rec.peak.basis)
        b.markdown("**Trigger each layer's warm-up at** (its own lead before the peak)")
        b.table(
            pd.DataFrame(
                [
                    {
                        "layer": la.layer,
                        "trigger at": _trigger(rec.peak.at - la.params.lead_s, rec),
                        "lead": _horizon(la.params.lead_s),
                    }
                    for la in rec.layers.values()
                ]
            ).set_index("layer")
        )


def _outcome(rec: Recommendation) -> None:
    """The expected gain on the objective and the warm-ups' ROI, GPU-s and bytes against the
    recorded parameters."""
    o, bo = rec.outcome, rec.base_outcome
    c1, c2, c3, c4 = st.columns(4)
    hours = _range_hours(rec)
    if rec.objective in ("value", "slo"):
        lo = sum(la.gain_low for la in rec.layers.values())
        hi = sum(la.gain_high for la in rec.layers.values())
        c1.metric(
            "Expected gain, value per hour",
            f"{rec.gain / hours:+,.2f}",
            help=(
                "GPU-s and TTFT saved, priced (the prices below, in the configured currency), "
                f"against the recorded parameters: {rec.gain:+,.2f} over the range's "
                f"{hours:.1f} h; 95 % CI of the latency price: {lo:+,.2f} to {hi:+,.2f} over the "
                f"range. Net GPU-s over the range: {o.net_gpu_s - bo.net_gpu_s:+,.0f}"
            ),
        )
    elif rec.objective == "roi":
        c1.metric("Expected gain (ROI ratio)", f"{rec.gain:+.2f}", help=f"GP sd {rec.gain_sd:.2f}")
    else:
        c1.metric(
            "Expected gain",
            f"{rec.gain:+,.0f} GPU-s",
            help=f"GPU-s saved minus warm-up GPU-s over the range, "
            f"against the recorded parameters (the objective); GP sd {rec.gain_sd:.0f} GPU-s",
        )
    c4.metric(
        "Warm-up ROI (compute)",
        f"{o.roi:+.2f}",
        delta=f"{o.roi - bo.roi:+.2f}",
        help=(
            "(GPU-s the warm-ups' hits save − their GPU-s) / their GPU-s; it leaves latency out, "
            "so a "
            "warm-up that buys latency can read negative here and still win on value"
        ),
    )
    c2.metric(
        "Warm-up GPU-s",
        f"{o.warm_gpu_s:,.0f}",
        delta=f"{o.warm_gpu_s - bo.warm_gpu_s:+,.0f}",
        delta_color="inverse",
    )
    c3.metric(
        "Warm-up bytes",
        f"{o.warm_bytes / 1e6:,.0f} MB",
        delta=f"{(o.warm_bytes - bo.warm_bytes) / 1e6:+,.0f} MB",
        delta_color="inverse",
    )


def _roi_falls(rec: Recommendation) -> None:
    """Why the warm-up ROI can fall while the objective rises."""
    o, bo = rec.outcome, rec.base_outcome
    if o.roi < bo.roi - 0.005 and rec.objective != "roi":
        how = (
            "spends more warm-up GPU time, on keys that each save less than the first ones"
            if o.warm_gpu_s > bo.warm_gpu_s
            else "spends less warm-up GPU time and gives up some hits the recorded one bought"
        )
        st.caption(
            f"The warm-up ROI falls ({bo.roi:+.2f} → {o.roi:+.2f}): ROI is what the warm-ups "
            f"save per GPU-second they spend, and the recommendation {how}. It is still better "
            f"on the objective ({rec.objective}), which counts the total gain "
            f"({rec.gain:+,.2f}), not the gain per GPU-second."
        )


def _replayed_hit_rates(rec: Recommendation, before: pd.DataFrame, after: pd.DataFrame) -> None:
    rec_hr = rec.fidelity.buckets if rec.fidelity is not None else pd.DataFrame()
    fig = go.Figure()
    for ly, g in rec_hr.groupby("layer") if len(rec_hr) else ():
        fig.add_trace(
            go.Scatter(
                x=pd.to_datetime(g.ts, unit="s"),
                y=g.recorded,
                name=f"{ly} · recorded (measured)",
                line=dict(dash="dot", width=1),
            )
        )
    for name, cv, dash in (
        ("replayed, recorded parameters", before, "dash"),
        ("replayed, recommended", after, "solid"),
    ):
        for ly, g in cv.groupby("layer"):
            fig.add_trace(
                go.Scatter(
                    x=pd.to_datetime(g.ts, unit="s"),
                    y=g.hit_rate,
                    name=f"{ly} · {name}",
                    line=dict(dash=dash),
                )
            )
    fig.update_layout(
        title="Hit rate per 15 min: measured, replayed with the recorded parameters, replayed "
        "with the "
        "recommended ones",
        yaxis_tickformat=".0%",
        height=420,
        margin=dict(t=50, b=20),
    )
    st.plotly_chart(fig, width="stretch")


def _replay_caption(rec: Recommendation) -> None:
    st.caption(
        f"{rec.evaluations} replays in {rec.seconds:.1f} s. Each layer is tuned on its own share "
        "of "
        "the objective (their replays are independent). Prove a recommendation with a simulator "
        "A/B "
        "(pool B on the recommended parameters: `warmscope.simulator.advisor_proof.prove`). "
        "Staleness: "
        "warmed entries expire at the TTL, are evicted unread when the cache turns over, and lose "
        "popularity as the hot keys "
        "did — "
        + "; ".join(rec.model.persist_note.values() if rec.model else ())
        + ". The value objective also prices "
        "the wait of requests behind a readiness gate while a warm-up runs (requests arriving "
        "during a "
        "warm-up of D seconds wait D/2 on average); a rolling restart's background warm-up is not "
        "charged."
    )
