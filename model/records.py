"""Every record and frame warmscope writes, declared once.

A :class:`Record` lists its columns in order — each with its SQL type, its
role (``time``, ``label`` or ``measure``) and, for labels exported as metric
attributes, the OpenTelemetry attribute key — plus the time column that
windows filter on, its primary key, how a write combines with rows already
there, and whether the store keeps hourly rollups of it.

Everything else is derived from these declarations:

* the embedded store's tables, indexes, hourly rollups and upserts
  (:mod:`collectors.store.layout`);
* the label order of the aggregator's lookup, write and request series
  (:data:`LOOKUP_LABELS`, :data:`WRITE_LABELS`, :data:`REQUEST_LABELS`:
  column names; ``schema.LOOKUP_LABELS`` etc.: their attribute keys);
* the Prometheus label of every canonical column (:data:`PROM_LABELS`);
* the A/B unit record the aggregator buffers per unit (:data:`UNIT_SUMS`
  and the ``U_*`` indices), the per-layer unit record (``L_*``), the request
  counter record (``R_*``) and the warm-up run record (:data:`RUN_COLUMNS`).

Adding a field is one edit here plus a store migration
(:mod:`collectors.store.layout`, ``SCHEMA_VERSION`` and ``MIGRATIONS``); the
collector that fills it supplies the value.

Example::

    >>> from warmscope.collectors import records
    >>> records.LOOKUPS.labels[:3]
    ('tenant', 'layer', 'family')
    >>> records.LOOKUPS.measures
    ('count',)
    >>> records.PROM_LABELS["tenant"]
    'warmscope_tenant'
"""

from __future__ import annotations

from dataclasses import dataclass

from .registry import require

__all__ = [
    "ATTR",
    "DURATION_BUCKETS",
    "prom_label",
    "Column",
    "Record",
    "RECORDS",
    "FRAMES",
    "Layer",
    "LAYERS",
    "layer",
    "start_layers",
    "shared_layers",
    "not_in_hit_rate",
    "check_layers",
    "LOOKUPS",
    "WRITES",
    "REQUESTS",
    "HISTOGRAMS",
    "GAUGES",
    "WARMUP_RUNS",
    "WARMED_KEYS",
    "EARLY_KEYS",
    "HOT_KEYS",
    "AB_UNITS",
    "AB_LOOKUPS",
    "FAULTS",
    "MISSES",
    "KV_BLOCKS",
    "BLOCK_TRACE",
    "MISS_CLASSES",
    "LOOKUP_LABELS",
    "WRITE_LABELS",
    "REQUEST_LABELS",
    "COLUMN_ATTRS",
    "PROM_LABELS",
    "UNIT_BUCKETS",
    "UNIT_SUMS",
    "UNIT_HIST",
    "UNIT_KEYS",
    "UNIT_FIELDS",
    "RUN_COLUMNS",
    "ROLLUP_S",
]

TEXT, REAL, INTEGER, BLOB = "TEXT", "REAL", "INTEGER", "BLOB"


class ATTR:
    """Attribute keys (OTel style) of exported labels. Prometheus labels: dots -> underscores."""

    TENANT = "warmscope.tenant"
    LAYER = "warmscope.cache.layer"
    RESULT = "warmscope.cache.result"
    FAMILY = "warmscope.key.family"
    EXPERIMENT = "warmscope.experiment"
    VARIANT = "warmscope.variant"
    MODEL = "gen_ai.request.model"
    REPLICA = "warmscope.replica"
    LENGTH_BUCKET = "warmscope.prompt.length_bucket"
    TOKEN_TYPE = "gen_ai.token.type"
    SLA_MET = "warmscope.sla.met"
    STRATEGY = "warmscope.warmup.strategy"
    TRIGGER = "warmscope.warmup.trigger"
    STATUS = "warmscope.warmup.status"
    MISS_CLASS = "warmscope.kv.miss_class"
    SALT = "warmscope.kv.salt"
    STAGE = "warmscope.telemetry.stage"
    LABEL = "warmscope.telemetry.label"


def prom_label(attr: str) -> str:
    return attr.replace(".", "_")


# Request-duration histogram bounds (GenAI semantic-convention advice); the
# A/B unit record keeps its own histogram over the same bounds.
DURATION_BUCKETS = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str  # SQL type: TEXT | REAL | INTEGER
    role: str  # time | label | measure
    attr: str | None = None  # OpenTelemetry attribute key, for labels exported as one
    default: str | None = None  # SQL default (columns a migration adds need one)


