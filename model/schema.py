"""Every instrument, unit, attribute key and allowed value set warmscope emits.

One place names the telemetry so that collectors, exporters, the embedded
store, Prometheus rules and the analysis agree. The layouts of stored records
(columns, label order) are declared in :mod:`collectors.records`; the label
tuples here are derived from them. Names follow OpenTelemetry
conventions (dotted lower-case, base units such as ``s`` and ``By``); GenAI
quantities use the GenAI semantic-convention names. After translation to
Prometheus, dots become underscores and counters gain ``_total``, e.g.
``warmscope.cache.lookups`` -> ``warmscope_cache_lookups_total`` with label
``warmscope_cache_result``.

Example::

    >>> from warmscope.collectors import schema
    >>> schema.CACHE_LOOKUPS.name
    'warmscope.cache.lookups'
    >>> schema.prom_name(schema.CACHE_LOOKUPS)
    'warmscope_cache_lookups_total'
    >>> schema.length_bucket(300)
    '512'
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from warmscope.model import records
from warmscope.model.records import ATTR, DURATION_BUCKETS, prom_label

__all__ = [
    "Instrument",
    "ATTR",
    "RESULTS",
    "WARMUP_STATUSES",
    "TELEMETRY_STAGES",
    "OTHER",
    "UNKNOWN",
    "CACHE_LOOKUPS",
    "CACHE_WRITES",
    "TTFT",
    "REQUEST_DURATION",
    "TOKEN_USAGE",
    "CACHE_READ_TOKENS",
    "GPU_TIME",
    "REQUESTS",
    "CONVERSIONS",
    "CONVERSION_VALUE",
    "WARMUP_RUNS",
    "WARMUP_ACTIVE",
    "WARMUP_KEYS",
    "WARMUP_BYTES",
    "WARMUP_GPU_TIME",
    "LOAD_DURATION",
    "GPU_MEMORY",
    "WARMUP_KEYS_READ",
    "CROSS_TENANT_KEYS",
    "SHARED_LAYERS",
    "TELEMETRY_ERRORS",
    "TELEMETRY_DROPPED",
    "LABEL_OVERFLOW",
    "KV_MISSED_TOKENS",
    "KV_BLOCKS_STORED",
    "KV_BLOCKS_REUSED",
    "KV_BLOCKS_EVICTED",
    "KV_BLOCKS_RESIDENT",
    "MISS_LABELS",
    "KV_BLOCK_LABELS",
    "INSTRUMENTS",
    "LOOKUP_LABELS",
    "REQUEST_LABELS",
    "WRITE_LABELS",
    "WARMUP_LABELS",
    "TTFT_BUCKETS",
    "DURATION_BUCKETS",
    "TOKEN_BUCKETS",
    "length_bucket",
    "prom_name",
    "prom_label",
]


@dataclass(frozen=True, slots=True)
class Instrument:
    name: str
    kind: str  # "counter" | "histogram" | "updown" | "gauge"
    unit: str
    description: str
    attributes: tuple[str, ...]


RESULTS = ("hit", "miss", "bypass", "error")
WARMUP_STATUSES = ("running", "ok", "error", "cancelled")
# Where an instrumentation failure happened (self-metric attribute values).
TELEMETRY_STAGES = ("record", "hook", "flush", "store", "redis", "export", "config")
OTHER = "other"  # tenant / family overflow bucket
UNKNOWN = "unknown"  # a dimension the caller did not set
NONE = ""  # experiment/variant when not in an experiment

# Attribute keys of each series, in the label order of its record (collectors.records).
LOOKUP_LABELS = records.LOOKUPS.attrs
REQUEST_LABELS = tuple(a for a in records.REQUESTS.attrs if a != ATTR.SLA_MET)
WRITE_LABELS = records.WRITES.attrs
WARMUP_LABELS = (ATTR.TENANT, ATTR.LAYER, ATTR.STRATEGY, ATTR.TRIGGER, ATTR.REPLICA)

# Fixed histogram buckets: the GenAI semantic conventions' advice.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)

CACHE_LOOKUPS = Instrument(
    "warmscope.cache.lookups",
    "counter",
    "{lookup}",
    "Cache lookups by result (hit, miss, bypass, error).",
    LOOKUP_LABELS,
)
CACHE_WRITES = Instrument(
    "warmscope.cache.writes",
    "counter",
    "{write}",
    "Cache writes (set, insert, warm-up fill).",
    WRITE_LABELS,
)
TTFT = Instrument(
    "gen_ai.server.time_to_first_token",
    "histogram",
    "s",
    "Time to generate the first token of a request.",
    REQUEST_LABELS,
)
REQUEST_DURATION = Instrument(
    "gen_ai.server.request.duration",
    "histogram",
    "s",
    "End-to-end request latency.",
    REQUEST_LABELS,
)
TOKEN_USAGE = Instrument(
    "gen_ai.client.token.usage",
    "histogram",
    "{token}",
    "Prompt (input) tokens per request.",
    REQUEST_LABELS + (ATTR.TOKEN_TYPE,),
)
CACHE_READ_TOKENS = Instrument(
    "gen_ai.client.inference.usage.cache_read.input_tokens",
    "histogram",
    "{token}",
    "Prompt tokens served from a cache per request.",
    REQUEST_LABELS,
)
GPU_TIME = Instrument(
    "warmscope.gpu.time",
    "counter",
    "s",
    "GPU-seconds spent serving requests.",
    REQUEST_LABELS,
)
REQUESTS = Instrument(
    "warmscope.requests",
    "counter",
    "{request}",
    "Requests served, by whether the latency SLA was met.",
    REQUEST_LABELS + (ATTR.SLA_MET,),
)
UNMEASURED_REQUESTS = Instrument(
    "warmscope.requests.unmeasured",
    "counter",
    "{request}",
    "LLM requests whose response carried no token usage (a stream with include_usage false, an "
    "engine without prompt token details): left out of token hit rates.",
    REQUEST_LABELS,
)
CONVERSIONS = Instrument(
    "warmscope.conversions",
    "counter",
    "{conversion}",
    "Requests that led to a conversion.",
    REQUEST_LABELS,
)
CONVERSION_VALUE = Instrument(
    "warmscope.conversion.value",
    "counter",
    "1",
    "Business value of conversions (currency units).",
    REQUEST_LABELS,
)
WARMUP_RUNS = Instrument(
    "warmscope.warmup.runs",
    "counter",
    "{run}",
    "Finished warm-up runs by status.",
    WARMUP_LABELS + (ATTR.STATUS,),
)
WARMUP_ACTIVE = Instrument(
    "warmscope.warmup.active",
    "updown",
    "{run}",
    "Warm-up runs in progress.",
    WARMUP_LABELS,
)
WARMUP_KEYS = Instrument(
    "warmscope.warmup.keys",
    "counter",
    "{key}",
    "Keys written by warm-up runs.",
    WARMUP_LABELS,
)
WARMUP_BYTES = Instrument(
    "warmscope.warmup.bytes",
    "counter",
    "By",
    "Bytes written by warm-up runs.",
    WARMUP_LABELS,
)
WARMUP_GPU_TIME = Instrument(
    "warmscope.warmup.gpu.time",
    "counter",
    "s",
    "GPU-seconds spent by warm-up runs.",
    WARMUP_LABELS,
)
WARMUP_KEYS_READ = Instrument(
    "warmscope.warmup.keys.read",
    "counter",
    "{key}",
    "Warmed keys read (hit) at least once: warm-set precision = read / warmed.",
    WARMUP_LABELS,
)
CROSS_TENANT_KEYS = Instrument(
    "warmscope.cache.cross_tenant.keys",
    "counter",
    "{key}",
    "Hot keys read by more than one tenant in a flush window (outside shared layers): a data leak.",
    (ATTR.LAYER, ATTR.REPLICA),
)
LOAD_DURATION = Instrument(
    "warmscope.cache.load.duration",
    "histogram",
    "s",
    "Time to load or compute a value after a cache miss (feature/embedding load latency).",
    REQUEST_LABELS + (ATTR.LAYER,),
)
GPU_MEMORY = Instrument(
    # "_ratio" in the name: Prometheus translators append it to unit-1 gauges
    # unless present, so every export path yields the same series name.
    "warmscope.gpu.memory.usage_ratio",
    "gauge",
    "1",
    "Share of GPU cache memory in use (0-1), like vllm:kv_cache_usage_perc.",
    (ATTR.REPLICA,),
)
TELEMETRY_ERRORS = Instrument(
    "warmscope.telemetry.errors",
    "counter",
    "{error}",
    "Instrumentation failures swallowed to protect the host, by stage.",
    (ATTR.STAGE,),
)

TELEMETRY_DROPPED = Instrument(
    "warmscope.telemetry.dropped",
    "counter",
    "{row}",
    "Rows dropped because a bounded buffer was full (a sink down too long), by stage.",
    (ATTR.STAGE,),
)
LABEL_OVERFLOW = Instrument(
    "warmscope.telemetry.label_overflow",
    "counter",
    "{value}",
    "Label values mapped to other because the label reached its cap, by label.",
    (ATTR.LABEL,),
)
LABEL_BOUNDED = Instrument(
    "warmscope.telemetry.label_bounded",
    "counter",
    "{value}",
    "Label values shortened, or with characters or words outside the vocabulary replaced, "
    "by label.",
    (ATTR.LABEL,),
)

# Prefix-KV miss classes (records.MISSES). The key family is kept in the store
# but not exported: up to 256 families per layer times tenants, engines and
# classes would multiply the series; Prometheus answers per tenant and engine.
MISS_LABELS = (ATTR.TENANT, ATTR.REPLICA, ATTR.MISS_CLASS)  # engine: the serving replica
KV_BLOCK_LABELS = (ATTR.REPLICA, ATTR.SALT)
KV_MISSED_TOKENS = Instrument(
    "warmscope.kv.missed_tokens",
    "counter",
    "{token}",
    "Missed prompt tokens (prompt - cached) by why they were not in the prefix-KV cache.",
    MISS_LABELS,
)
KV_BLOCKS_STORED = Instrument(
    "warmscope.kv.blocks.stored",
    "counter",
    "{block}",
    "KV blocks an engine stored, per (hashed) cache salt.",
    KV_BLOCK_LABELS,
)
KV_BLOCKS_REUSED = Instrument(
    "warmscope.kv.blocks.reused",
    "counter",
    "{block}",
    "KV blocks an engine reused from its prefix cache, per (hashed) cache salt.",
    KV_BLOCK_LABELS,
)
KV_BLOCKS_EVICTED = Instrument(
    "warmscope.kv.blocks.evicted",
    "counter",
    "{block}",
    "KV blocks an engine removed from its prefix cache, per (hashed) cache salt.",
    KV_BLOCK_LABELS,
)
KV_BLOCKS_RESIDENT = Instrument(
    "warmscope.kv.blocks.resident",
    "gauge",
    "{block}",
    "KV blocks resident in an engine's prefix cache now, per (hashed) cache salt.",
    KV_BLOCK_LABELS,
)

INSTRUMENTS = (
    CACHE_LOOKUPS,
    CACHE_WRITES,
    TTFT,
    REQUEST_DURATION,
    TOKEN_USAGE,
    CACHE_READ_TOKENS,
    GPU_TIME,
    REQUESTS,
    UNMEASURED_REQUESTS,
    CONVERSIONS,
    CONVERSION_VALUE,
    WARMUP_RUNS,
    WARMUP_ACTIVE,
    WARMUP_KEYS,
    WARMUP_BYTES,
    WARMUP_GPU_TIME,
    WARMUP_KEYS_READ,
    CROSS_TENANT_KEYS,
    LOAD_DURATION,
    GPU_MEMORY,
    TELEMETRY_ERRORS,
    TELEMETRY_DROPPED,
    LABEL_OVERFLOW,
    LABEL_BOUNDED,
    KV_MISSED_TOKENS,
    KV_BLOCKS_STORED,
    KV_BLOCKS_REUSED,
    KV_BLOCKS_EVICTED,
    KV_BLOCKS_RESIDENT,
)


class _LiveNames(Sequence[str]):
    """Names read again at each use (``in``, iteration, ``len``, pandas ``isin``)."""

    def __init__(self, names: Callable[[], tuple[str, ...]]) -> None:
        self._names = names

    def __getitem__(self, i: int) -> str:  # type: ignore[override]  # no slices needed
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:
        return repr(self._names())


# The layers shared by design across tenants, as records.shared_layers() says at each use.
SHARED_LAYERS: Sequence[str] = _LiveNames(records.shared_layers)

_LEN_BUCKETS = tuple(1 << i for i in range(5, 18))  # 32 .. 131072
_LEN_NAMES = tuple(str(b) for b in _LEN_BUCKETS) + ("inf",)


def length_bucket(tokens: int | None) -> str:
    """Power-of-two prompt-length bucket (upper bound) as a label value."""
    if tokens is None or tokens < 0:
        return UNKNOWN
    return _LEN_NAMES[bisect.bisect_left(_LEN_BUCKETS, tokens)]  # the first bound >= tokens


def prom_unit(inst: Instrument) -> str:
    """The Prometheus unit of an instrument's unit ("" for a count such as ``{token}``)."""
    return {"s": "seconds", "By": "bytes"}.get(inst.unit, "")


def prom_name(inst: Instrument) -> str:
    """The series name the Prometheus exporter / OTLP translation produces."""
    base = inst.name.replace(".", "_")
    unit_suffix = "_" + prom_unit(inst) if prom_unit(inst) else ""
    if unit_suffix and not base.endswith(unit_suffix):
        base += unit_suffix
    if inst.kind == "counter":
        base += "_total"
    return base


# Request histograms, in the order of the per-(labels) histogram list.
HISTOGRAMS = (
    (TTFT, TTFT_BUCKETS),
    (REQUEST_DURATION, DURATION_BUCKETS),
    (TOKEN_USAGE, TOKEN_BUCKETS),
    (CACHE_READ_TOKENS, TOKEN_BUCKETS),
    (LOAD_DURATION, DURATION_BUCKETS),  # per layer: kept in the layer's state
)
