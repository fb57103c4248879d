"""A/B metrics, declared once: :data:`METRICS` is the one list that decides

* which per-variant sums the embedded store keeps as unit records arrive
  (:data:`COLUMNS`, :func:`contributions`, the SQL in :func:`unit_exprs`),
* which metrics the A/B report computes, in which order,
* which way is better for each (``direction``) — the verdict, the win/lose
  colours and the guardrail check read it from here, never from a name,
* the primary-metric choices of the dashboard and of ``warmscope report ab``.

A metric is ``Metric(name, kind, numerator, denominator, direction)``:

==========  =================================================================
kind        numerator / denominator
==========  =================================================================
proportion  numerator: a unit field; the share of units where it is > 0
mean        numerator: a unit field; its mean per unit
ratio       numerator / denominator: unit fields; Σ numerator / Σ denominator
            over units (delta method at the unit level). ``per_layer``: the
            per-layer ``hits`` / ``lookups``, one metric per cache layer,
            ``{layer}`` in the name
quantile    numerator: ``latency`` (the per-unit request-duration histogram);
            ``q`` the quantile
==========  =================================================================

Unit fields are the A/B unit record's (``collectors.aggregator.UNIT_FIELDS``:
requests, latency_sum, latency_sq, ttft_sum, conversions, value, gpu_s,
sla_met). Adding a metric over them is one entry here: the store adds the
sums it needs to an existing store's tables and recomputes them from the unit
rows when it next opens it for writing (:func:`ensure_columns`).

Stored sums (``ab_moments`` columns, after experiment, variant, bucket):

* ``n`` units, ``min_first`` / ``max_last`` the earliest first record and
  latest last record, ``pos`` the units with a conversion (a proportion over
  another field f keeps ``pos_<f>``);
* ``s_<f>``, ``q_<f>`` — Σf and Σf² for every field a mean or ratio uses;
  ``x_<f>`` — Σ f·requests for a ratio f / requests (``x_<f>__<d>`` for
  another denominator d);
* with a quantile metric: the pooled histogram ``h<k>``, ``nh`` units with at
  least one observation, ``nn`` ΣN², and per bucket k ``cc<k>`` ΣC_k²,
  ``cd<k>`` ΣC_k·h_k, ``dd<k>`` Σh_k², ``cn<k>`` ΣC_k·N, ``dn<k>`` Σh_k·N (N
  a unit's observations, C_k its observations below bucket k; see
  :class:`analysis.ab.Quantile`).

``ab_layer_moments`` (after experiment, variant, bucket, layer): ``n`` units
with lookups in the layer, ``s_lookups``, ``s_hits``, ``q_lookups``,
``q_hits``, ``x_hits`` (Σ hits·lookups).

Sums are kept per (experiment, variant, bucket), bucket the start of the
``BUCKET_S`` interval holding the unit's first record, so the report's
effect-over-time curve is a cumulative sum. When a flush adds to a unit the
store adds ``f(new totals) − f(old totals)``: exact. :func:`rebuild_sql`
recomputes both tables from the unit rows in SQL.

This module needs numpy only: the collectors' store imports it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt
from warmscope.model.records import UNIT_BUCKETS, UNIT_FIELDS

__all__ = [
    "Metric",
    "METRICS",
    "BUCKET_S",
    "NB",
    "FIELDS",
    "COLUMNS",
    "LAYER_COLUMNS",
    "metric_names",
    "find",
    "in_list_order",
    "lower_is_better",
    "pos_column",
    "cross_column",
    "columns_for",
    "contributions",
    "layer_contributions",
    "unit_exprs",
    "layer_exprs",
    "bucket_sql",
    "bucket_of",
    "rebuild_sql",
    "upsert_sql",
    "ddl",
    "ensure_columns",
    "DEFAULT_PRIMARY",
]

BUCKET_S = 900.0  # arrival bucket of the stored sums (the effect-over-time resolution)
FIELDS: tuple[str, ...] = tuple(
    UNIT_FIELDS[2:]
)  # the unit row's fields after first_ts, last_ts; requests first
NB = len(UNIT_BUCKETS) + 1  # latency histogram buckets (the bounds plus overflow)
KINDS = ("proportion", "mean", "ratio", "quantile")


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str
    numerator: str
    denominator: str | None
    direction: str  # "higher" or "lower": which way is better
    q: float | None = None  # quantile metrics
    per_layer: bool = False  # one metric per cache layer ({layer} in the name): hits / lookups
    guardrail: bool = False  # must not get worse in a treatment, whatever the primary metric says

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"A/B metric {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}"
            )
        if self.direction not in ("higher", "lower"):
            raise ValueError(
                f"A/B metric {self.name!r}: direction must be 'higher' or 'lower', got "
                f"{self.direction!r}"
            )
        if self.per_layer:
            if (
                self.kind != "ratio"
                or (self.numerator, self.denominator) != ("hits", "lookups")
                or "{layer}" not in self.name
            ):
                raise ValueError(
                    f"A/B metric {self.name!r}: a per-layer metric is the ratio hits / lookups "
                    "with {layer} in its name"
                )
            return
        if self.kind == "quantile":
            if self.numerator != "latency" or not (self.q is not None and 0 < self.q < 1):
                raise ValueError(
                    f"A/B metric {self.name!r}: a quantile reads the 'latency' histogram and needs "
                    "0 < q < 1"
                )
            return
        if (self.kind == "ratio") != (self.denominator is not None):
            raise ValueError(
                f"A/B metric {self.name!r}: a ratio needs a denominator, other kinds none"
            )
        for f in (self.numerator, self.denominator) if self.kind == "ratio" else (self.numerator,):
            if f not in FIELDS:
                raise ValueError(
                    f"A/B metric {self.name!r}: {f!r} is not a unit field; "
                    f"fields: {', '.join(FIELDS)}"
                )

    def named(self, layer: str) -> str:
        return self.name.replace("{layer}", layer)


METRICS: tuple[Metric, ...] = (
    Metric("conversion (units)", "proportion", "conversions", None, "higher"),
    Metric("conversions per request", "ratio", "conversions", "requests", "higher"),
    Metric("value per unit", "mean", "value", None, "higher"),
    Metric("hit rate ({layer})", "ratio", "hits", "lookups", "higher", per_layer=True),
    Metric("GPU-s per request", "ratio", "gpu_s", "requests", "lower", guardrail=True),
    Metric("latency per request (s)", "ratio", "latency_sum", "requests", "lower"),
    Metric("TTFT per request (s)", "ratio", "ttft_sum", "requests", "lower", guardrail=True),
    Metric("SLA met per request", "ratio", "sla_met", "requests", "higher", guardrail=True),
    Metric("P95 latency (s)", "quantile", "latency", None, "lower", q=0.95, guardrail=True),
    Metric("P99 latency (s)", "quantile", "latency", None, "lower", q=0.99, guardrail=True),
)
DEFAULT_PRIMARY = "latency per request (s)"


def metric_names(layers: Iterable[str] = (), metrics: Sequence[Metric] = METRICS) -> list[str]:
    """Every metric's name in list order, per-layer metrics once per layer (sorted)."""
    out: list[str] = []
    for m in metrics:
        out += [m.named(ly) for ly in sorted(layers)] if m.per_layer else [m.name]
    return out