def _t(name: str) -> Column:
    return Column(name, REAL, "time")


def _l(name: str, attr: str | None = None, type: str = TEXT) -> Column:
    return Column(name, type, "label", attr)


def _m(name: str, type: str = INTEGER, default: str | None = None) -> Column:
    return Column(name, type, "measure", None, default)


@dataclass(frozen=True)
class Record:
    """One stored record (a table) and the frame read from it.

    ``write`` says how a written row meets the rows already stored:
    ``append``; ``add`` (upsert on ``key``: measures are summed, except those
    in ``max_measures``, which keep the larger value); ``replace`` (upsert on
    ``key``: the new row wins). ``rollup``: the store keeps hourly sums of the
    measures per label set (rows with a ``ts`` column only)."""

    name: str
    columns: tuple[Column, ...]
    time: str | None = None  # the column that time windows filter on
    key: tuple[str, ...] = ()  # primary key (WITHOUT ROWID table)
    write: str = "append"
    rollup: bool = False
    max_measures: tuple[str, ...] = ()
    frame_columns: tuple[str, ...] | None = (
        None  # when the frame is not the stored row (histograms)
    )
    doc: str = ""

    @property
    def cols(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.role == "label")

    @property
    def measures(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.role == "measure")

    @property
    def attrs(self) -> tuple[str, ...]:
        """OpenTelemetry attribute keys of the labels that have one, in column order."""
        return tuple(c.attr for c in self.columns if c.role == "label" and c.attr)

    @property
    def frame(self) -> tuple[str, ...]:
        return self.frame_columns or self.cols

    def index(self, column: str) -> int:
        """Position of ``column`` in a stored row."""
        return self.cols.index(column)


# ------------------------------------------------------------- metric points
# Per-flush rows: the time column first, then labels, then measures (the
# rollups and the store's fold rely on that order).
_TENANT = _l("tenant", ATTR.TENANT)
_LAYER = _l("layer", ATTR.LAYER)
_FAMILY = _l("family", ATTR.FAMILY)
_EXPERIMENT = _l("experiment", ATTR.EXPERIMENT)
_VARIANT = _l("variant", ATTR.VARIANT)
_MODEL = _l("model", ATTR.MODEL)
_REPLICA = _l("replica", ATTR.REPLICA)

LOOKUPS = Record(
    "lookups",
    (
        _t("ts"),
        _TENANT,
        _LAYER,
        _FAMILY,
        _l("result", ATTR.RESULT),
        _EXPERIMENT,
        _VARIANT,
        _MODEL,
        _REPLICA,
        _l("length_bucket", ATTR.LENGTH_BUCKET),
        _m("count"),
    ),
    time="ts",
    rollup=True,
    doc="lookups in the flush interval ending at ts; result is hit, miss, bypass or error",
)
WRITES = Record(
    "writes",
    (_t("ts"), _TENANT, _LAYER, _FAMILY, _REPLICA, _m("count")),
    time="ts",
    rollup=True,
    doc="cache writes in the flush interval ending at ts",
)
REQUESTS = Record(
    "requests",
    (
        _t("ts"),
        _TENANT,
        _EXPERIMENT,
        _VARIANT,
        _MODEL,
        _REPLICA,
        _l("sla_met", ATTR.SLA_MET),
        _m("requests"),
        _m("gpu_s", REAL),
        _m("conversions"),
        _m("value", REAL),
        _m("unmeasured", default="0"),
    ),
    time="ts",
    rollup=True,
    doc='requests in the flush interval ending at ts; sla_met is "true", "false" or ""; '
    "unmeasured: LLM requests whose response carried no token usage (left out of token hit rates)",
)
HISTOGRAMS = Record(
    "histograms",
    (
        _t("ts"),
        _l("metric"),
        _TENANT,
        _EXPERIMENT,
        _VARIANT,
        _MODEL,
        _REPLICA,
        _LAYER,
        _l("bounds"),
        _m("counts", TEXT),
        _m("sum", REAL),
        _m("total"),
    ),
    time="ts",
    rollup=True,
    frame_columns=(
        "ts",
        "metric",
        "tenant",
        "experiment",
        "variant",
        "model",
        "replica",
        "layer",
        "le",
        "count",
        "sum",
        "total",
    ),
    doc="one stored row per series (bounds and counts as JSON lists); the frame has one row per "
    "non-empty bucket",
)
GAUGES = Record(
    "gauges",
    (_t("ts"), _l("metric"), _REPLICA, _m("value", REAL)),
    time="ts",
    doc="last value per flush",
)

