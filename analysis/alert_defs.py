"""Alert conditions, defined once: the thresholds that :mod:`analysis.alerts`
evaluates over the store's frames and the Prometheus alerting rules in
``rules/warmscope.alerts.yml``, which :func:`render_rules` writes from the
same definitions (a test checks the shipped file equals it, and runs both on
the same data through promtool to compare what fires).

=============================  ==========================================================  =========
alert (rule name)              condition                                                   severity
=============================  ==========================================================  =========
HitRateRegression              a layer's hit rate at least ``HIT_RATE_DROP`` (20 %)        warning;
(…ShortTerm, …Daily)           below the baseline: in Prometheus the last 5 min vs an      critical
                               hour ago / a day ago, held ``for`` 10 / 15 min; in the      past 50 %
                               evaluator the latest third of the range vs the third
                               before it, gated by a two-proportion test at p < 0.01
                               (the evaluator's ``for``)
WarmupROINegative              warm-up spent more GPU-s in the last hour than it saved     warning
WarmSetPrecisionLow            under ``WARM_PRECISION_MIN`` (30 %) of a warm set is read   warning
TrafficBeforeWarmupComplete    a replica serves while its warm-up runs                     warning
CrossTenantCacheRead           any key of a tenant-scoped layer read by two or more        critical
                               tenants: fires at once (``for: 0s``) and holds an hour
BypassSpike                    more than ``BYPASS_SHARE`` (5 %) of a layer's lookups       warning
                               bypass the cache, and it did not an hour before
TelemetryDropping              the collectors swallow errors                               warning
TokenUsageUnmeasured           over ``UNMEASURED_SHARE`` (5 %) of a tenant's requests      warning
                               carry no token usage (left out of token hit rates), 15 min
KVEvictedShareHigh             over ``KV_EVICTED_SHARE`` (30 %) of a tenant's missed       warning
                               prefix-KV tokens were evicted before reuse, for 30 min
                               (Prometheus only: the Why misses page shows the share)
=============================  ==========================================================  =========

The engine alerts (``rules/engines.alerts.yml``, :func:`render_engine_rules`) are
defined here too, in :data:`ENGINE_ALERTS`: they read the engine series that
``rules/engines.rules.yml`` maps from vLLM, SGLang and LMCache and have no
evaluator of their own (the dashboard's engine mode shows what Prometheus
fires). Their runbook links are absolute (:data:`RUNBOOK_BASE`):

=====================================  ============================================  ========
rule                                   condition                                     severity
=====================================  ============================================  ========
WarmscopeEngineHitRateRegression…      token-weighted prefix hit rate                warning
(…ShortTerm, …Daily)                   ``HIT_RATE_DROP`` (20 %) below an hour / a
                                       day ago while prompts arrive; 10 / 15 min
WarmscopeEngineKVCacheSaturated        KV-cache usage over ``ENGINE_KV_SATURATED``   warning
                                       (95 %) for 10 min
WarmscopeEngineTTFTSLOBurn             the TTFT SLO (``ENGINE_TTFT_SLO_TARGET`` =    critical
                                       99 % within ``ENGINE_TTFT_SLO_S`` = 1 s)
                                       burns ``ENGINE_BURN_RATE`` (14.4×) too fast
                                       on both the 5 min and the 1 h window
=====================================  ============================================  ========
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AlertDef",
    "ALERTS",
    "HIT_RATE_DROP",
    "HIT_RATE_CRITICAL_DROP",
    "HIT_RATE_P",
    "WARM_PRECISION_MIN",
    "WARM_MIN_KEYS",
    "BYPASS_SHARE",
    "BYPASS_FOR_S",
    "render_rules",
    "by_rule",
    "ENGINE_ALERTS",
    "ENGINE_KV_SATURATED",
    "ENGINE_TTFT_SLO_S",
    "ENGINE_TTFT_SLO_TARGET",
    "ENGINE_BURN_RATE",
    "render_engine_rules",
    "RUNBOOK_BASE",
    "UNMEASURED_SHARE",
    "KV_EVICTED_SHARE",
]

HIT_RATE_DROP = 0.20  # relative fall of a layer's hit rate that raises HitRateRegression
HIT_RATE_CRITICAL_DROP = 0.50  # ... and makes it critical (evaluator)
HIT_RATE_P = (
    0.01  # the evaluator's significance gate (Prometheus holds the condition `for` instead)
)
WARM_PRECISION_MIN = 0.30  # share of a warm set read before it is called wasted
WARM_MIN_KEYS = 10  # the evaluator judges runs that warmed at least this many keys
UNMEASURED_SHARE = (
    0.05  # share of a tenant's requests without token usage that raises TokenUsageUnmeasured
)
BYPASS_SHARE = 0.05  # share of a layer's lookups that bypass the cache
BYPASS_FOR_S = 600.0  # held this long (the rule's `for`)
ENGINE_KV_SATURATED = 0.95  # KV-cache usage share past which prefix blocks are evicted before reuse
ENGINE_TTFT_SLO_S = (
    1.0  # the TTFT SLO's bound (the `le` bucket engines.rules.yml counts misses above)
)
ENGINE_TTFT_SLO_TARGET = 0.99  # share of requests that must see their first token within the bound
ENGINE_BURN_RATE = 14.4  # error-budget burn rate that pages: 2 % of a 30-day budget in one hour
# Share of a tenant's missed prefix-KV tokens evicted before reuse: above it, the cache is
# too small.
KV_EVICTED_SHARE = 0.30
RUNBOOK_BASE = (
    "https://github.com/warmscope/warmscope/blob/main/docs/runbooks.md"  # the engine rules' links
)


@dataclass(frozen=True)
class AlertDef:
    name: str  # the evaluator's alert name (and the runbook's heading)
    rule: str  # the Prometheus alert
    expr: str
    for_: str
    severity: str
    summary: str
    description: str
    runbook: str  # anchor in docs/runbooks.md
    comment: str = ""


def _pct(x: float) -> str:
    return f"{x:.0%}"


ALERTS: tuple[AlertDef, ...] = (
    AlertDef(
        "HitRateRegression",
        "WarmscopeHitRateRegressionDaily",
        f"warmscope:layer_hit_ratio:rate5m < {1 - HIT_RATE_DROP:g} * "
        "(warmscope:layer_hit_ratio:rate5m offset 1d)",
        "15m",
        "warning",
        f"Hit rate of layer {{{{ $labels.warmscope_cache_layer }}}} is {_pct(HIT_RATE_DROP)} below "
        "the same time yesterday",
        "Now {{ $value | humanizePercentage }}. Open the Root cause page for the window.",
        "hit-rate-regression",
    ),
    AlertDef(
        "HitRateRegression",
        "WarmscopeHitRateRegressionShortTerm",
        f"warmscope:layer_hit_ratio:rate5m < {1 - HIT_RATE_DROP:g} * "
        "(warmscope:layer_hit_ratio:rate5m offset 1h)",
        "10m",
        "warning",
        "Hit rate of layer {{ $labels.warmscope_cache_layer }} fell "
        f"{_pct(HIT_RATE_DROP)} within the hour",
        "Now {{ $value | humanizePercentage }}.",
        "hit-rate-regression",
    ),
    AlertDef(
        "WarmupROINegative",
        "WarmscopeWarmupROINegative",
        "sum(warmscope:warmup_gpu_seconds:increase1h) > "
        "sum(warmscope:gpu_seconds_saved:increase1h)",
        "30m",
        "warning",
        "Warm-up spent more GPU-seconds in the last hour than it saved",
        "Spent {{ $value | humanize }} GPU-s; the treatment saved less (compute ROI < 0).",
        "warm-up-roi-negative",
    ),
    AlertDef(
        "WarmSetPrecisionLow",
        "WarmscopeWarmSetPrecisionLow",
        f"warmscope:warmset_precision:ratio1h < {WARM_PRECISION_MIN:g}",
        "30m",
        "warning",
        "Warm-up strategy {{ $labels.warmscope_warmup_strategy }} on "
        "{{ $labels.warmscope_cache_layer }}: "
        f"under {_pct(WARM_PRECISION_MIN)} of warmed keys are read",
        "Precision {{ $value | humanizePercentage }}: most warm-up work is wasted.",
        "warm-set-precision-low",
    ),
    AlertDef(
        "TrafficBeforeWarmupComplete",
        "WarmscopeTrafficBeforeWarmupComplete",
        "sum by (warmscope_replica) (warmscope_warmup_active) > 0\nand on (warmscope_replica)\n"
        "sum by (warmscope_replica) (rate(warmscope_cache_lookups_total[2m])) > 0",
        "5m",
        "warning",
        "Replica {{ $labels.warmscope_replica }} serves traffic while its warm-up is still running",
        "Gate traffic on warm-up completion (readiness probe) or warm before the replica joins.",
        "traffic-before-warm-up-completes",
    ),
    AlertDef(
        "CrossTenantCacheRead",
        "WarmscopeCrossTenantCacheRead",
        "sum by (warmscope_cache_layer) "
        "(increase(warmscope_cache_cross_tenant_keys_total[1h])) > 0",
        "0s",
        "critical",
        "SECURITY: cache keys in {{ $labels.warmscope_cache_layer }} are read by "
        "more than one tenant",
        "Keys read by two or more tenants appeared in the last hour: keys lack a "
        "tenant scope (data leak).",
        "cross-tenant-cache-read",
        comment=(
            "A data leak: fire at the first evaluation (`for: 0s`), and keep firing for an hour "
            "after the\n"
            "last shared key so that one short leak is not missed between two looks at the page."
        ),
    ),
    AlertDef(
        "CacheBypassSpike",
        "WarmscopeBypassSpike",
        f"warmscope:layer_bypass_ratio:rate5m > {BYPASS_SHARE:g}\n"
        f"unless (warmscope:layer_bypass_ratio:rate5m offset 1h) > {BYPASS_SHARE:g}",
        f"{BYPASS_FOR_S / 60:.0f}m",
        "warning",
        "{{ $value | humanizePercentage }} of {{ $labels.warmscope_cache_layer }} "
        "lookups bypass the cache",
        "A middleware path (cache-control: no-cache, skip flags) started skipping the cache.",
        "bypass-spike",
    ),
    AlertDef(
        "TelemetryDropping",
        "WarmscopeTelemetryDropping",
        "sum(rate(warmscope_telemetry_errors_total[5m])) > 0",
        "5m",
        "warning",
        "warmscope collectors are swallowing errors",
        "Telemetry is incomplete: check the store, Redis and the exporter (stage label).",
        "telemetry-dropping",
    ),
    AlertDef(
        "TokenUsageUnmeasured",
        "WarmscopeTokenUsageUnmeasured",
        "sum by (warmscope_tenant) (rate(warmscope_requests_unmeasured_total[15m]))\n"
        "/ sum by (warmscope_tenant) (rate(warmscope_requests_total[15m]))\n"
        f"> {UNMEASURED_SHARE:g}",
        "15m",
        "warning",
        "{{ $value | humanizePercentage }} of tenant {{ $labels.warmscope_tenant }}'s requests "
        "carry no token usage",
        "Their tokens are left out of the token hit rates: streams sent with "
        "stream_options.include_usage false, or an engine without prompt token details.",
        "token-usage-unmeasured",
    ),
    AlertDef(
        "KVEvictedShareHigh",
        "WarmscopeKVEvictedShareHigh",
        'warmscope:kv_miss_class_share:rate5m{warmscope_kv_miss_class="evicted"}'
        f" > {KV_EVICTED_SHARE:g}",
        "30m",
        "warning",
        "Tenant {{ $labels.warmscope_tenant }}: {{ $value | humanizePercentage }} of missed "
        "prefix-KV tokens were evicted before reuse",
        "Prefixes are stored, then evicted before their next reader: the KV cache is too "
        "small for this traffic, or warm-up pushes out what traffic needs. Open the Why "
        "misses page.",
        "kv-evicted-share-high",
        comment=f"Prefix-KV capacity: more than {_pct(KV_EVICTED_SHARE)} of a tenant's missed "
        "tokens were stored before and gone\nwhen requested, for half an hour.",
    ),
)


_ENGINE_WHO = (
    "{{ $labels.warmscope_engine }} model {{ $labels.gen_ai_request_model }} on "
    "{{ $labels.instance }}"
)
_ENGINE_HIT = "warmscope:engine_prefix_hit_ratio:rate5m"
_BUDGET = 1 - ENGINE_TTFT_SLO_TARGET

ENGINE_ALERTS: tuple[AlertDef, ...] = (
    AlertDef(
        "EngineHitRateRegression",
        "WarmscopeEngineHitRateRegressionShortTerm",
        f"{_ENGINE_HIT} < {1 - HIT_RATE_DROP:g} * ({_ENGINE_HIT} offset 1h)\n"
        "and warmscope:engine_prefix_query_tokens:rate5m > 0",
        "10m",
        "warning",
        f"Prefix-cache hit rate of {_ENGINE_WHO} fell {_pct(HIT_RATE_DROP)} within the hour",
        "Token-weighted hit rate now {{ $value | humanizePercentage }}.",
        "engine-hit-rate-regression",
    ),
    AlertDef(
        "EngineHitRateRegression",
        "WarmscopeEngineHitRateRegressionDaily",
        f"{_ENGINE_HIT} < {1 - HIT_RATE_DROP:g} * ({_ENGINE_HIT} offset 1d)\n"
        "and warmscope:engine_prefix_query_tokens:rate5m > 0",
        "15m",
        "warning",
        f"Prefix-cache hit rate of {_ENGINE_WHO} is {_pct(HIT_RATE_DROP)} below "
        "the same time yesterday",
        "Token-weighted hit rate now {{ $value | humanizePercentage }}.",
        "engine-hit-rate-regression",
    ),
    AlertDef(
        "EngineKVCacheSaturated",
        "WarmscopeEngineKVCacheSaturated",
        f"warmscope:engine_kv_cache_usage:ratio > {ENGINE_KV_SATURATED:g}",
        "10m",
        "warning",
        "KV cache of {{ $labels.warmscope_engine }} on {{ $labels.instance }} is over "
        f"{_pct(ENGINE_KV_SATURATED)} full",
        "Usage {{ $value | humanizePercentage }}: prefix blocks are evicted before they are "
        "reused.",
        "engine-kv-cache-saturated",
    ),
    AlertDef(
        "EngineTTFTSLOBurn",
        "WarmscopeEngineTTFTSLOBurn",
        f"warmscope:engine_ttft_slo_miss:ratio_rate5m > {ENGINE_BURN_RATE:g} * {_BUDGET:g}\n"
        f"and warmscope:engine_ttft_slo_miss:ratio_rate1h > {ENGINE_BURN_RATE:g} * {_BUDGET:g}",
        "2m",
        "critical",
        "Time to first token on {{ $labels.instance }} burns its SLO budget "
        f"{ENGINE_BURN_RATE:.0f}× too fast",
        "{{ $value | humanizePercentage }} of requests took over "
        f"{ENGINE_TTFT_SLO_S:g} s to their first token (SLO: {_pct(_BUDGET)}).",
        "engine-ttft-slo-burn",
        comment=f"SLO: {_pct(ENGINE_TTFT_SLO_TARGET)} of requests see their first token within "
        f"{ENGINE_TTFT_SLO_S:g} s. Burn rate {ENGINE_BURN_RATE:g}\n"
        "on both the 5-minute and the 1-hour window "
        f"({_pct(ENGINE_BURN_RATE / (30 * 24))} of a 30-day budget per hour).",
    ),
)


def by_rule(rule: str) -> AlertDef:
    return next(a for a in ALERTS if a.rule == rule)


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_rules() -> str:
    """``rules/warmscope.alerts.yml`` from :data:`ALERTS` (runbook links relative;
    ``warmscope rules --runbook-base`` makes them absolute)."""
    head = [
        "# Generated from analysis/alert_defs.py (the evaluator reads the same "
        "thresholds); edit it there and",
        "# write this file with `python -m warmscope.analysis.alert_defs > "
        "rules/warmscope.alerts.yml`.",
    ]
    return _render(head, "warmscope-alerts", ALERTS, "docs/runbooks.md")


def render_engine_rules() -> str:
    """``rules/engines.alerts.yml`` from :data:`ENGINE_ALERTS` (runbook links on
    :data:`RUNBOOK_BASE`)."""
    head = [
        "# Generated from analysis/alert_defs.py; edit it there and write this file with",
        "# `python -m warmscope.analysis.alert_defs --engines > rules/engines.alerts.yml`.",
        "# Alerts on the engine series of engines.rules.yml (vLLM, SGLang, LMCache):",
        "# they work with no warmscope instrumentation at all. runbook_url is absolute;",
        "# `warmscope rules --runbook-base URL --out DIR` writes these files with your",
        "# own copy of docs/runbooks.md as the base.",
    ]
    return _render(head, "warmscope-engine-alerts", ENGINE_ALERTS, RUNBOOK_BASE)


def _render(head: list[str], group: str, alerts: tuple[AlertDef, ...], base: str) -> str:
    out = head + ["groups:", f"  - name: {group}", "    interval: 30s", "    rules:"]
    for a in alerts:
        out.append(f"      - alert: {a.rule}")
        out += [f"        # {line}" for line in a.comment.splitlines()]
        if "\n" in a.expr:
            out.append("        expr: >")
            out += [f"          {line}" for line in a.expr.splitlines()]
        else:
            out.append(f"        expr: {a.expr}")
        out += [
            f"        for: {a.for_}",
            f"        labels: {{severity: {a.severity}}}",
            "        annotations:",
            f"          summary: {_q(a.summary)}",
            f"          description: {_q(a.description)}",
            f"          runbook_url: {_q(base + '#' + a.runbook)}",
        ]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    import sys

    print(render_engine_rules() if sys.argv[1:] == ["--engines"] else render_rules(), end="")