def find(name: str, metrics: Sequence[Metric] = METRICS) -> Metric | None:
    """The definition behind a metric's (possibly per-layer) name, or None."""
    for m in metrics:
        if m.per_layer:
            head, _, tail = m.name.partition("{layer}")
            if name.startswith(head) and name.endswith(tail) and len(name) > len(head) + len(tail):
                return m
        elif m.name == name:
            return m
    return None


def in_list_order(names: Iterable[str], metrics: Sequence[Metric] = METRICS) -> list[str]:
    """Metric names in the list's order (per-layer ones by layer); undeclared names last."""
    pos = {id(m): i for i, m in enumerate(metrics)}

    def key(n: str) -> tuple[int, str]:
        m = find(n, metrics)
        return (pos[id(m)] if m is not None else len(metrics), n)

    return sorted(dict.fromkeys(names), key=key)


def lower_is_better(name: str, metrics: Sequence[Metric] = METRICS) -> bool:
    """From the metric's declared direction; a name not in the list raises ``KeyError``."""
    m = find(name, metrics)
    if m is None:
        raise KeyError(f"{name!r} is not a declared A/B metric")
    return m.direction == "lower"


# ----------------------------------------------------------------- encoding
def pos_column(f: str) -> str:
    """The column counting units whose field ``f`` is > 0."""
    return "pos" if f == "conversions" else f"pos_{f}"