# ---------------------------------------------------------------- warm-up
WARMUP_RUNS = Record(
    "warmup_runs",
    (
        _l("run_id"),
        _l("replica"),
        _l("tenant"),
        _l("layer"),
        _l("strategy"),
        _l("trigger"),
        _t("started"),
        _t("ended"),
        _l("status"),
        _m("keys"),
        _m("bytes"),
        _m("gpu_s", REAL),
        _m("memory_bytes"),
        _l("error"),
    ),
    time="started",
    key=("run_id",),
    write="replace",
    doc="one row per warm-up run; ended is NaN while it runs",
)
WARMED_KEYS = Record(
    "warmed_keys",
    (
        _l("run_id"),
        _l("key_hash"),
        _l("family"),
        _l("tenant"),
        _l("layer"),
        _t("warmed_at"),
        _m("ttl_s", REAL),
        _m("gpu_s", REAL),
        _t("first_hit_at"),
        _t("first_miss_at"),
        _m("hits"),
    ),
    time="warmed_at",
    key=("run_id", "key_hash"),
    write="replace",
    doc="one row per key a warm-up run wrote",
)
EARLY_KEYS = Record(
    "early_keys",
    (_l("run_id"), _l("key_hash"), _l("family"), _t("first_seen"), _m("lookups")),
    time="first_seen",
    key=("run_id", "key_hash"),
    write="replace",
    doc="keys requested in the recall window after a run",
)

# --------------------------------------------------------------- hot keys
HOT_KEYS = Record(
    "hot_keys",
    (
        _t("window"),
        _l("tenant"),
        _l("layer"),
        _l("key_hash"),
        _l("family"),
        _m("hits"),
        _m("misses"),
        _m("err"),
    ),
    time="window",
    key=("window", "tenant", "layer", "key_hash"),
    write="add",
    max_measures=("err",),
    doc="Space-Saving counts per hot-key window (keys read at least twice in it): "
    "true count >= hits + misses - err",
)

# ---------------------------------------------------------------- A/B units
# The request-duration histogram of a unit, for clustered quantiles.
UNIT_BUCKETS = DURATION_BUCKETS
UNIT_HIST = tuple(f"h{i}" for i in range(len(UNIT_BUCKETS) + 1))
UNIT_KEYS = ("experiment", "variant", "unit_hash")
AB_UNITS = Record(
    "ab_units",
    (
        _l("experiment"),
        _l("variant"),
        _l("unit_hash"),
        _t("first_ts"),
        _t("last_ts"),
        _m("requests"),
        _m("latency_sum", REAL),
        _m("latency_sq", REAL),
        _m("ttft_sum", REAL),
        _m("conversions"),
        _m("value", REAL),
        _m("gpu_s", REAL),
        _m("sla_met"),
    )
    + tuple(_m(h, INTEGER, "0") for h in UNIT_HIST),
    time="last_ts",
    key=UNIT_KEYS,
    write="add",
    doc="one row per unit: request-level sums and request-duration histogram, first to last "
    "flush window",
)
AB_LOOKUPS = Record(
    "ab_lookups",
    (_l("experiment"), _l("variant"), _l("unit_hash"), _l("layer"), _m("lookups"), _m("hits")),
    key=UNIT_KEYS + ("layer",),
    write="add",
    doc="a unit's lookups and hits in one cache layer",
)

# ------------------------------------------------------------------ faults
FAULTS = Record(
    "faults",
    (_l("trap"), _l("scope"), _t("start"), _t("end"), _l("params")),
    time="start",
    doc="injected faults (ground truth written by the simulator); scope and params are JSON",
)

