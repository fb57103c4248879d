"""A/B moments: per-variant sums that a unit-level A/B test needs, kept up to
date by the embedded store as unit records arrive.

Every statistic in :mod:`analysis.ab` is a sum over units of a function of a
unit's *totals* (Σx, Σx², Σxy for delta-method ratios; per-bucket products
for clustered quantiles). When a flush window adds to a unit, the store knows
the unit's old totals (it upserts them), so it adds ``f(new) − f(old)`` to
the sums: exact, and reading a week-long experiment is then a few thousand
rows instead of one row per unit.

Sums are kept per (experiment, variant, bucket) where bucket is the start of
the ``BUCKET_S`` interval holding the unit's first record, so the report's
effect-over-time curve (units that arrived by time t) is a cumulative sum.

``ab_moments`` columns (after experiment, variant, bucket):

* ``n`` units, ``pos`` units with a conversion, ``min_first`` / ``max_last``
  the earliest first record and latest last record;
* ``s_<f>``, ``q_<f>``, ``x_<f>`` — Σf, Σf², Σf·requests for each request
  field f (requests, latency_sum, latency_sq, ttft_sum, conversions, value,
  gpu_s, sla_met);
* ``h<k>`` pooled request-duration histogram, ``nh`` units with at least one
  observation, ``nn`` ΣN², and per bucket k ``cc<k>`` ΣC_k², ``cd<k>``
  ΣC_k·h_k, ``dd<k>`` Σh_k², ``cn<k>`` ΣC_k·N, ``dn<k>`` Σh_k·N (N a unit's
  observations, C_k its observations below bucket k; see
  :class:`analysis.ab.Quantile`).

``ab_layer_moments`` columns (after experiment, variant, bucket, layer): ``n``
units with lookups in the layer, ``s_lookups``, ``s_hits``, ``q_lookups``,
``q_hits``, ``x_hits`` (Σ hits·lookups).

:func:`rebuild_sql` recomputes both tables from the unit rows in SQL — the
upgrade path for stores written before moments existed, and an independent
check of the incremental sums in the tests.
"""

from __future__ import annotations

import numpy as np

from .aggregator import UNIT_BUCKETS, UNIT_FIELDS

__all__ = ["BUCKET_S", "FIELDS", "NB", "COLUMNS", "LAYER_COLUMNS", "contributions", "layer_contributions",
           "unit_exprs", "layer_exprs", "bucket_sql",
           "bucket_of", "rebuild_sql", "upsert_sql", "ddl"]

BUCKET_S = 900.0
FIELDS = UNIT_FIELDS[2:]  # requests first
NB = len(UNIT_BUCKETS) + 1
_H = [f"h{k}" for k in range(NB)]
COLUMNS: tuple[str, ...] = (
    ("n", "pos", "min_first", "max_last")
    + tuple(f"{p}_{f}" for f in FIELDS for p in ("s", "q", "x"))
    + tuple(_H) + ("nh", "nn")
    + tuple(f"{p}{k}" for p in ("cc", "cd", "dd", "cn", "dn") for k in range(NB))
)
LAYER_COLUMNS = ("n", "s_lookups", "s_hits", "q_lookups", "q_hits", "x_hits")
_EXTREMA = ("min_first", "max_last")