def cross_column(num: str, den: str) -> str:
    """The column holding Σ num·den over units."""
    return f"x_{num}" if den == "requests" else f"x_{num}__{den}"


def _plan(metrics: Sequence[Metric]) -> tuple[list[str], list[str], list[tuple[str, str]], bool]:
    """(proportion fields, fields with Σ and Σ², (numerator, denominator) pairs, histogram?) in a
    fixed order."""
    props: list[str] = []
    sq: list[str] = []
    pairs: list[tuple[str, str]] = []
    hist = False
    for m in metrics:
        if m.per_layer:
            continue
        if m.kind == "proportion":
            props.append(m.numerator)
        elif m.kind == "mean":
            sq.append(m.numerator)
        elif m.kind == "ratio":
            den = cast(str, m.denominator)  # a ratio always declares its denominator
            sq += [m.numerator, den]
            pairs.append((m.numerator, den))
        else:
            hist = True
    order = {f: i for i, f in enumerate(FIELDS)}
    by_order = cast(Callable[[str], int], order.get)  # every field is in FIELDS
    props = sorted(set(props) - {"conversions"}, key=by_order)
    sq = sorted(set(sq), key=by_order)
    pairs = sorted(set(pairs), key=lambda p: (order[p[0]], order[p[1]]))
    return props, sq, pairs, hist


_HEAD = ("n", "pos", "min_first", "max_last")  # the store reads the extrema at these positions


def columns_for(metrics: Sequence[Metric] = METRICS) -> tuple[str, ...]:
    """The ``ab_moments`` columns the metrics need (the extrema always at positions 2 and 3)."""
    props, sq, pairs, hist = _plan(metrics)
    cols = list(_HEAD) + [pos_column(f) for f in props]
    for f in sq:
        cols += [f"s_{f}", f"q_{f}"]
    cols += [cross_column(a, b) for a, b in pairs]
    if hist:
        cols += [f"h{k}" for k in range(NB)] + ["nh", "nn"]
        cols += [f"{p}{k}" for p in ("cc", "cd", "dd", "cn", "dn") for k in range(NB)]
    return tuple(cols)


COLUMNS: tuple[str, ...] = columns_for(METRICS)
LAYER_COLUMNS = ("n", "s_lookups", "s_hits", "q_lookups", "q_hits", "x_hits")
_EXTREMA = ("min_first", "max_last")