# ------------------------------------------------------- prefix-KV misses
# Why a request's missed prompt tokens (prompt - cached) were not in the
# prefix-KV cache, one class each; the classes of a request add up exactly
# to its missed tokens. ``unknown``: the engine's events for some missed
# blocks never arrived (see docs/architecture.md, "Why misses"). ``engine`` is
# the serving replica: exported as ``warmscope.replica`` (``warmscope_engine``
# in the engine rules names the engine kind: vllm, sglang, lmcache).
MISS_CLASSES = ("elsewhere", "evicted", "isolated", "drifted", "cold", "partial", "unknown")
MISSES = Record(
    "misses",
    (
        _t("ts"),
        _TENANT,
        _l("engine", ATTR.REPLICA),
        _FAMILY,
        _l("miss_class", ATTR.MISS_CLASS),
        _m("tokens"),
        _m("requests"),
    ),
    time="ts",
    key=("ts", "tenant", "engine", "family", "miss_class"),
    write="add",
    rollup=True,
    doc="missed prompt tokens by class per time bucket (the flush interval ending at ts); "
    "requests: requests with tokens in this class",
)
KV_BLOCKS = Record(
    "kv_blocks",
    (
        _t("ts"),
        _l("engine", ATTR.REPLICA),
        _l("salt", ATTR.SALT),
        _m("stored"),
        _m("reused"),
        _m("evicted"),
        _m("resident"),
    ),
    time="ts",
    key=("ts", "engine", "salt"),
    write="add",
    max_measures=("resident",),
    doc="an engine's KV blocks per salt (hashed) in the flush interval ending at ts: stored, "
    "reused and evicted blocks; resident: blocks resident at the end of the interval (the "
    "larger of two writes)",
)

# ------------------------------------------------------------ block trace
# One row per request an engine served behind the gateway, with the chain of its KV blocks:
# what the what-if replay (analysis/whatif) reads. Blocks are 63-bit digests keyed with the
# recorder's secret (little-endian uint64 arrays in the BLOBs): no token id or text is stored.
# ``h``: the blocks as the engine cached them; ``c``: the chain without the cache salt; ``s``:
# the chain with the template's drifting blocks replaced (empty when equal to ``h``); ``cls``:
# one byte per block, model.blocktrace.BLOCK_CLASSES (255 not judged). ``bucket`` (0-255, from
# the first block) is the sample bucket older rows are thinned by; ``capacity``: the engine's
# num_gpu_blocks from its /metrics (0 when it did not say).
BLOCK_TRACE = Record(
    "block_trace",
    (
        _t("ts"),
        _m("t_end", REAL),
        _TENANT,
        _l("engine", ATTR.REPLICA),
        _l("salt", ATTR.SALT),
        _m("prompt"),
        _m("output"),
        _m("cached"),
        _m("ttft", REAL),
        _m("block_size"),
        _m("capacity"),
        _m("bucket"),
        _m("h", BLOB),
        _m("c", BLOB),
        _m("s", BLOB),
        _m("cls", BLOB),
    ),
    time="ts",
    doc="one request's KV-block chain (keyed digests) with its arrival, end, tokens and TTFT: "
    "the what-if replay's input",
)

RECORDS: dict[str, Record] = {
    r.name: r
    for r in (
        LOOKUPS,
        WRITES,
        REQUESTS,
        HISTOGRAMS,
        GAUGES,
        WARMUP_RUNS,
        WARMED_KEYS,
        EARLY_KEYS,
        HOT_KEYS,
        AB_UNITS,
        AB_LOOKUPS,
        FAULTS,
        MISSES,
        KV_BLOCKS,
        BLOCK_TRACE,
    )
}
# The frames every source can be asked for: the block trace is read on its own
# (sources.trace_store), never with the rest.
FRAMES = tuple(n for n in RECORDS if n != BLOCK_TRACE.name)
ROLLUP_S = 3600.0  # hourly rollups of the records with rollup=True


# ------------------------------------------------------------------ layers
@dataclass(frozen=True)
class Layer:
    """What warmscope needs to know about a cache layer beyond its name.

    Any name works as a layer (``InstrumentedCache(..., layer="rerank")``);
    declare one in ``LAYERS`` only when it differs from the default."""

    shared: bool = False  # shared across tenants by design: cross-tenant reads are not findings
    length_buckets: bool = False  # its lookups carry the prompt-length bucket label
    # counted in the hit rates of the score card, the overview and the A/B layer metrics; False for
    # a layer that is not a warm-up cache (model weights: loaded once per replica)
    in_hit_rate: bool = True
    # loaded when a replica (re)starts and read by every request it serves (model weights): misses
    # in it per replica are traffic that met a replica before it was warm (the
    # warmup_out_of_step trap), and its lookups count a replica's requests (the replay model)
    loaded_at_start: bool = False

    def __post_init__(self) -> None:
        for f in ("shared", "length_buckets", "in_hit_rate", "loaded_at_start"):
            require(isinstance(getattr(self, f), bool), "Layer", f, "must be True or False")