def contributions(vals: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Each unit's row of COLUMNS from its totals. ``vals``: units × (first_ts,
    last_ts, FIELDS..., h0..h<NB-1>); ``present``: 0 for a unit that does not
    exist yet (its row is all zeros and counts nothing)."""
    m = len(vals)
    out = np.zeros((m, len(COLUMNS)))
    f = vals[:, 2:2 + len(FIELDS)]
    h = vals[:, 2 + len(FIELDS):]
    req = f[:, 0:1]
    out[:, 0] = present
    out[:, 1] = (f[:, FIELDS.index("conversions")] > 0) * present
    out[:, 2], out[:, 3] = vals[:, 0], vals[:, 1]
    i = 4
    sqx = np.empty((m, len(FIELDS) * 3))
    sqx[:, 0::3], sqx[:, 1::3], sqx[:, 2::3] = f, f * f, f * req
    out[:, i:i + sqx.shape[1]] = sqx
    i += sqx.shape[1]
    out[:, i:i + NB] = h
    i += NB
    tot = h.sum(axis=1)
    out[:, i] = tot > 0
    out[:, i + 1] = tot * tot
    i += 2
    cum = np.cumsum(h, axis=1) - h
    for block in (cum * cum, cum * h, h * h, cum * tot[:, None], h * tot[:, None]):
        out[:, i:i + NB] = block
        i += NB
    return out


def layer_contributions(lookups: np.ndarray, hits: np.ndarray, present: np.ndarray) -> np.ndarray:
    lookups = lookups.astype(float)
    hits = hits.astype(float)
    return np.column_stack([present.astype(float), lookups, hits, lookups * lookups, hits * hits, hits * lookups])


def unit_exprs(val, present: str) -> list[str]:
    """SQL for a unit's contribution to each COLUMNS entry except the extrema
    (min_first, max_last), from ``val(column) -> SQL`` of its totals;
    ``present`` is SQL that is 1 for a unit that exists (0: all zeros)."""
    f = {c: f"({val(c)})" for c in FIELDS}
    h = [f"({val(k)})" for k in _H]
    out = [present, f"(({f['conversions']} > 0) * {present})"]
    for c in FIELDS:
        out += [f[c], f"{f[c]} * {f[c]}", f"{f[c]} * {f['requests']}"]
    out += h
    tot = "(" + " + ".join(h) + ")"
    cum = ["0"] + ["(" + " + ".join(h[:k]) + ")" for k in range(1, NB)]
    out += [f"({tot} > 0)", f"{tot} * {tot}"]
    out += [f"{cum[k]} * {cum[k]}" for k in range(NB)]
    out += [f"{cum[k]} * {h[k]}" for k in range(NB)]
    out += [f"{h[k]} * {h[k]}" for k in range(NB)]
    out += [f"{cum[k]} * {tot}" for k in range(NB)]
    out += [f"{h[k]} * {tot}" for k in range(NB)]
    return out


def layer_exprs(lookups: str, hits: str, present: str) -> list[str]:
    return [present, lookups, hits, f"{lookups} * {lookups}", f"{hits} * {hits}", f"{hits} * {lookups}"]


def bucket_sql(first_ts: str) -> str:
    return f"(CAST(({first_ts}) / {BUCKET_S} AS INTEGER) * {BUCKET_S})"  # ts > 0: truncation is floor


def bucket_of(first_ts: np.ndarray) -> np.ndarray:
    return np.floor(np.asarray(first_ts, dtype=float) / BUCKET_S) * BUCKET_S


def _q(c: str) -> str:
    return f'"{c}"'


def rebuild_sql(con, experiment: str | None = None) -> None:
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
        f"GROUP BY experiment, variant, {b}", args)
    lwhere = "WHERE l.experiment = ?" if experiment is not None else ""
    lsums = ", ".join(f"sum({e})" for e in layer_exprs("l.lookups", "l.hits", "1"))
    con.execute(
        f"INSERT INTO ab_layer_moments(experiment, variant, bucket, layer, {', '.join(LAYER_COLUMNS)}) "
        f"SELECT l.experiment, l.variant, {bucket_sql('u.first_ts')} AS b, l.layer, {lsums} "
        "FROM ab_lookups l JOIN ab_units u ON u.experiment = l.experiment AND u.variant = l.variant "
        f"AND u.unit_hash = l.unit_hash {lwhere} GROUP BY l.experiment, l.variant, b, l.layer", args)


def upsert_sql(table: str, select: str) -> str:
    """INSERT ... ``select`` ... that adds to existing moment rows (extrema combine by min / max)."""
    cols = COLUMNS if table == "ab_moments" else LAYER_COLUMNS
    keys = ("experiment", "variant", "bucket") + (("layer",) if table == "ab_layer_moments" else ())
    sets = []
    for c in cols:
        if c in _EXTREMA:
            fn = "min" if c == "min_first" else "max"
            sets.append(f"{_q(c)} = {fn}({_q(c)}, excluded.{_q(c)})")
        else:
            sets.append(f"{_q(c)} = {_q(c)} + excluded.{_q(c)}")
    return (f"INSERT INTO main.{table}({', '.join(map(_q, keys + cols))}) {select} "
            f"ON CONFLICT({', '.join(keys)}) DO UPDATE SET {', '.join(sets)}")


def ddl() -> str:
    cols = ", ".join(f"{_q(c)} REAL DEFAULT 0" for c in COLUMNS)
    lcols = ", ".join(f"{c} REAL DEFAULT 0" for c in LAYER_COLUMNS)
    return (f"CREATE TABLE IF NOT EXISTS ab_moments(experiment TEXT, variant TEXT, bucket REAL, {cols}, "
            "PRIMARY KEY(experiment, variant, bucket)) WITHOUT ROWID;\n"
            f"CREATE TABLE IF NOT EXISTS ab_layer_moments(experiment TEXT, variant TEXT, bucket REAL, layer TEXT, "
            f"{lcols}, PRIMARY KEY(experiment, variant, bucket, layer)) WITHOUT ROWID;\n")
