"""Engine-only mode: what the pages show when Prometheus holds inference-engine
metrics (vLLM, SGLang, LMCache) but no warmscope collector series.

The figures come from the engines' own counters (see
:meth:`analysis.prometheus.PrometheusSource.engine_frame`): the token-weighted
prefix-cache hit rate (hit tokens / prompt tokens) by model, instance and
engine and over time, cached tokens by source, time to first token P50/P95/P99
and KV-cache usage. What only the collectors can give — tenants, key families,
warm-up runs, hot keys, A/B unit records — is named as such instead of being
drawn as empty charts.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.express as px
import streamlit as st
from warmscope.app.dashboard import data, fmt, state

__all__ = [
    "active",
    "frame",
    "hit_table",
    "overview",
    "explorer",
    "rootcause",
    "needs_collectors",
    "ab_advice",
    "alerts",
    "no_unit_records",
    "only_engines",
]

DIMS = ["instance", "model", "engine_kind", "engine"]
COLLECTORS_NOTE = (
    "Engine metrics only: Prometheus holds the engines' own counters and no warmscope collector "
    "series. Figures by **tenant** and **key family**, **warm-up runs**, **hot keys** and **A/B** "
    "reports need the warmscope collectors in the serving code (`collectors.setup()` with "
    "`WARMSCOPE_EXPORTER=prometheus` or `otlp`; see the README)."
)


def frame(name: str, start: float, end: float) -> pd.DataFrame:
    """An engine frame for the range (stops the page with the message on a source error)."""
    try:
        return data.frame(name, start, end)
    except data.SourceError as e:
        st.error(str(e))
        st.stop()


def active(start: float, end: float) -> bool:
    """Prometheus is the source and holds no warmscope lookups in the range."""
    if not data.prometheus_url():
        return False
    return state.load(["lookups"], start, end)["lookups"].empty


def no_unit_records() -> bool:
    """Prometheus is the only source: no Redis and no embedded store."""
    from pathlib import Path

    return (
        bool(data.prometheus_url())
        and not data.redis_url()
        and not Path(data.store_path()).exists()
    )


def only_engines(start: float, end: float) -> bool:
    """Engine metrics only, and no Redis or embedded store for per-key records."""
    return no_unit_records() and active(start, end)


def hit_table(
    df: pd.DataFrame, by: list[str] | None = None, freq: float | None = None
) -> pd.DataFrame:
    """Token-weighted hit rate: sum(hits) / sum(queries) per group (and time bucket)."""
    by = list(by or [])
    d = df.copy()
    keys = list(by)
    if freq:
        d["bucket"] = (np.ceil(d.ts / freq) * freq).astype(float)
        keys = ["bucket", *keys]
    if not keys:
        h, q = float(d.hits.sum()), float(d.queries.sum())
        return pd.DataFrame({"hits": [h], "queries": [q], "hit_rate": [h / q if q else np.nan]})
    g = d.groupby(keys, as_index=False)[["hits", "queries"]].sum()
    g["hit_rate"] = np.where(g.queries > 0, g.hits / g.queries.where(g.queries > 0), np.nan)
    return g


def _bucket(start: float, end: float) -> int:
    return max(60, int(state.step(start, end) or 0), int((end - start) / 120 // 60 * 60))


def _no_engine_data() -> None:
    st.info(
        "Prometheus holds neither warmscope collector series nor engine metrics (vLLM "
        "`vllm:prefix_cache_*`, SGLang `sglang:cached_tokens_total`, LMCache "
        "`lmcache:num_hit_tokens`) in this range. Check that Prometheus scrapes the engines' "
        "`/metrics` and widen the time range."
    )
    st.stop()


def _pct(x: float) -> str:
    return "no data" if x != x else f"{x:.1%}"


def overview(start: float, end: float) -> None:
    st.caption(f"{fmt.when(start)} → {fmt.when(end)} · engine metrics from Prometheus")
    st.info(COLLECTORS_NOTE)
    pre = frame("engine_prefix", start, end)
    if pre.empty or pre.queries.sum() == 0:
        _no_engine_data()
    tot = hit_table(pre)
    c = st.columns(4)
    c[0].metric("Prefix-cache hit rate (tokens)", _pct(tot.hit_rate.iloc[0]))
    c[1].metric("Prompt tokens", f"{int(tot.queries.iloc[0]):,}")
    c[2].metric("Cached tokens", f"{int(tot.hits.iloc[0]):,}")
    c[3].metric("Instances", f"{pre.instance.nunique():,}")
    st.subheader("Hit rate by model, instance and engine")
    t = hit_table(pre, by=["model", "instance", "engine_kind", "engine"]).sort_values(
        ["model", "instance"]
    )
    st.dataframe(
        t.style.format({"hit_rate": "{:.2%}", "hits": "{:,.0f}", "queries": "{:,.0f}"}),
        hide_index=True,
        width="stretch",
        key="engine-hit-table",
    )
    ts = hit_table(pre, by=["instance"], freq=_bucket(start, end))
    ts["time"] = pd.to_datetime(ts.bucket, unit="s")
    st.plotly_chart(
        px.line(
            ts,
            x="time",
            y="hit_rate",
            color="instance",
            range_y=[0, 1],
            markers=True,
            title="Prefix-cache hit rate by instance (token-weighted)",
        ),
        width="stretch",
    )
    left, right = st.columns(2)
    with left:
        src = frame("engine_cached_by_source", start, end)
        src = src[src.tokens > 0] if len(src) else src
        if src.empty:
            st.info(
                "No cached tokens by source in this range (vLLM `prompt_tokens_cached_by_source`, "
                "SGLang `cached_tokens_total{cache_source}`)."
            )
        else:
            s = src.groupby(["instance", "source"], as_index=False).tokens.sum()
            s["share"] = s.tokens / s.groupby("instance").tokens.transform("sum")
            st.plotly_chart(
                px.bar(
                    s,
                    x="instance",
                    y="share",
                    color="source",
                    range_y=[0, 1],
                    title="Cached-token share by source",
                ),
                width="stretch",
            )
    with right:
        kv = frame("engine_kv_usage", start, end)
        if kv.empty:
            st.info("No KV-cache usage in this range.")
        else:
            kv["time"] = pd.to_datetime(kv.ts, unit="s")
            st.plotly_chart(
                px.line(
                    kv,
                    x="time",
                    y="usage",
                    color="instance",
                    range_y=[0, 1],
                    markers=True,
                    title="KV-cache usage",
                ),
                width="stretch",
            )
    ttft = frame("engine_ttft", start, end)
    st.subheader("Time to first token")
    if ttft.empty:
        st.info(
            "No time-to-first-token histogram samples in this range (no requests, or the engine "
            "does not export `time_to_first_token_seconds`)."
        )
    else:
        last = (
            ttft.sort_values("ts")
            .groupby(["instance", "quantile"])
            .seconds.last()
            .unstack("quantile")
        )
        last.columns = [f"P{round(q * 100):d} (s)" for q in last.columns]
        st.dataframe(
            last.reset_index().style.format({c: "{:.3f}" for c in last.columns}),
            hide_index=True,
            width="stretch",
        )
        ttft["time"] = pd.to_datetime(ttft.ts, unit="s")
        ttft["series"] = (
            ttft.instance + " P" + (ttft["quantile"] * 100).round().astype(int).astype(str)
        )
        st.plotly_chart(
            px.line(
                ttft,
                x="time",
                y="seconds",
                color="series",
                markers=True,
                title="TTFT P50 / P95 / P99",
            ),
            width="stretch",
        )


def explorer(start: float, end: float) -> None:
    st.info(COLLECTORS_NOTE)
    pre = frame("engine_prefix", start, end)
    if pre.empty or pre.queries.sum() == 0:
        _no_engine_data()
    c1, c2 = st.columns(2)
    by = c1.selectbox("Group by", DIMS, key="engine-groupby")
    for d in DIMS:
        vals = sorted(pre[d].astype(str).unique())
        if len(vals) > 1 and d != by:
            pick = c2.multiselect(f"Filter {d}", vals, key=f"engine-filter-{d}")
            if pick:
                pre = pre[pre[d].astype(str).isin(pick)]
    freq = _bucket(start, end)
    t = hit_table(pre, by=[by], freq=freq)
    t["time"] = pd.to_datetime(t.bucket, unit="s")
    st.plotly_chart(
        px.line(
            t,
            x="time",
            y="hit_rate",
            color=by,
            range_y=[0, 1],
            markers=True,
            title=f"Prefix-cache hit rate by {by} (token-weighted, {freq // 60}-minute buckets)",
        ),
        width="stretch",
    )
    top = hit_table(pre, by=[by]).sort_values("queries", ascending=False)
    top["share of prompt tokens"] = top.queries / top.queries.sum()
    st.dataframe(
        top.style.format(
            {
                "hit_rate": "{:.2%}",
                "hits": "{:,.0f}",
                "queries": "{:,.0f}",
                "share of prompt tokens": "{:.1%}",
            }
        ),
        hide_index=True,
        width="stretch",
    )


def rootcause(start: float, end: float) -> None:
    from warmscope.analysis.rootcause import localize

    st.info(COLLECTORS_NOTE + " Here the change is localised over model × instance × engine.")
    pre = frame("engine_prefix", start, end)
    if pre.empty or pre.queries.sum() == 0:
        _no_engine_data()
    span_h = max((end - start) / 3600, 0.1)
    a0, a1 = st.slider(
        "Anomaly window (hours before the end)",
        0.0,
        span_h,
        (0.0, min(0.25, span_h / 2)),
        step=0.01,
        key="engine-rc-win",
    )
    anomaly = (end - a1 * 3600, end - a0 * 3600)
    length = anomaly[1] - anomaly[0]
    baseline = (anomaly[0] - length, anomaly[0])
    t = hit_table(pre, freq=_bucket(start, end))
    t["time"] = pd.to_datetime(t.bucket, unit="s")
    fig = px.line(
        t,
        x="time",
        y="hit_rate",
        range_y=[0, 1],
        markers=True,
        title="Prefix-cache hit rate (all engines)",
    )
    fig.add_vrect(
        x0=pd.Timestamp(anomaly[0], unit="s"),
        x1=pd.Timestamp(anomaly[1], unit="s"),
        fillcolor="red",
        opacity=0.12,
        line_width=0,
        annotation_text="anomaly",
    )
    fig.add_vrect(
        x0=pd.Timestamp(baseline[0], unit="s"),
        x1=pd.Timestamp(baseline[1], unit="s"),
        fillcolor="grey",
        opacity=0.12,
        line_width=0,
        annotation_text="baseline",
    )
    st.plotly_chart(fig, width="stretch")
    dims = ["model", "instance", "engine_kind"]
    cur = (
        pre[(pre.ts > anomaly[0]) & (pre.ts <= anomaly[1])].groupby(dims)[["hits", "queries"]].sum()
    )
    base = (
        pre[(pre.ts > baseline[0]) & (pre.ts <= baseline[1])]
        .groupby(dims)[["hits", "queries"]]
        .sum()
    )
    leaves = cur.join(base.add_suffix("_base"), how="outer").fillna(0.0).reset_index()
    # Expected: each leaf at its baseline hit rate, with the anomaly's prompt tokens.
    rate0 = np.where(
        leaves.queries_base > 0,
        leaves.hits_base / leaves.queries_base.where(leaves.queries_base > 0),
        np.nan,
    )
    leaves["hits_exp"] = np.nan_to_num(rate0 * leaves.queries, nan=0.0)
    leaves["queries_exp"] = np.where(np.isfinite(rate0), leaves.queries, 0.0)
    st.caption(
        f"Anomaly {fmt.when(anomaly[0])} → {fmt.when(anomaly[1])}; baseline "
        f"{fmt.when(baseline[0])} → {fmt.when(baseline[1])}"
    )

    def pct(x):
        return "no traffic" if not np.isfinite(x) else f"{x:.1%}"

    now_rate = (leaves.hits / leaves.queries.where(leaves.queries > 0)).to_numpy(float)
    show = leaves[dims].assign(
        queries=leaves.queries.map("{:,.0f}".format),
        hit_rate=[pct(x) for x in now_rate],
        baseline=[pct(x) for x in rate0],
    )
    st.dataframe(show, hide_index=True, width="stretch")
    st.subheader("Ranked explanations")
    if leaves.queries.sum() == 0 or leaves.queries_base.sum() == 0:
        st.info(
            "The anomaly window or the baseline before it holds no engine traffic, so there is no "
            "change to explain: move the anomaly window (the baseline is the same length just "
            "before it) or widen the time range."
        )
        st.caption(
            "Cold-start trap checks (bypass, key explosion, tenant isolation, warm-up timing) read "
            "per-key and per-tenant records: they need the warmscope collectors."
        )
        return
    loc = localize(
        leaves, dims, v_num="hits", v_den="queries", f_num="hits_exp", f_den="queries_exp"
    )
    if loc.error:
        st.warning(loc.error)
    elif not loc.causes:
        st.info(
            "; ".join(loc.notes)
            or "Nothing stands out: the change is spread thinly or within noise."
        )
    else:
        st.metric(
            "Hit rate in the anomaly window",
            f"{loc.observed:.1%}",
            f"{loc.observed - loc.expected:+.1%} vs expected",
        )
        rows = [
            {
                "cause": " · ".join(f"{k}={v}" for k, v in c.element.items()),
                "explains": c.explanatory_power,
                "score": c.score,
            }
            for c in loc.causes
        ]
        st.dataframe(
            pd.DataFrame(rows).style.format({"explains": "{:.0%}", "score": "{:.2f}"}),
            hide_index=True,
            width="stretch",
        )
    st.caption(
        "Cold-start trap checks (bypass, key explosion, tenant isolation, warm-up timing) read "
        "per-key and per-tenant records: they need the warmscope collectors."
    )


def alerts() -> None:
    """Alerts Prometheus itself evaluates (rules/engines.alerts.yml among them)."""
    st.caption(
        "Engine metrics only: the alert conditions below are the ones Prometheus evaluates from "
        "its rules (`rules/engines.alerts.yml` covers the engines). The conditions warmscope "
        "evaluates itself read collector records (tenants, warm-up runs, hot keys)."
    )
    try:
        got = data.external_alerts("prometheus")
    except data.SourceError as e:
        st.error(f"{e}.")
        st.stop()
    if got.empty:
        st.success(
            "Prometheus has no pending or firing alerts. (If it should, check that the rule files "
            "in `rules/` are loaded: Status → Rules in Prometheus.)"
        )
        st.stop()
    got = got.assign(_later=got.state != "firing").sort_values(
        ["_later", "alertname"], kind="stable"
    )
    for a in got.itertuples():
        icon = "🔴" if a.state == "firing" else "🟡"
        link = f" · [runbook]({a.runbook_url})" if str(a.runbook_url).startswith("http") else ""
        st.warning(f"{icon} **{a.alertname}** ({a.state}, {a.severity}) · {a.summary}{link}")
    st.stop()


def needs_collectors(what: str) -> None:
    """A page whose figures exist only with the collectors: say so and stop."""
    st.info(
        f"{what} come from the warmscope collectors (`collectors.setup()` in the serving code, "
        "with `WARMSCOPE_REDIS_URL` or the embedded store for per-key records). This deployment "
        "exports engine metrics only: the **Overview**, **Hit rate explorer** and **Root cause** "
        "pages show the engines' prefix-cache hit rate, cached tokens by source, TTFT and KV-cache "
        "usage."
    )
    st.stop()


def ab_advice() -> None:
    st.info(
        "A/B reports need per-unit records (a session is the unit): set `experiment`, `variant` "
        "and `unit` in `collectors.request_context(...)` in the serving code and "
        "`WARMSCOPE_REDIS_URL` so the records reach Redis. With engine metrics only, Prometheus "
        "cannot tell which request belonged to which variant; if each variant runs on its own "
        "instances, compare their token-weighted hit rates on the **Hit rate explorer** grouped by "
        "instance — as a before/after view, not a randomised test."
    )
    st.stop()