LAYERS: dict[str, Layer] = {
    "weights": Layer(shared=True, in_hit_rate=False, loaded_at_start=True),
    "prefix_kv": Layer(length_buckets=True),
}
_DEFAULT_LAYER = Layer()


def check_layers(layers: dict[str, Layer]) -> None:
    """Raise ``RegistryError`` for a ``LAYERS`` entry that is not a named ``Layer``."""
    for name, decl in layers.items():
        require(
            isinstance(name, str) and name.strip() == name != "",
            "LAYERS",
            str(name),
            "the name must be a non-empty string without surrounding spaces",
        )
        require(isinstance(decl, Layer), "LAYERS", name, f"must be a Layer(...), got {decl!r}")


check_layers(LAYERS)


def layer(name: str) -> Layer:
    """The declaration of layer ``name`` (the default for undeclared layers)."""
    return LAYERS.get(name, _DEFAULT_LAYER)


# The declared layers with a property, read from ``LAYERS`` at each call (in declaration order), so
# that a layer declared at run time counts everywhere at once.
def start_layers() -> tuple[str, ...]:
    """The layers declared ``loaded_at_start``."""
    return tuple(n for n, d in LAYERS.items() if d.loaded_at_start)


def shared_layers() -> tuple[str, ...]:
    """The layers declared ``shared``: cross-tenant reads in them are by design."""
    return tuple(n for n, d in LAYERS.items() if d.shared)


def not_in_hit_rate() -> tuple[str, ...]:
    """The layers declared ``in_hit_rate=False``: left out of hit rates."""
    return tuple(n for n, d in LAYERS.items() if not d.in_hit_rate)


# ------------------------------------------------------------ derived names
LOOKUP_LABELS = LOOKUPS.labels  # the aggregator's lookup label tuple, in this order
WRITE_LABELS = WRITES.labels
REQUEST_LABELS = REQUESTS.labels  # the request counter series (sla_met last)
COLUMN_ATTRS: dict[str, str] = {}  # canonical column -> OpenTelemetry attribute key
for _r in (LOOKUPS, WRITES, REQUESTS, HISTOGRAMS, MISSES, KV_BLOCKS):
    for _c in _r.columns:
        if _c.attr:
            COLUMN_ATTRS.setdefault(_c.name, _c.attr)
PROM_LABELS = {
    c: prom_label(a) for c, a in COLUMN_ATTRS.items()
}  # canonical column -> Prometheus label
RUN_COLUMNS = WARMUP_RUNS.cols

# The request-level unit record the aggregator buffers per A/B unit: the sums
# of AB_UNITS in column order, the histogram last. Indices for the hot path:
UNIT_SUMS = tuple(c for c in AB_UNITS.measures if c not in UNIT_HIST)
U_REQUESTS, U_LATENCY_SUM, U_LATENCY_SQ, U_TTFT_SUM, U_CONVERSIONS, U_VALUE, U_GPU_S, U_SLA_MET = (
    UNIT_SUMS.index(c)
    for c in (
        "requests",
        "latency_sum",
        "latency_sq",
        "ttft_sum",
        "conversions",
        "value",
        "gpu_s",
        "sla_met",
    )
)
U_HIST = len(UNIT_SUMS)  # the histogram's first bucket
# The per-layer fields then the request-level ones (the names readers of the
# Redis unit hashes and the A/B moments use: UNIT_FIELDS[2:] is UNIT_SUMS).
UNIT_FIELDS = AB_LOOKUPS.measures + UNIT_SUMS
# The per-layer unit record: AB_LOOKUPS' measures.
L_LOOKUPS, L_HITS = (AB_LOOKUPS.measures.index(c) for c in ("lookups", "hits"))
# The request counter record (per series): REQUESTS' measures, starting at zero.
REQUEST_ZERO = tuple(
    0 if c.type == INTEGER else 0.0 for c in REQUESTS.columns if c.role == "measure"
)
R_REQUESTS, R_GPU_S, R_CONVERSIONS, R_VALUE, R_UNMEASURED = (
    REQUESTS.measures.index(c) for c in ("requests", "gpu_s", "conversions", "value", "unmeasured")
)