def contributions(
    vals: np.ndarray, present: np.ndarray, metrics: Sequence[Metric] = METRICS
) -> np.ndarray:
    """Each unit's row of :func:`columns_for` from its totals. ``vals``: units ×
    (first_ts, last_ts, FIELDS..., h0..h<NB-1>); ``present``: 0 for a unit
    that does not exist yet (its row is all zeros and counts nothing)."""
    props, sq, pairs, hist = _plan(metrics)
    vals = np.asarray(vals, dtype=float).reshape(len(vals), -1)
    m = len(vals)
    f = {c: vals[:, 2 + i] for i, c in enumerate(FIELDS)}
    h = vals[:, 2 + len(FIELDS) :]
    blocks = [present, (f["conversions"] > 0) * present, vals[:, 0], vals[:, 1]]
    blocks += [(f[c] > 0) * present for c in props]
    for c in sq:
        blocks += [f[c], f[c] * f[c]]
    blocks += [f[a] * f[b] for a, b in pairs]
    out = [np.column_stack(blocks) if m else np.zeros((0, len(blocks)))]
    if hist:
        tot = h.sum(axis=1)
        cum = np.cumsum(h, axis=1) - h
        out += [
            h,
            (tot > 0)[:, None].astype(float),
            (tot * tot)[:, None],
            cum * cum,
            cum * h,
            h * h,
            cum * tot[:, None],
            h * tot[:, None],
        ]
    return np.concatenate(out, axis=1) if m else np.zeros((0, len(columns_for(metrics))))


def layer_contributions(lookups: np.ndarray, hits: np.ndarray, present: np.ndarray) -> np.ndarray:
    lookups = np.asarray(lookups, dtype=float)
    hits = np.asarray(hits, dtype=float)
    return np.column_stack(
        [
            np.asarray(present, dtype=float),
            lookups,
            hits,
            lookups * lookups,
            hits * hits,
            hits * lookups,
        ]
    )


def unit_exprs(
    val: Callable[[str], str], present: str, metrics: Sequence[Metric] = METRICS
) -> list[str]:
    """SQL for a unit's contribution to each column except the extrema
    (min_first, max_last), from ``val(column) -> SQL`` of its totals;
    ``present`` is SQL that is 1 for a unit that exists (0: all zeros)."""
    props, sq, pairs, hist = _plan(metrics)
    f = {c: f"({val(c)})" for c in FIELDS}
    out = [present, f"(({f['conversions']} > 0) * {present})"]
    out += [f"(({f[c]} > 0) * {present})" for c in props]
    for c in sq:
        out += [f[c], f"{f[c]} * {f[c]}"]
    out += [f"{f[a]} * {f[b]}" for a, b in pairs]
    if hist:
        h = [f"({val(f'h{k}')})" for k in range(NB)]
        tot = "(" + " + ".join(h) + ")"
        cum = ["0"] + ["(" + " + ".join(h[:k]) + ")" for k in range(1, NB)]
        out += h + [f"({tot} > 0)", f"{tot} * {tot}"]
        out += [f"{cum[k]} * {cum[k]}" for k in range(NB)]
        out += [f"{cum[k]} * {h[k]}" for k in range(NB)]
        out += [f"{h[k]} * {h[k]}" for k in range(NB)]
        out += [f"{cum[k]} * {tot}" for k in range(NB)]
        out += [f"{h[k]} * {tot}" for k in range(NB)]
    return out


def layer_exprs(lookups: str, hits: str, present: str) -> list[str]:
    return [
        present,
        lookups,
        hits,
        f"{lookups} * {lookups}",
        f"{hits} * {hits}",
        f"{hits} * {lookups}",
    ]


def bucket_sql(first_ts: str) -> str:
    return (
        f"(CAST(({first_ts}) / {BUCKET_S} AS INTEGER) * {BUCKET_S})"  # ts > 0: truncation is floor
    )


def bucket_of(first_ts: npt.ArrayLike) -> np.ndarray:
    return np.floor(np.asarray(first_ts, dtype=float) / BUCKET_S) * BUCKET_S


def _q(c: str) -> str:
    return f'"{c}"'


