"""Grafana dashboards generated from warmscope's own definitions (``warmscope grafana --out DIR``).

Nothing here is hand-written JSON. The dashboards are data (:data:`DASHBOARDS`): each panel is a
:class:`PanelDef` (title, kind, queries, unit, ...), turned into JSON by one small function
(:func:`build`). Its PromQL is built from

* the recorded series of ``rules/*.yml`` — :meth:`Names.check` fails when the rule files no longer
  record one a panel reads (renaming a rule breaks generation and a test);
* the alert names and thresholds of :mod:`warmscope.analysis.alert_defs`;
* the instrument and label names of :mod:`warmscope.model.schema`;

and is turned into a dashboard by the Grafana Foundation SDK's builders. Three dashboards:

``warmscope-overview``  hit rate by layer and tenant, bypass share, warm-set precision, warm-up
                        GPU-s against GPU-s saved (compute ROI), the alerts firing or pending;
                        warm-up runs as annotations.
``warmscope-engines``   per-engine prefix hit ratio, cached tokens by source, KV-cache usage, TTFT
                        quantiles and SLO burn, and vLLM's KV-block residency histograms.
``warmscope-kv-misses`` block-level miss classes (``warmscope_kv_missed_tokens_total``) and block
                        stores, reuses, evictions and residency per engine and salt.

Each dashboard has a ``datasource`` variable (any Prometheus-compatible datasource). A panel whose
series is absent shows a ``noValue`` text naming the rule file to load; a dashboard generated with
``check`` (``--prometheus URL``) against a datasource that lacks series the panels read starts with
a text panel saying which, instead of a page of empty graphs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warmscope.analysis import alert_defs as ad
from warmscope.collectors import genai
from warmscope.model import schema
from warmscope.model.records import ATTR, prom_label

__all__ = [
    "RULES_DIR",
    "GrafanaError",
    "Names",
    "Query",
    "PanelDef",
    "DashboardDef",
    "DASHBOARDS",
    "definitions",
    "build",
    "render",
    "write",
    "missing_series",
    "panel_reads",
    "MISS_CLASSES",
    "KV_MISSED",
    "KV_BLOCKS",
    "KV_RESIDENT",
    "RESIDENCY",
]

RULES_DIR = Path(__file__).resolve().parents[1] / "rules"
DS = "${datasource}"  # every panel's datasource: the dashboard's datasource variable

# Block-level KV series (the KV-block source): missed prompt tokens by why they missed, and the
# blocks stored, reused, evicted and resident per engine and cache salt.
MISS_CLASSES = ("cold", "drifted", "isolated", "evicted", "elsewhere", "partial")
KV_MISSED = "warmscope_kv_missed_tokens_total"  # {tenant, engine, miss_class}
KV_BLOCKS = {
    k: f"warmscope_kv_blocks_{k}_total" for k in ("stored", "reused", "evicted")
}  # {engine, salt}
KV_RESIDENT = "warmscope_kv_blocks_resident"  # {engine, salt}
# vLLM's KV-block residency histograms (either name form, as engines.rules.yml matches them).
RESIDENCY = (
    ("vllm:kv_block_lifetime_seconds", "KV block lifetime"),
    ("vllm:kv_block_idle_before_evict_seconds", "KV block idle time before eviction"),
    ("vllm:kv_block_reuse_gap_seconds", "KV block reuse gap"),
)

TENANT, LAYER, RESULT = prom_label(ATTR.TENANT), prom_label(ATTR.LAYER), prom_label(ATTR.RESULT)
STRATEGY, REPLICA, MODEL = (
    prom_label(ATTR.STRATEGY),
    prom_label(ATTR.REPLICA),
    prom_label(ATTR.MODEL),
)
ENGINE = "warmscope_engine"  # engines.rules.yml's label of the engine kind
KINDS = ("timeseries", "stat", "table", "heatmap", "bargauge")


class GrafanaError(Exception):
    """The definitions do not match the rule files (or no rule files were found)."""


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    instant: bool = False


@dataclass(frozen=True)
class PanelDef:
    title: str
    kind: str  # one of KINDS: timeseries / heatmap read a range; stat / table / bargauge an instant
    queries: tuple[Query, ...]
    unit: str = "short"
    description: str = ""
    thresholds: tuple[float, ...] = ()  # drawn as dashed lines (timeseries) or colour steps
    stack: bool = False
    width: int = 12
    no_value: str = ""  # shown instead of an empty panel


@dataclass(frozen=True)
class DashboardDef:
    uid: str
    title: str
    description: str
    panels: tuple[PanelDef, ...]
    variables: tuple[tuple[str, str], ...] = ()  # (name, label_values(...) query)
    annotations: tuple[tuple[str, str, str], ...] = ()  # (name, PromQL, colour)
    tags: tuple[str, ...] = field(default=("warmscope",))


class Names:
    """The recorded series and the alerts of the rule files in ``rules_dir``; :meth:`check`
    checks a dashboard against them."""

    def __init__(self, rules_dir: Path = RULES_DIR) -> None:
        import yaml

        files = sorted(Path(rules_dir).glob("*.yml")) if Path(rules_dir).is_dir() else []
        if not files:
            raise GrafanaError(
                f"no rule files in {rules_dir}: run from a warmscope checkout or pass --rules DIR"
            )
        self.recorded: dict[str, str] = {}
        self.alerts: set[str] = set()
        for f in files:
            for g in (yaml.safe_load(f.read_text()) or {}).get("groups", []):
                for r in g.get("rules", []):
                    if "record" in r:
                        self.recorded.setdefault(r["record"], f.name)
                    elif "alert" in r:
                        self.alerts.add(r["alert"])

    def check(self, d: DashboardDef) -> None:
        """:class:`GrafanaError` naming the recorded series ``d`` reads that no rule records
        (renaming a rule breaks generation), or the alerts it selects that no rule defines."""
        exprs = [q.expr for p in d.panels for q in p.queries]
        exprs += [q for _, q in d.variables] + [e for _, e, _ in d.annotations]
        reads = {r for e in exprs for r in _reads(e) if r.startswith("warmscope:")}
        missing = sorted(reads - set(self.recorded))
        if missing:
            raise GrafanaError(
                f"no rule records {', '.join(map(repr, missing))} (the dashboards read "
                f"{'it' if len(missing) == 1 else 'them'}); rule files record: "
                + ", ".join(sorted(self.recorded))
            )
        for name in (a.rule for a in ad.ALERTS + ad.ENGINE_ALERTS):
            if name not in self.alerts:
                raise GrafanaError(
                    f"no rule file defines the alert {name!r} (analysis/alert_defs.py does)"
                )


def _both(name: str) -> tuple[str, str]:
    """The colon and the escaped form of an engine metric name."""
    return name, name.replace(":", "_")


def _rate_sum(by: str, name: str, sel: str = "", rng: str = "$__rate_interval") -> str:
    a, b = _both(name)
    return f"sum by ({by}) (rate({a}{sel}[{rng}])) or sum by ({by}) (rate({b}{sel}[{rng}]))"


def _alerts(rules: Iterable[ad.AlertDef]) -> str:
    return "|".join(a.rule for a in rules)


# ---- the dashboards, as data --------------------------------------------------------------------
# Each panel: title, kind, queries, unit, description, thresholds, and its empty-panel text. The
# recorded series (``warmscope:...``) are checked against the rule files when generating (Names).

_LOAD = "load rules/warmscope.rules.yml into this datasource's Prometheus"
_LOOKUPS = "warmscope:cache_lookups:rate5m"
_SPENT, _SAVED = "warmscope:warmup_gpu_seconds:increase1h", "warmscope:gpu_seconds_saved:increase1h"
_HIT_BY = f"{TENANT}, {LAYER}"
_HIT_FLT = f'{TENANT}=~"$tenant", {LAYER}=~"$layer"'
_RUNS, _BY_RUN = schema.prom_name(schema.WARMUP_RUNS), f"{LAYER}, {STRATEGY}, {REPLICA}"

OVERVIEW = DashboardDef(
    "warmscope-overview",
    "warmscope — overview",
    "Cache hit rates, warm-up effect and alerts from warmscope's recorded series "
    "(rules/warmscope.rules.yml).",
    (
        PanelDef(
            "Hit rate by layer",
            "timeseries",
            (Query(f'warmscope:layer_hit_ratio:rate5m{{{LAYER}=~"$layer"}}', f"{{{{{LAYER}}}}}"),),
            "percentunit",
            "hits / (hits + misses) per cache layer, 5-minute rate.",
            no_value=f"no warmscope:layer_hit_ratio:rate5m — {_LOAD}",
        ),
        PanelDef(
            "Hit rate by tenant × layer",
            "timeseries",
            (
                Query(
                    f'sum by ({_HIT_BY}) ({_LOOKUPS}{{{_HIT_FLT}, {RESULT}="hit"}})\n/ '
                    f'sum by ({_HIT_BY}) ({_LOOKUPS}{{{_HIT_FLT}, {RESULT}=~"hit|miss"}})',
                    f"{{{{{TENANT}}}}} {{{{{LAYER}}}}}",
                ),
            ),
            "percentunit",
            "From the recorded lookup rates, summed over key families and variants.",
            no_value=f"no warmscope:cache_lookups:rate5m — {_LOAD}",
        ),
        PanelDef(
            "Lookups bypassing the cache",
            "timeseries",
            (
                Query(
                    f'warmscope:layer_bypass_ratio:rate5m{{{LAYER}=~"$layer"}}\nor '
                    f'0 * warmscope:layer_hit_ratio:rate5m{{{LAYER}=~"$layer"}}',
                    f"{{{{{LAYER}}}}}",
                ),
            ),
            "percentunit",
            "Share of a layer's lookups that skip the cache (0 for a layer with lookups "
            f"and no bypass; alert above {ad.BYPASS_SHARE:.0%}).",
            (ad.BYPASS_SHARE,),
            no_value=f"no bypass ratio — {_LOAD}",
        ),
        PanelDef(
            "Warm-set precision (1 h)",
            "timeseries",
            (
                Query(
                    f'warmscope:warmset_precision:ratio1h{{{LAYER}=~"$layer"}}',
                    f"{{{{{STRATEGY}}}}} {{{{{LAYER}}}}}",
                ),
            ),
            "percentunit",
            f"Warmed keys read at least once / warmed keys (alert under "
            f"{ad.WARM_PRECISION_MIN:.0%}).",
            (ad.WARM_PRECISION_MIN,),
            no_value=f"no warm-up runs recorded — {_LOAD}",
        ),
        PanelDef(
            "Warm-up GPU-s spent vs saved (1 h)",
            "timeseries",
            (
                Query(f"sum({_SPENT})", "spent warming"),
                Query(f"sum({_SAVED})", "saved (treatment vs control)"),
            ),
            "s",
            "GPU-seconds spent by warm-up runs and saved by the treatment variant in the "
            "last hour.",
            no_value=f"no warm-up or A/B series — {_LOAD}",
        ),
        PanelDef(
            "Compute ROI (1 h)",
            "stat",
            (Query(f"(sum({_SAVED}) - sum({_SPENT})) / (sum({_SPENT}) > 0)", "ROI", instant=True),),
            "percentunit",
            "(GPU-s saved − GPU-s spent warming) / GPU-s spent warming, last hour. "
            "Negative: WarmscopeWarmupROINegative.",
            (0.0,),
            width=6,
            no_value="no ROI: no warm-up GPU-s spent in the hour, or no A/B experiment "
            "with variants A and B",
        ),
        PanelDef(
            "Alerts firing or pending",
            "table",
            (
                Query(
                    f"sum by (alertname, alertstate, severity, {LAYER}, instance) "
                    f'(ALERTS{{alertname=~"{_alerts(ad.ALERTS + ad.ENGINE_ALERTS)}"}})',
                    instant=True,
                ),
            ),
            "short",
            "warmscope's alerting rules (analysis/alert_defs.py) as Prometheus evaluates them; "
            "runbooks in docs/runbooks.md.",
            width=18,
            no_value="no warmscope alert firing or pending",
        ),
    ),
    variables=(
        ("tenant", f"label_values({_LOOKUPS}, {TENANT})"),
        ("layer", f"label_values({_LOOKUPS}, {LAYER})"),
    ),
    # a run ends: its counter grows, or appears (a label set's first run: increase() misses it)
    annotations=(
        (
            "Warm-up runs",
            f"sum by ({_BY_RUN}) (increase({_RUNS}[1m])) > 0\n"
            f"or sum by ({_BY_RUN}) ({_RUNS} unless {_RUNS} offset 1m)",
            "green",
        ),
        (
            "warmscope alerts",
            f'ALERTS{{alertname=~"{_alerts(ad.ALERTS + ad.ENGINE_ALERTS)}", alertstate="firing"}}',
            "orange",
        ),
    ),
)

_ENGINES_LOAD = "load rules/engines.rules.yml and scrape the engines' /metrics"
_WHO = f"{{{{{ENGINE}}}}} {{{{instance}}}} {{{{engine}}}}"
_BUDGET = 1 - ad.ENGINE_TTFT_SLO_TARGET

ENGINES = DashboardDef(
    "warmscope-engines",
    "warmscope — engines",
    "vLLM, SGLang and LMCache through rules/engines.rules.yml: no warmscope "
    "instrumentation needed.",
    (
        PanelDef(
            "Prefix-cache hit ratio per engine",
            "timeseries",
            (Query("warmscope:engine_prefix_hit_ratio:rate5m", _WHO),),
            "percentunit",
            "Token-weighted: prompt tokens served from the prefix cache / prompt tokens.",
            no_value=f"no engine hit ratio — {_ENGINES_LOAD}",
        ),
        PanelDef(
            "Cached prompt tokens by source",
            "timeseries",
            (
                Query(
                    "warmscope:engine_cached_tokens_by_source:rate5m",
                    f"{{{{{ENGINE}}}}} {{{{instance}}}} {{{{source}}}}",
                ),
            ),
            "short",
            "Tokens/s served from each cache tier (device, host, …).",
            stack=True,
            no_value=f"no cached tokens by source — {_ENGINES_LOAD}",
        ),
        PanelDef(
            "KV-cache usage",
            "timeseries",
            (Query("warmscope:engine_kv_cache_usage:ratio", _WHO),),
            "percentunit",
            f"Share of KV-cache blocks in use (alert over {ad.ENGINE_KV_SATURATED:.0%}).",
            (ad.ENGINE_KV_SATURATED,),
            no_value=f"no KV-cache usage — {_ENGINES_LOAD}",
        ),
        PanelDef(
            "TTFT quantiles",
            "timeseries",
            (
                Query(
                    "warmscope:engine_ttft_seconds:quantile_rate5m",
                    f"p{{{{quantile}}}} {{{{instance}}}} {{{{{MODEL}}}}}",
                ),
            ),
            "s",
            "Time to first token, P50 / P95 / P99.",
            (ad.ENGINE_TTFT_SLO_S,),
            no_value=f"no TTFT histogram — {_ENGINES_LOAD}",
        ),
        PanelDef(
            "TTFT SLO burn rate",
            "timeseries",
            (
                Query(
                    f"warmscope:engine_ttft_slo_miss:ratio_rate5m / {_BUDGET:g}",
                    "5 min {{instance}}",
                ),
                Query(
                    f"warmscope:engine_ttft_slo_miss:ratio_rate1h / {_BUDGET:g}",
                    "1 h {{instance}}",
                ),
            ),
            "x",
            f"Error-budget burn: share of requests over {ad.ENGINE_TTFT_SLO_S:g} s / "
            f"{_BUDGET:.0%}. WarmscopeEngineTTFTSLOBurn pages when both windows exceed "
            f"{ad.ENGINE_BURN_RATE:g}.",
            (ad.ENGINE_BURN_RATE,),
            no_value=f"no TTFT SLO series — {_ENGINES_LOAD}",
        ),
        PanelDef(
            "Cache-read share of prompt tokens (GenAI conventions)",
            "timeseries",
            (
                Query(
                    "warmscope:genai_cache_read_ratio:rate5m",
                    "{{gen_ai_provider_name}} {{gen_ai_request_model}}",
                ),
            ),
            "percentunit",
            f"From any client emitting the GenAI registry's `{genai.METRIC_CACHE_READ_TOKENS}` and "
            f"`{genai.METRIC_INPUT_TOKENS}` counters.",
            no_value="no client emits the GenAI registry's token counters",
        ),
        *(
            PanelDef(
                title,
                "heatmap",
                (Query(_rate_sum("le", name + "_bucket", '{instance=~"$instance"}'), "{{le}}"),),
                "s",
                f"vLLM's `{name}` histogram over all engines of the selected instances "
                "(vLLM with KV-cache residency metrics enabled).",
                width=8,
                no_value=f"no {name} — this vLLM does not export KV-block residency metrics",
            )
            for name, title in RESIDENCY
        ),
    ),
    variables=(
        ("instance", "label_values(warmscope:engine_prefix_query_tokens:rate5m, instance)"),
    ),
    annotations=(
        (
            "engine alerts",
            f'ALERTS{{alertname=~"{_alerts(ad.ENGINE_ALERTS)}", alertstate="firing"}}',
            "red",
        ),
    ),
)

_KV_FLT, _BLOCK_FLT = 'tenant=~"$tenant", engine=~"$engine"', 'engine=~"$engine"'
_KV_SOURCE = "no block-level KV series — the engines need the KV-block source (warmscope_kv_*)"

KV_MISSES = DashboardDef(
    "warmscope-kv-misses",
    "warmscope — KV-block miss classes",
    "Why prompt tokens missed the prefix cache, block by block: " + ", ".join(MISS_CLASSES) + ".",
    (
        PanelDef(
            "Missed prompt tokens by class",
            "timeseries",
            (
                Query(
                    f"sum by (miss_class) (rate({KV_MISSED}{{{_KV_FLT}}}[$__rate_interval]))",
                    "{{miss_class}}",
                ),
            ),
            "short",
            "Tokens/s that missed, by miss class.",
            stack=True,
            no_value=_KV_SOURCE,
        ),
        PanelDef(
            "Share of missed tokens by class (range)",
            "bargauge",
            (
                Query(
                    f"sum by (miss_class) (increase({KV_MISSED}{{{_KV_FLT}}}[$__range]))\n"
                    "/ ignoring (miss_class) "
                    f"group_left sum(increase({KV_MISSED}{{{_KV_FLT}}}[$__range]))",
                    "{{miss_class}}",
                    instant=True,
                ),
            ),
            "percentunit",
            "Over the dashboard's time range.",
            no_value=_KV_SOURCE,
        ),
        PanelDef(
            "Missed tokens by tenant × class (range)",
            "table",
            (
                Query(
                    f"sum by (tenant, miss_class) (increase({KV_MISSED}{{{_KV_FLT}}}[$__range]))",
                    instant=True,
                ),
            ),
            "short",
            "",
            width=24,
            no_value=_KV_SOURCE,
        ),
        PanelDef(
            "KV blocks stored / reused / evicted",
            "timeseries",
            tuple(
                Query(
                    f"sum by (engine) (rate({series}{{{_BLOCK_FLT}}}[$__rate_interval]))",
                    f"{k} {{{{engine}}}}",
                )
                for k, series in KV_BLOCKS.items()
            ),
            "short",
            "Blocks/s per engine.",
            no_value=_KV_SOURCE,
        ),
        PanelDef(
            "Block reuse ratio",
            "timeseries",
            (
                Query(
                    f"sum by (engine, salt) (rate({KV_BLOCKS['reused']}{{{_BLOCK_FLT}}}"
                    "[$__rate_interval]))\n/ "
                    f"sum by (engine, salt) (rate({KV_BLOCKS['stored']}{{{_BLOCK_FLT}}}"
                    "[$__rate_interval]))",
                    "{{engine}} {{salt}}",
                ),
            ),
            "percentunit",
            "Reuses per stored block, per engine and cache salt (tenant).",
            no_value=_KV_SOURCE,
        ),
        PanelDef(
            "Resident KV blocks",
            "timeseries",
            (
                Query(
                    f"sum by (engine, salt) ({KV_RESIDENT}{{{_BLOCK_FLT}}})", "{{engine}} {{salt}}"
                ),
            ),
            "short",
            "Blocks resident per engine and salt.",
            stack=True,
            no_value=_KV_SOURCE,
        ),
    ),
    variables=(
        ("tenant", f"label_values({KV_MISSED}, tenant)"),
        ("engine", f"label_values({KV_MISSED}, engine)"),
    ),
)

DASHBOARDS: tuple[DashboardDef, ...] = (OVERVIEW, ENGINES, KV_MISSES)


def definitions(rules_dir: Path = RULES_DIR) -> list[DashboardDef]:
    """Every dashboard's definition, each recorded series and alert it reads checked against the
    rule files in ``rules_dir``."""
    n = Names(rules_dir)
    for d in DASHBOARDS:
        n.check(d)
    return list(DASHBOARDS)


_TOKEN = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_STRIP = (
    re.compile(r'"[^"]*"'),
    re.compile(r"\{[^}]*\}"),
    re.compile(r"\[[^\]]*\]"),
    re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"),
)
_ENGINES = ("vllm", "sglang", "lmcache")


def _reads(expr: str) -> set[str]:
    for rx in _STRIP:  # strings, label matchers, ranges, label lists
        expr = rx.sub(" ", expr)
    return {
        t
        for t in _TOKEN.findall(expr)
        if ":" in t
        or t.startswith(("warmscope_", "ALERTS"))
        or t.startswith(tuple(f"{x}_" for x in _ENGINES))
    }


def panel_reads(p: PanelDef) -> set[str]:
    """The series names a panel's PromQL reads (recorded series and raw metrics); an engine metric
    read in both name forms is listed once, in its colon form."""
    out: set[str] = set()
    for q in p.queries:
        out |= _reads(q.expr)
    return {
        t
        for t in out
        if not (t.startswith(tuple(f"{x}_" for x in _ENGINES)) and t.replace("_", ":", 1) in out)
    }


def missing_series(d: DashboardDef, present: Callable[[str], bool]) -> list[str]:
    """The series ``d``'s panels read that ``present(name)`` says the datasource lacks. A query's
    top-level ``or`` branches are alternatives (an engine metric's two name forms, a fallback): it
    lacks nothing when one branch has all its series; else its first branch's absent series are
    listed."""
    seen: dict[str, bool] = {}

    def has(name: str) -> bool:
        if name not in seen:
            seen[name] = present(name)
        return seen[name]

    missing: set[str] = set()
    for p in d.panels:
        for q in p.queries:
            alts = [_reads(b) - {"ALERTS"} for b in re.split(r"\sor\s", q.expr)]
            if not any(all(has(r) for r in alt) for alt in alts):
                missing |= {r for r in alts[0] if not has(r)}
    return sorted(missing)


# ---- the builder --------------------------------------------------------------------------------


def build(d: DashboardDef, missing: list[str] | None = None) -> dict[str, Any]:
    """``d`` as Grafana dashboard JSON (a dict), through the Grafana Foundation SDK's builders.
    ``missing``: series the target datasource lacks — the dashboard then opens with a text panel
    naming them."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    b = _dashboard(d)
    if missing:
        b = b.with_panel(_missing_panel(missing))
    for p in d.panels:
        b = b.with_panel(_panel(p))
    out: dict[str, Any] = json.loads(json.dumps(b.build(), cls=JSONEncoder))
    return out


def _datasource() -> Any:
    from grafana_foundation_sdk.models import dashboard as dm

    return dm.DataSourceRef(type_val="prometheus", uid=DS)


def _dashboard(d: DashboardDef) -> Any:
    """The dashboard with its settings, link, datasource variable, variables and annotations."""
    from grafana_foundation_sdk.builders import dashboard
    from grafana_foundation_sdk.models import dashboard as dm

    b = (
        dashboard.Dashboard(d.title)
        .uid(d.uid)
        .description(d.description)
        .tags(list(d.tags))
        .refresh("1m")
        .time("now-6h", "now")
        .timezone("browser")
        .editable()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .link(
            dashboard.DashboardLink("warmscope")
            .type(dm.DashboardLinkType.DASHBOARDS)
            .tags(["warmscope"])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
        .with_variable(
            dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
        )
    )
    for name, query in d.variables:
        b = b.with_variable(
            dashboard.QueryVariable(name)
            .label(name)
            .datasource(_datasource())
            .query(query)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.ALPHABETICAL_ASC)
        )
    for name, expr, colour in d.annotations:
        b = b.annotation(
            dashboard.AnnotationQuery()
            .name(name)
            .datasource(_datasource())
            .enable(True)
            .icon_color(colour)
            .expr(expr)
        )
    return b


def _missing_panel(missing: list[str]) -> Any:
    from grafana_foundation_sdk.builders import text

    lines = "\n".join(f"- `{m}`" for m in missing)
    return (
        text.Panel()
        .title("Series missing from this datasource")
        .height(6)
        .span(24)
        .mode(_text_mode())
        .content(
            "This datasource lacks series these panels read, so they would stay empty:\n\n"
            f"{lines}\n\nLoad the rule files of `rules/` into its Prometheus "
            "(`rule_files: [rules/*.yml]`) and scrape the collectors and engines; "
            "see docs/operate/grafana.md."
        )
    )


def _panel(p: PanelDef) -> Any:
    """One panel: its kind's builder, the common settings, the queries, the thresholds and the
    options of its kind (:data:`_KIND_OPTIONS`)."""
    from grafana_foundation_sdk.builders import bargauge, heatmap, stat, table, timeseries

    kinds: dict[str, Any] = {
        "timeseries": timeseries.Panel,
        "stat": stat.Panel,
        "table": table.Panel,
        "heatmap": heatmap.Panel,
        "bargauge": bargauge.Panel,
    }
    if p.kind not in kinds:
        raise GrafanaError(f"panel {p.title!r}: unknown kind {p.kind!r}")
    pb = (
        kinds[p.kind]()
        .title(p.title)
        .description(p.description)
        .datasource(_datasource())
        .unit(p.unit)
        .height(8)
        .span(p.width)
    )
    if p.no_value:
        pb = pb.no_value(p.no_value)
    for i, q in enumerate(p.queries):
        pb = pb.with_target(_target(q, chr(ord("A") + i), p.kind))
    if p.thresholds:
        pb = _thresholds(pb, p)
    return _KIND_OPTIONS[p.kind](pb, p)


def _target(q: Query, ref_id: str, kind: str) -> Any:
    """A Prometheus query: an instant one as a table (tables) or a time series, a range one as
    time series (heatmaps: buckets)."""
    from grafana_foundation_sdk.builders import prometheus
    from grafana_foundation_sdk.models import prometheus as pm

    t = prometheus.Dataquery().expr(q.expr).ref_id(ref_id).legend_format(q.legend or "__auto")
    if q.instant:
        fmt = pm.PromQueryFormat.TABLE if kind == "table" else pm.PromQueryFormat.TIME_SERIES
        return t.instant().format(fmt)
    if kind == "heatmap":
        return t.range().format(pm.PromQueryFormat.HEATMAP)
    return t.range()


def _thresholds(pb: Any, p: PanelDef) -> Any:
    """Green below, red from each threshold; drawn as dashed lines on a time series."""
    from grafana_foundation_sdk.builders import common as cb
    from grafana_foundation_sdk.builders import dashboard
    from grafana_foundation_sdk.models import common as cm
    from grafana_foundation_sdk.models import dashboard as dm

    steps = [dm.Threshold(value=None, color="green")] + [
        dm.Threshold(value=v, color="red") for v in p.thresholds
    ]
    pb = pb.thresholds(dashboard.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps))
    if p.kind == "timeseries":
        style = cb.GraphThresholdsStyleConfig().mode(cm.GraphTresholdsStyleMode.DASHED)
        pb = pb.thresholds_style(style)
    return pb


