"""Engine-only mode: what is particular to a Prometheus holding inference-engine metrics (vLLM,
SGLang, LMCache) but no warmscope collector series. The pages draw this mode with their own code.

The engines' prefix-cache counters (:meth:`sources.prometheus.PrometheusSource.engine_frame`,
``engine_prefix``) read as lookup rows (:func:`as_lookups`: hit and missed prompt tokens by model,
instance and engine), so the overview, the hit-rate explorer and root cause run the same analysis
(``analysis.hitrate.hit_table``, ``analysis.drilldown``) through ``cached.rates`` and
``cached.engine_causes`` with ``engine=True``: the token-weighted hit rate. What only the
collectors can give — tenants, key families, warm-up runs, hot keys, A/B unit records — is named
as such (:func:`needs_collectors`) instead of being drawn as empty charts.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st
from warmscope.app.dashboard import data, state

__all__ = [
    "DIMS",
    "COLLECTORS_NOTE",
    "active",
    "as_lookups",
    "lookups",
    "bucket",
    "frame",
    "hit_table",
    "no_engine_data",
    "needs_collectors",
    "ab_advice",
    "alerts",
    "no_unit_records",
    "only_engines",
]

# The dimensions of the engines' counters (the hit-rate explorer's and root cause's in this mode).
DIMS = ("instance", "model", "engine_kind", "engine")
COLLECTORS_NOTE = (
    "Engine metrics only: Prometheus holds the engines' own counters and no warmscope collector "
    "series. Figures by **tenant** and **key family**, **warm-up runs**, **hot keys** and **A/B** "
    "reports need the warmscope collectors in the serving code (`collectors.setup()` with "
    "`WARMSCOPE_EXPORTER=prometheus` or `otlp`; see docs/operate/prometheus.md)."
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
    return bool(state.load(["lookups"], start, end)["lookups"].empty)


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


def as_lookups(prefix: pd.DataFrame) -> pd.DataFrame:
    """The ``engine_prefix`` frame as lookup rows: per row, a ``hit`` row counting the cached
    prompt tokens and a ``miss`` row the others, so that ``hits / (hits + misses)`` is the
    token-weighted hit rate (cached prompt tokens / prompt tokens)."""
    keys = ["ts", *DIMS]
    hit = prefix[keys].assign(result="hit", count=prefix["hits"].to_numpy(float))
    miss = prefix[keys].assign(
        result="miss", count=(prefix["queries"] - prefix["hits"]).clip(lower=0).to_numpy(float)
    )
    return pd.concat([hit, miss], ignore_index=True)


def lookups(start: float, end: float) -> pd.DataFrame:
    """The engines' prefix-cache counters over [start, end) as lookup rows (:func:`as_lookups`);
    raises ``data.SourceError`` as ``data.frame`` does."""
    return as_lookups(data.frame("engine_prefix", start, end))


def hit_table(
    df: pd.DataFrame, by: list[str] | None = None, freq: float | None = None
) -> pd.DataFrame:
    """Token-weighted hit rate of an ``engine_prefix`` frame per group (and time bucket):
    columns ``by``, ``bucket`` with ``freq``, ``hits``, ``queries``, ``hit_rate`` — the same
    ``analysis.hitrate.hit_table`` the collector lookups go through."""
    from warmscope.analysis.hitrate import hit_table as table

    by = list(by or [])
    t = table(as_lookups(df), by=by, freq=freq).rename(columns={"lookups": "queries"})
    return t[[*by, *(["bucket"] if freq else []), "hits", "queries", "hit_rate"]]


def bucket(start: float, end: float) -> int:
    """The time bucket of engine charts: about 120 per range, at least a minute (scrapes are a
    few seconds apart, and an engine test's phases last minutes)."""
    return max(60, int(state.step(start, end) or 0), int((end - start) / 120 // 60 * 60))


def no_engine_data() -> None:
    """Say that Prometheus holds no engine metrics either, and stop the page."""
    st.info(
        "Prometheus holds neither warmscope collector series nor engine metrics (vLLM "
        "`vllm:prefix_cache_*`, SGLang `sglang:cached_tokens_total`, LMCache "
        "`lmcache:num_hit_tokens`) in this range. Check that Prometheus scrapes the engines' "
        "`/metrics` and widen the time range."
    )
    st.stop()


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