def rebuild_sql(con: sqlite3.Connection, experiment: str | None = None) -> None:
    """Recompute ``ab_moments`` and ``ab_layer_moments`` (for one experiment or
    all) from ``ab_units`` / ``ab_lookups`` in SQL; runs in the caller's
    transaction."""
    where = "WHERE experiment = ?" if experiment is not None else ""
    args = (experiment,) if experiment is not None else ()
    con.execute(f"DELETE FROM ab_moments {where}", args)
    con.execute(f"DELETE FROM ab_layer_moments {where}", args)
    sums = [f"sum({e})" for e in unit_exprs(_q, "1")]
    exprs = sums[:2] + ["min(first_ts)", "max(last_ts)"] + sums[2:]
    b = bucket_sql("first_ts")
    con.execute(
        f"INSERT INTO ab_moments(experiment, variant, bucket, {', '.join(map(_q, COLUMNS))}) "
        f"SELECT experiment, variant, {b}, {', '.join(exprs)} FROM ab_units {where} "
        f"GROUP BY experiment, variant, {b}",
        args,
    )
    lwhere = "WHERE l.experiment = ?" if experiment is not None else ""
    lsums = ", ".join(f"sum({e})" for e in layer_exprs("l.lookups", "l.hits", "1"))
    con.execute(
        "INSERT INTO ab_layer_moments(experiment, variant, bucket, layer, "
        f"{', '.join(LAYER_COLUMNS)}) SELECT l.experiment, l.variant, {bucket_sql('u.first_ts')} "
        f"AS b, l.layer, {lsums} FROM ab_lookups l JOIN ab_units u ON u.experiment = l.experiment "
        f"AND u.variant = l.variant AND u.unit_hash = l.unit_hash {lwhere} GROUP BY l.experiment, "
        "l.variant, b, l.layer",
        args,
    )


def upsert_sql(table: str, select: str) -> str:
    """INSERT ... ``select`` ... that adds to existing moment rows (extrema combine by min /
    max)."""
    cols = COLUMNS if table == "ab_moments" else LAYER_COLUMNS
    keys = ("experiment", "variant", "bucket") + (("layer",) if table == "ab_layer_moments" else ())
    sets = []
    for c in cols:
        if c in _EXTREMA:
            fn = "min" if c == "min_first" else "max"
            sets.append(f"{_q(c)} = {fn}({_q(c)}, excluded.{_q(c)})")
        else:
            sets.append(f"{_q(c)} = {_q(c)} + excluded.{_q(c)}")
    return (
        f"INSERT INTO main.{table}({', '.join(map(_q, keys + cols))}) {select} "
        f"ON CONFLICT({', '.join(keys)}) DO UPDATE SET {', '.join(sets)}"
    )


def ddl() -> str:
    cols = ", ".join(f"{_q(c)} REAL DEFAULT 0" for c in COLUMNS)
    lcols = ", ".join(f"{c} REAL DEFAULT 0" for c in LAYER_COLUMNS)
    return (
        "CREATE TABLE IF NOT EXISTS ab_moments(experiment TEXT, variant TEXT, bucket REAL, "
        f"{cols}, PRIMARY KEY(experiment, variant, bucket)) WITHOUT ROWID;\n"
        "CREATE TABLE IF NOT EXISTS ab_layer_moments(experiment TEXT, variant TEXT, bucket REAL, "
        f"layer TEXT, {lcols}, PRIMARY KEY(experiment, variant, bucket, layer)) WITHOUT ROWID;\n"
    )


def ensure_columns(con: sqlite3.Connection) -> list[str]:
    """Add the sums a newly declared metric needs to an existing store's
    ``ab_moments`` and recompute the table from the unit rows (in the caller's
    transaction). Returns the columns added (none: nothing done)."""
    have = {r[1] for r in con.execute("PRAGMA table_info(ab_moments)")}
    missing = [c for c in COLUMNS if c not in have]
    if not have or not missing:
        return []
    for c in missing:
        con.execute(f"ALTER TABLE ab_moments ADD COLUMN {_q(c)} REAL DEFAULT 0")
    rebuild_sql(con)
    return missing