def _timeseries_options(pb: Any, p: PanelDef) -> Any:
    from grafana_foundation_sdk.builders import common as cb
    from grafana_foundation_sdk.models import common as cm

    if p.stack:
        pb = pb.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL)).fill_opacity(30)
    return pb.legend(
        cb.VizLegendOptions()
        .show_legend(True)
        .display_mode(cm.LegendDisplayMode.LIST)
        .placement(cm.LegendPlacement.BOTTOM)
    )


def _last_value_options(pb: Any, p: PanelDef) -> Any:
    from grafana_foundation_sdk.builders import common as cb

    return pb.reduce_options(cb.ReduceDataOptions().values(False).calcs(["lastNotNull"]))


def _table_options(pb: Any, p: PanelDef) -> Any:
    return pb.show_header(True)


def _heatmap_options(pb: Any, p: PanelDef) -> Any:
    from grafana_foundation_sdk.builders import heatmap

    return pb.calculate(False).y_axis(heatmap.YAxisConfig().unit("s"))


# What each kind of panel sets beyond the common settings.
_KIND_OPTIONS: dict[str, Callable[[Any, PanelDef], Any]] = {
    "timeseries": _timeseries_options,
    "stat": _last_value_options,
    "bargauge": _last_value_options,
    "table": _table_options,
    "heatmap": _heatmap_options,
}


def _text_mode() -> Any:
    from grafana_foundation_sdk.models import text as tm

    return tm.TextMode.MARKDOWN


def render(d: dict[str, Any]) -> str:
    return json.dumps(d, indent=2, sort_keys=True) + "\n"


def write(
    out: Path, rules_dir: Path = RULES_DIR, present: Callable[[str], bool] | None = None
) -> list[tuple[Path, DashboardDef, list[str]]]:
    """Write every dashboard to ``out`` as ``<uid>.json``; with ``present`` (does the
    datasource hold a
    series?), a dashboard that reads absent series opens with a text panel naming them."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for d in definitions(rules_dir):
        missing = missing_series(d, present) if present is not None else []
        path = out / f"{d.uid}.json"
        path.write_text(render(build(d, missing)))
        written.append((path, d, missing))
    return written
