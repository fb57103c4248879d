"""The embedded store's write path: one transaction per batch of rows.

Appends, upserts and replaces as each record declares (see
:mod:`collectors.records`), the hourly rollups, and the A/B unit rows with
their moments (:mod:`model.ab_metrics`). Everything that needs no store
access (folding a batch's A/B rows and rollups) runs before the write
lock."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from warmscope.model import ab_metrics as _m
from warmscope.model import records

from .layout import MEASURES, REPLACE, ROLLUP_S, TABLES, UPSERT, q

__all__ = ["StoreWriter", "histogram_row", "backfill_rollups"]

_AB_KEYS = records.UNIT_KEYS
_AB_UNIT_COLS = records.AB_UNITS.cols
_AB_LOOKUP_COLS = records.AB_LOOKUPS.cols
_AB_SUMS = records.AB_UNITS.measures
_NK = len(_AB_KEYS)  # key columns lead a unit row, then first_ts, last_ts, then the sums
_FIRST, _LAST = records.AB_UNITS.index("first_ts"), records.AB_UNITS.index("last_ts")
_LOOKUPS, _HITS = records.AB_LOOKUPS.index("lookups"), records.AB_LOOKUPS.index("hits")
_AB_SELECT = 400  # keys per IN (...) lookup of existing rows


class StoreWriter:
    """Write methods of :class:`collectors.store.EmbeddedStore` (needs ``_con()``)."""

    def _con(self) -> sqlite3.Connection:  # pragma: no cover - provided by EmbeddedStore
        raise NotImplementedError

    def write(self, batches: Mapping[str, Sequence[Sequence[Any]]]) -> int:
        """Write all batches in one transaction; returns rows written.

        ``hot_keys``, ``ab_units`` and ``ab_lookups`` rows add to existing rows
        (upsert); ``warmup_runs``, ``warmed_keys`` and ``early_keys`` rows
        replace them; the rest append. ``lookups``, ``writes``, ``requests``
        and ``histograms`` rows also add to their hourly rollups. The
        transaction takes the write lock first (read-modify-write of A/B units
        and rollups stays correct with several writer processes).
        Raises sqlite3.Error on failure (the caller keeps the batch and retries).
        """
        con = self._con()
        # Everything that needs no store access happens before the write lock.
        ab = bool(batches.get("ab_units") or batches.get("ab_lookups"))
        if ab:
            folded = _fold_ab(batches.get("ab_units") or (), batches.get("ab_lookups") or ())
        rollups = {t: fold_rollup(t, rows) for t, rows in batches.items() if rows and t in MEASURES}
        n = 0
        con.execute("BEGIN IMMEDIATE")
        try:
            if ab:
                _write_ab(con, *folded)
                n += len(batches.get("ab_units") or ()) + len(batches.get("ab_lookups") or ())
            for table, rows in batches.items():
                if not rows or table in ("ab_units", "ab_lookups"):
                    continue
                con.executemany(_insert_sql(table), rows)
                n += len(rows)
            for table, acc in rollups.items():
                write_rollup(con, table, acc)
            if batches.get("block_trace"):
                thin_block_trace(con, max(float(r[0]) for r in batches["block_trace"]))
            con.commit()
        except BaseException:
            con.rollback()
            raise
        return n

    def write_faults(self, faults: Iterable[dict[Any, Any]]) -> None:
        rows = [
            (
                f["trap"],
                json.dumps(f["scope"], sort_keys=True),
                f["start"],
                f["end"],
                json.dumps(f.get("params", {}), sort_keys=True),
            )
            for f in faults
        ]
        self.write({"faults": rows})

    def set_meta(self, key: str, value: str) -> None:
        with self._con() as con:
            con.execute("INSERT OR REPLACE INTO meta(key, value) VALUES(?, ?)", (key, value))


_INSERT: dict[str, str] = {}


# The block trace is kept whole for a day; beyond it one request in eight, sampled by its first
# block (``bucket``): a sampled request keeps every request that shares its first block, so the
# prefix sharing within what is kept stays exact (a replay of it is a spatially sampled one).
TRACE_FULL_S = 86_400.0
TRACE_KEEP_BUCKETS = 32  # of 256


def thin_block_trace(con: sqlite3.Connection, newest: float) -> int:
    """Drop the block-trace rows older than :data:`TRACE_FULL_S` before ``newest`` outside the
    sample (inside the caller's transaction); returns the rows dropped."""
    cur = con.execute(
        "DELETE FROM block_trace WHERE ts < ? AND bucket >= ?",
        (newest - TRACE_FULL_S, TRACE_KEEP_BUCKETS),
    )
    return int(cur.rowcount or 0)


def _insert_sql(table: str) -> str:
    sql = _INSERT.get(table)
    if sql is None:
        cols = TABLES[table]
        verb = "INSERT OR REPLACE INTO" if table in REPLACE else "INSERT INTO"
        sql = _INSERT[table] = (
            f"{verb} {table}({', '.join(map(q, cols))}) VALUES({', '.join('?' * len(cols))})"
            + UPSERT.get(table, "")
        )
    return sql


# ------------------------------------------------------------------ A/B units
def _existing(
    con: sqlite3.Connection, table: str, cols: Sequence[str], keys: list[tuple[Any, ...]]
) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """Current rows of ``table`` for ``keys`` (experiment, variant, unit_hash[, layer]), by key."""
    out: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    by_ev: dict[tuple[Any, ...], list[Any]] = {}
    for k in keys:
        by_ev.setdefault(k[:2], []).append(k[2:])
    nk = len(keys[0]) if keys else 3
    sel = ", ".join(map(q, ("unit_hash", "layer")[: nk - 2] + tuple(cols)))
    for (exp, var), rest in by_ev.items():
        hashes = sorted({r[0] for r in rest})
        for i in range(0, len(hashes), _AB_SELECT):
            chunk = hashes[i : i + _AB_SELECT]
            sql = (
                f"SELECT {sel} FROM {table} WHERE experiment = ? AND variant = ? "
                f"AND unit_hash IN ({', '.join('?' * len(chunk))})"
            )
            for row in con.execute(sql, (exp, var, *chunk)):
                out[(exp, var) + tuple(row[: nk - 2])] = tuple(row[nk - 2 :])
    return out


def _add_moments(
    con: sqlite3.Connection,
    table: str,
    groups: list[tuple[Any, ...]],
    delta: Any,
    min_max: bool = False,
) -> None:
    """Sum per-unit moment deltas by group and add them to ``table``."""
    import numpy as np

    index: dict[tuple[Any, ...], int] = {}
    gid = np.array([index.setdefault(g, len(index)) for g in groups])
    sums = np.zeros((len(index), delta.shape[1]))
    np.add.at(sums, gid, delta)
    if min_max:  # min_first / max_last are extrema, not sums
        sums[:, 2] = np.inf
        sums[:, 3] = -np.inf
        np.minimum.at(sums[:, 2], gid, delta[:, 2])
        np.maximum.at(sums[:, 3], gid, delta[:, 3])
    width = len(next(iter(index))) + delta.shape[1]
    con.executemany(
        _m.upsert_sql(table, f"VALUES({', '.join('?' * width)})"),
        [g + tuple(row) for g, row in zip(index, sums.tolist(), strict=True)],
    )


def _fold_ab(
    unit_rows: Sequence[Sequence[Any]], lookup_rows: Sequence[Sequence[Any]]
) -> tuple[list[Any], list[Any]]:
    """A batch's unit rows summed per unit and lookup rows per unit × layer
    (a retried batch, or a write that merges several flushes, can repeat a unit).
    A key seen once keeps its row as it is; a repeated one is summed in order."""
    nf = len(_AB_SUMS)
    s0 = _LAST + 1  # first sum
    add: dict[tuple[Any, ...], Any] = {}
    mine: set[tuple[Any, ...]] = (
        set()
    )  # keys whose row is a copy summed here (the caller's rows stay untouched)
    for r in unit_rows:
        k = tuple(r[:_NK])
        a = add.get(k)
        if a is None:
            add[k] = r
            continue
        if k not in mine:
            a = add[k] = list(a)
            mine.add(k)
        a[_FIRST], a[_LAST] = min(a[_FIRST], r[_FIRST]), max(a[_LAST], r[_LAST])
        for i in range(s0, s0 + nf):
            a[i] += r[i]
    ladd: dict[tuple[Any, ...], Any] = {}
    lmine: set[tuple[Any, ...]] = set()  # likewise for unit × layer keys
    for r in lookup_rows:
        k = tuple(r[: _NK + 1])
        a = ladd.get(k)
        if a is None:
            ladd[k] = r
            continue
        if k not in lmine:
            a = ladd[k] = list(a)
            lmine.add(k)
        a[_LOOKUPS] += r[_LOOKUPS]
        a[_HITS] += r[_HITS]
    return [tuple(v) for v in add.values()], [tuple(v) for v in ladd.values()]


def _write_ab(con: sqlite3.Connection, units: list[Any], lookups: list[Any]) -> None:
    """Add the folded unit records (``units`` / ``lookups``, see :func:`_fold_ab`) to their
    units' rows, and to the A/B moments ``f(new totals) − f(old totals)`` (see
    :mod:`model.ab_metrics`): one row per unit and per unit × layer. A unit with lookups but no
    request record gets an all-zero unit row, so every unit is counted once.
    Runs under the write lock (it reads the rows it adds to): the units' stored rows are read by
    key (most units are new, and a unit that is new has no layer rows either), then upserted
    (a day of the demo: 27 CPU-s per million requests where staging the rows in temp tables and
    joining them took 34)."""
    import numpy as np

    now = max((r[_LAST] for r in units), default=None)
    if now is None:
        now = time.time()
    # Units with lookups but neither a unit row in this batch nor one stored (first seen, in order).
    ukeys = {r[:_NK] for r in units}
    cand = list(dict.fromkeys(k for k in (r[:_NK] for r in lookups) if k not in ukeys))
    # One read of the stored unit rows, for the batch's units and those candidates alike.
    found = _existing(con, "ab_units", _AB_UNIT_COLS[_NK:], list(ukeys) + cand)
    stored = {k: found[k] for k in cand if k in found}  # a row from an earlier batch
    old_rows = {k: v for k, v in found.items() if k in ukeys}
    zero = [k for k in cand if k not in stored]
    if zero:
        units = units + [k + (now, now) + (0,) * len(_AB_SUMS) for k in zero]
    bucket_by = _unit_moments(con, units, old_rows) if units else {}
    if stored:  # units whose unit row came in an earlier batch
        firsts = np.array([row[_FIRST - _NK] for row in stored.values()], dtype=float)
        bucket_by.update(zip(stored, _m.bucket_of(firsts).tolist(), strict=True))
    con.executemany(_UNIT_UPSERT, units)
    if lookups:
        had = old_rows.keys() | stored.keys()  # a unit stored before may have layer rows
        keys = [r[: _NK + 1] for r in lookups if r[:_NK] in had]
        lold = _existing(con, "ab_lookups", ("lookups", "hits"), keys) if keys else {}
        _layer_moments(con, lookups, lold, bucket_by)
        con.executemany(_LOOKUP_UPSERT, lookups)


_UNIT_UPSERT = (
    f"INSERT INTO main.ab_units({', '.join(map(q, _AB_UNIT_COLS))}) "
    f"VALUES({', '.join('?' * len(_AB_UNIT_COLS))}) ON CONFLICT({', '.join(_AB_KEYS)}) DO UPDATE "
    "SET first_ts = min(first_ts, excluded.first_ts), last_ts = max(last_ts, excluded.last_ts), "
    + ", ".join(f"{q(c)} = {q(c)} + excluded.{q(c)}" for c in _AB_SUMS)
)
_LOOKUP_UPSERT = (
    f"INSERT INTO main.ab_lookups({', '.join(map(q, _AB_LOOKUP_COLS))}) "
    f"VALUES({', '.join('?' * len(_AB_LOOKUP_COLS))}) ON CONFLICT({', '.join(_AB_KEYS)}, layer) "
    "DO UPDATE SET lookups = lookups + excluded.lookups, hits = hits + excluded.hits"
)


def _unit_moments(
    con: sqlite3.Connection, units: list[Any], old_rows: dict[tuple[Any, ...], tuple[Any, ...]]
) -> dict[tuple[Any, ...], float]:
    """Add f(new) − f(old) of each unit to ``ab_moments`` (``old_rows``: the stored rows of the
    units that exist already, most are new); returns each unit's bucket."""
    import numpy as np

    nv = len(_AB_UNIT_COLS) - _NK
    d = np.array([r[_NK:] for r in units], dtype=float)
    o = np.zeros_like(d)
    present = np.zeros(len(units))
    if old_rows:
        idx = [i for i, r in enumerate(units) if r[:_NK] in old_rows]
        if idx:
            o[idx] = np.array([old_rows[units[i][:_NK]] for i in idx], dtype=float).reshape(-1, nv)
            present[idx] = 1
    new = o + d
    new[:, 0] = np.where(present > 0, np.minimum(o[:, 0], d[:, 0]), d[:, 0])
    new[:, 1] = np.where(present > 0, np.maximum(o[:, 1], d[:, 1]), d[:, 1])
    delta = _m.contributions(new, np.ones(len(units))) - _m.contributions(o, present)
    delta[:, 2], delta[:, 3] = new[:, 0], new[:, 1]  # extrema: combined with min / max
    buckets = _m.bucket_of(np.where(present > 0, o[:, 0], d[:, 0])).tolist()
    _add_moments(
        con,
        "ab_moments",
        [r[:2] + (b,) for r, b in zip(units, buckets, strict=True)],
        delta,
        min_max=True,
    )
    return {r[:_NK]: b for r, b in zip(units, buckets, strict=True)}


def _layer_moments(
    con: sqlite3.Connection,
    lookups: list[Any],
    lold: dict[tuple[Any, ...], tuple[Any, ...]],
    bucket_by: dict[Any, Any],
) -> None:
    """Layer moments the same way (``lold``: old per-layer totals of stored unit × layer rows)."""
    import numpy as np

    t = np.array([(r[_LOOKUPS], r[_HITS]) for r in lookups], dtype=float)
    if lold:
        o = np.array([lold.get(r[: _NK + 1], (0, 0)) for r in lookups], dtype=float).reshape(-1, 2)
        present = np.array([r[: _NK + 1] in lold for r in lookups], dtype=float)
    else:  # all new unit × layer rows
        o, present = np.zeros((len(lookups), 2)), np.zeros(len(lookups))
    delta = _m.layer_contributions(
        o[:, 0] + t[:, 0], o[:, 1] + t[:, 1], np.ones(len(lookups))
    ) - _m.layer_contributions(o[:, 0], o[:, 1], present)
    _add_moments(
        con, "ab_layer_moments", [r[:2] + (bucket_by[r[:_NK]], r[_NK]) for r in lookups], delta
    )


# -------------------------------------------------------------------- rollups
def _hour(ts: float) -> float:
    return float(
        -(-ts // ROLLUP_S) * ROLLUP_S
    )  # the end of the hour holding ts (a flush's ts ends its interval)


_HC = records.HISTOGRAMS.index(
    "counts"
)  # histogram rows: ts, metric, labels, bounds, counts, sum, total
_HS, _HT = records.HISTOGRAMS.index("sum"), records.HISTOGRAMS.index("total")


def fold_rollup(table: str, rows: Iterable[Sequence[Any]]) -> dict[tuple[Any, ...], list[Any]]:
    """Rows summed by (hour, labels); no store access (runs before the lock)."""
    acc: dict[tuple[Any, ...], list[Any]] = {}
    hours: dict[float, float] = {}  # a batch's rows share a few flush times
    if table == "histograms":
        for r in rows:
            h = hours.get(r[0])
            if h is None:
                h = hours[r[0]] = _hour(r[0])
            k = (h, *r[1:_HC])
            c = json.loads(r[_HC])
            a = acc.get(k)
            if a is None:
                acc[k] = [c, r[_HS], r[_HT]]
            else:
                a[0] = [x + y for x, y in zip(a[0], c, strict=True)]
                a[1] += r[_HS]
                a[2] += r[_HT]
        return acc
    nm = len(MEASURES[table])
    nd = len(TABLES[table]) - nm  # the time column and labels come first, measures last
    for r in rows:
        h = hours.get(r[0])
        if h is None:
            h = hours[r[0]] = _hour(r[0])
        k = (h, *r[1:nd])
        a = acc.get(k)
        if a is None:
            acc[k] = list(r[nd:])
        elif nm == 1:
            a[0] += r[nd]
        else:
            for i in range(nm):
                a[i] += r[nd + i]
    return acc


def write_rollup(
    con: sqlite3.Connection, table: str, acc: dict[tuple[Any, ...], list[Any]]
) -> None:
    cols = TABLES[table]
    if table == "histograms":
        hours = sorted({k[0] for k in acc})
        for row in con.execute(
            f"SELECT {', '.join(map(q, cols))} FROM histograms_1h "
            f"WHERE ts IN ({', '.join('?' * len(hours))})",
            hours,
        ):
            a = acc.get(tuple(row[:_HC]))
            if a is not None:
                a[0] = [x + y for x, y in zip(a[0], json.loads(row[_HC]), strict=True)]
                a[1] += row[_HS]
                a[2] += row[_HT]
        con.executemany(
            f"INSERT OR REPLACE INTO histograms_1h({', '.join(map(q, cols))}) "
            f"VALUES({', '.join('?' * len(cols))})",
            [k + (",".join(map(str, v[0])).join("[]"), v[1], v[2]) for k, v in acc.items()],
        )
        return
    meas = MEASURES[table]
    nd = len(cols) - len(meas)
    sets = ", ".join(f"{q(m)} = {q(m)} + excluded.{q(m)}" for m in meas)
    con.executemany(
        f"INSERT INTO {table}_1h({', '.join(map(q, cols))}) VALUES({', '.join('?' * len(cols))}) "
        f"ON CONFLICT({', '.join(map(q, cols[:nd]))}) DO UPDATE SET {sets}",
        [k + tuple(v) for k, v in acc.items()],
    )


def backfill_rollups(con: sqlite3.Connection) -> None:
    """Rebuild the hourly rollups from the per-flush rows (upgrades)."""
    for table, meas in MEASURES.items():
        con.execute(f"DELETE FROM {table}_1h")
        if table == "histograms":
            cur = con.execute(
                f"SELECT {', '.join(map(q, TABLES[table]))} FROM histograms ORDER BY ts"
            )
            while True:
                chunk = cur.fetchmany(50_000)
                if not chunk:
                    break
                write_rollup(con, "histograms", fold_rollup("histograms", chunk))
            continue
        cols = TABLES[table]
        dims = [c for c in cols if c not in meas]
        x = f"(ts / {ROLLUP_S})"
        # ceil, for ts > 0
        hour = f"(CAST({x} AS INTEGER) + ({x} > CAST({x} AS INTEGER))) * {ROLLUP_S}"
        con.execute(
            f"INSERT INTO {table}_1h({', '.join(map(q, cols))}) SELECT {hour}, "
            f"{', '.join(map(q, dims[1:]))}, {', '.join(f'sum({q(m)})' for m in meas)} FROM "
            f"{table} GROUP BY {hour}, {', '.join(map(q, dims[1:]))}"
        )


_BOUNDS_JSON: dict[tuple[Any, ...], str] = {}


def histogram_row(
    ts: float,
    metric: str,
    labels: tuple[Any, ...],
    bounds: Sequence[float],
    counts: Sequence[int],
    total_sum: float,
    total: int,
) -> tuple[Any, ...]:
    """A ``histograms`` row (its columns in :data:`collectors.records.HISTOGRAMS` order)."""
    bj = _BOUNDS_JSON.get(tuple(bounds))
    if bj is None:
        bj = _BOUNDS_JSON[tuple(bounds)] = json.dumps(list(bounds))
    return (ts, metric, *labels, bj, ",".join(map(str, counts)).join("[]"), total_sum, total)
