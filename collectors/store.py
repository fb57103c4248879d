"""The embedded store: one SQLite file (WAL) that owns warmscope's local schema.

It is the default backend, so that one command gives a working dashboard with
no servers. One writer (a process's flusher) and any number of readers, across
processes. The collectors write batches; analysis and the app read canonical
pandas frames with :meth:`EmbeddedStore.frame`. Timestamps are Unix seconds
(float) — virtual seconds when the simulator writes.

Canonical frames (every backend yields these columns):

``lookups``
    ts, tenant, layer, family, result (hit|miss|bypass|error), experiment,
    variant, model, replica, length_bucket, count — lookups in the flush
    interval ending at ts.
``writes``
    ts, tenant, layer, family, replica, count.
``requests``
    ts, tenant, experiment, variant, model, replica, sla_met ("true"|"false"|""),
    requests, gpu_s, conversions, value.
``histograms``
    ts, metric, tenant, experiment, variant, model, replica, layer, le (upper
    bound, inf for the overflow bucket), count (non-cumulative, > 0), sum,
    total — one row per non-empty bucket; ``sum``/``total`` repeat on each
    bucket row of the same series.
    metric is the OTel instrument name (``gen_ai.server.time_to_first_token``,
    ``gen_ai.server.request.duration``, token histograms; layer is "" for
    these) or ``warmscope.cache.load.duration`` (layer = the cache layer).
``gauges``
    ts, metric, replica, value — last value per flush
    (``warmscope.gpu.memory.usage_ratio``: share of GPU cache memory in use).
``warmup_runs``
    run_id, replica, tenant, layer, strategy, trigger, started, ended (NaN while
    running), status (running|ok|error|cancelled), keys, bytes, gpu_s,
    memory_bytes, error.
``warmed_keys``
    run_id, key_hash, family, tenant, layer, warmed_at, ttl_s, gpu_s (what
    warming it cost), first_hit_at, first_miss_at, hits — one row per key a
    warm-up run wrote.
``early_keys``
    run_id, key_hash, family, first_seen, lookups — keys requested in the
    recall window after a run (see collectors.config.early_window_s).
``hot_keys``
    window (start, Unix s), tenant, layer, key_hash, family, hits, misses, err
    (Space-Saving error bound: true count >= hits + misses - err).
``ab_units``
    experiment, variant, unit_hash, first_ts, last_ts, requests, latency_sum,
    latency_sq, ttft_sum, conversions, value, gpu_s, sla_met, h0..hN — an
    experiment unit's request-level sums and request-duration histogram
    (bounds ``schema.DURATION_BUCKETS`` + inf) from its first flush window
    (first_ts) to its last (last_ts): one row per unit, rows written in later
    flush windows add to it (upsert), so readers never aggregate raw rows.
``ab_lookups``
    experiment, variant, unit_hash, layer, lookups, hits — a unit's lookups
    and hits in one cache layer, one row per unit and layer (upsert too).
    :meth:`EmbeddedStore.units` joins both into one wide row per unit.
    Writes also keep per-variant A/B moments (``ab_moments``,
    ``ab_layer_moments``; see :mod:`collectors.ab_moments` and
    :meth:`EmbeddedStore.moments`) from which a report needs no unit rows.
``faults``
    trap, scope (JSON object dimension -> value), start, end, params (JSON) —
    ground truth written by the simulator.

Frames with a ``ts`` column come sorted by ``ts``. ``lookups``, ``writes``,
``requests`` and ``histograms`` also exist as hourly rollups, kept as rows are
written: ``frame(name, start, end, step=3600)`` returns the same columns with
one row per hour and label set (ts = the hour's end); ``df.attrs["step_s"]``
is set on rollup frames only (absent: per flush).

Example::

    store = EmbeddedStore("var/warmscope.sqlite")
    df = store.frame("lookups", start=t0, end=t1)
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any, Iterable, Sequence

from . import ab_moments as _m
from .aggregator import UNIT_BUCKETS, UNIT_FIELDS

__all__ = ["EmbeddedStore", "StoreError", "FRAMES", "SCHEMA_VERSION"]

SCHEMA_VERSION = 3  # 3: ab_units / ab_lookups hold one row per unit (upsert)
_H = [f"h{i}" for i in range(len(UNIT_BUCKETS) + 1)]

_TABLES: dict[str, tuple[str, ...]] = {
    "lookups": ("ts", "tenant", "layer", "family", "result", "experiment", "variant", "model",
                "replica", "length_bucket", "count"),
    "writes": ("ts", "tenant", "layer", "family", "replica", "count"),
    "requests": ("ts", "tenant", "experiment", "variant", "model", "replica", "sla_met",
                 "requests", "gpu_s", "conversions", "value"),
    "histograms": ("ts", "metric", "tenant", "experiment", "variant", "model", "replica", "layer",
                   "bounds", "counts", "sum", "total"),
    "gauges": ("ts", "metric", "replica", "value"),
    "warmup_runs": ("run_id", "replica", "tenant", "layer", "strategy", "trigger", "started",
                    "ended", "status", "keys", "bytes", "gpu_s", "memory_bytes", "error"),
    "warmed_keys": ("run_id", "key_hash", "family", "tenant", "layer", "warmed_at", "ttl_s", "gpu_s",
                    "first_hit_at", "first_miss_at", "hits"),
    "early_keys": ("run_id", "key_hash", "family", "first_seen", "lookups"),
    "hot_keys": ("window", "tenant", "layer", "key_hash", "family", "hits", "misses", "err"),
    "ab_units": ("experiment", "variant", "unit_hash", "first_ts", "last_ts") + UNIT_FIELDS[2:] + tuple(_H),
    "ab_lookups": ("experiment", "variant", "unit_hash", "layer", "lookups", "hits"),
    "faults": ("trap", "scope", "start", "end", "params"),
}
FRAMES = tuple(_TABLES)

_DDL = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS lookups(ts REAL, tenant TEXT, layer TEXT, family TEXT, result TEXT,
  experiment TEXT, variant TEXT, model TEXT, replica TEXT, length_bucket TEXT, count INTEGER);
CREATE INDEX IF NOT EXISTS lookups_ts ON lookups(ts);
CREATE TABLE IF NOT EXISTS writes(ts REAL, tenant TEXT, layer TEXT, family TEXT, replica TEXT, count INTEGER);
CREATE INDEX IF NOT EXISTS writes_ts ON writes(ts);
CREATE TABLE IF NOT EXISTS requests(ts REAL, tenant TEXT, experiment TEXT, variant TEXT, model TEXT,
  replica TEXT, sla_met TEXT, requests INTEGER, gpu_s REAL, conversions INTEGER, value REAL);
CREATE INDEX IF NOT EXISTS requests_ts ON requests(ts);
CREATE TABLE IF NOT EXISTS histograms(ts REAL, metric TEXT, tenant TEXT, experiment TEXT, variant TEXT,
  model TEXT, replica TEXT, layer TEXT, bounds TEXT, counts TEXT, sum REAL, total INTEGER);
CREATE TABLE IF NOT EXISTS gauges(ts REAL, metric TEXT, replica TEXT, value REAL);
CREATE INDEX IF NOT EXISTS gauges_ts ON gauges(ts);
CREATE INDEX IF NOT EXISTS histograms_ts ON histograms(ts);
CREATE TABLE IF NOT EXISTS warmup_runs(run_id TEXT PRIMARY KEY, replica TEXT, tenant TEXT, layer TEXT,
  strategy TEXT, trigger TEXT, started REAL, ended REAL, status TEXT, keys INTEGER, bytes INTEGER,
  gpu_s REAL, memory_bytes INTEGER, error TEXT);
CREATE TABLE IF NOT EXISTS warmed_keys(run_id TEXT, key_hash TEXT, family TEXT, tenant TEXT, layer TEXT,
  warmed_at REAL, ttl_s REAL, gpu_s REAL, first_hit_at REAL, first_miss_at REAL, hits INTEGER,
  PRIMARY KEY(run_id, key_hash)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS early_keys(run_id TEXT, key_hash TEXT, family TEXT, first_seen REAL,
  lookups INTEGER, PRIMARY KEY(run_id, key_hash)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS hot_keys(window REAL, tenant TEXT, layer TEXT, key_hash TEXT, family TEXT,
  hits INTEGER, misses INTEGER, err INTEGER, PRIMARY KEY(window, tenant, layer, key_hash)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ab_units(experiment TEXT, variant TEXT, unit_hash TEXT, first_ts REAL,
  last_ts REAL, requests INTEGER, latency_sum REAL, latency_sq REAL,
  ttft_sum REAL, conversions INTEGER, value REAL, gpu_s REAL, sla_met INTEGER, {hcols},
  PRIMARY KEY(experiment, variant, unit_hash)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ab_lookups(experiment TEXT, variant TEXT, unit_hash TEXT, layer TEXT,
  lookups INTEGER, hits INTEGER, PRIMARY KEY(experiment, variant, unit_hash, layer)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS faults(trap TEXT, scope TEXT, start REAL, "end" REAL, params TEXT);
""".replace("{hcols}", ", ".join(f"{h} INTEGER DEFAULT 0" for h in _H)) + _m.ddl()

# Hourly rollups of the per-flush tables, kept at write time (upsert into the
# hour that holds the flush's ts; a rollup row's ts is the hour's end). Views
# over days read these: ~60x fewer rows than the per-minute flushes.
ROLLUP_S = 3600.0
_MEASURES = {"lookups": ("count",), "writes": ("count",), "requests": ("requests", "gpu_s", "conversions", "value"),
             "histograms": ("counts", "sum", "total")}
ROLLUPS = tuple(_MEASURES)


def _q(col: str) -> str:
    return f'"{col}"'


def _rollup_ddl() -> str:
    out = []
    for t, meas in _MEASURES.items():
        dims = [c for c in _TABLES[t] if c not in meas]
        out.append(f"CREATE TABLE IF NOT EXISTS {t}_1h AS SELECT * FROM {t} WHERE 0;\n"
                   f"CREATE UNIQUE INDEX IF NOT EXISTS {t}_1h_key ON {t}_1h({', '.join(map(_q, dims))});\n")
    return "".join(out)


_DDL += _rollup_ddl()


_AB_KEYS = ("experiment", "variant", "unit_hash")
_AB_SUMS = tuple(c for c in _TABLES["ab_units"] if c not in _AB_KEYS + ("first_ts", "last_ts"))
_AB_SELECT = 400  # keys per IN (...) lookup of existing rows


def _existing(con: sqlite3.Connection, table: str, cols: Sequence[str], keys: list[tuple]) -> dict[tuple, tuple]:
    """Current rows of ``table`` for ``keys`` (experiment, variant, unit_hash[, layer]), by key."""
    out: dict[tuple, tuple] = {}
    by_ev: dict[tuple, list] = {}
    for k in keys:
        by_ev.setdefault(k[:2], []).append(k[2:])
    nk = len(keys[0]) if keys else 3
    sel = ", ".join(map(_q, ("unit_hash", "layer")[:nk - 2] + tuple(cols)))
    for (exp, var), rest in by_ev.items():
        hashes = sorted({r[0] for r in rest})
        for i in range(0, len(hashes), _AB_SELECT):
            chunk = hashes[i:i + _AB_SELECT]
            sql = (f"SELECT {sel} FROM {table} WHERE experiment = ? AND variant = ? "
                   f"AND unit_hash IN ({', '.join('?' * len(chunk))})")
            for row in con.execute(sql, (exp, var, *chunk)):
                out[(exp, var) + tuple(row[:nk - 2])] = tuple(row[nk - 2:])
    return out


def _add_moments(con: sqlite3.Connection, table: str, groups: list[tuple], delta, min_max: bool = False) -> None:
    """Sum per-unit moment deltas by group and add them to ``table``."""
    import numpy as np

    index: dict[tuple, int] = {}
    gid = np.array([index.setdefault(g, len(index)) for g in groups])
    sums = np.zeros((len(index), delta.shape[1]))
    np.add.at(sums, gid, delta)
    if min_max:  # min_first / max_last are extrema, not sums
        sums[:, 2] = np.inf
        sums[:, 3] = -np.inf
        np.minimum.at(sums[:, 2], gid, delta[:, 2])
        np.maximum.at(sums[:, 3], gid, delta[:, 3])
    width = len(next(iter(index))) + delta.shape[1]
    con.executemany(_m.upsert_sql(table, f"VALUES({', '.join('?' * width)})"),
                    [g + tuple(row) for g, row in zip(index, sums.tolist())])


def _fold_ab(unit_rows, lookup_rows) -> tuple[list, list]:
    """A batch's unit rows summed per unit and lookup rows per unit × layer
    (a retried batch can repeat a unit)."""
    ukeys = {r[:3] for r in unit_rows}
    lkeys = {r[:4] for r in lookup_rows}
    if len(ukeys) == len(unit_rows) and len(lkeys) == len(lookup_rows):  # the usual case: nothing to fold
        return [tuple(r) for r in unit_rows], [tuple(r) for r in lookup_rows]
    nf = len(_AB_SUMS)
    add: dict[tuple, list] = {}
    for r in unit_rows:
        k = tuple(r[:3])
        a = add.get(k)
        if a is None:
            add[k] = [r[3], r[4], *r[5:]]
        else:
            a[0], a[1] = min(a[0], r[3]), max(a[1], r[4])
            for i in range(nf):
                a[2 + i] += r[5 + i]
    ladd: dict[tuple, list] = {}
    for r in lookup_rows:
        k = tuple(r[:4])
        a = ladd.get(k)
        if a is None:
            ladd[k] = [r[4], r[5]]
        else:
            a[0] += r[4]
            a[1] += r[5]
    return [k + tuple(v) for k, v in add.items()], [k + tuple(v) for k, v in ladd.items()]


def _stage_ab(con: sqlite3.Connection, unit_rows, lookup_rows) -> tuple[list, list]:
    """Fold a batch's A/B rows and copy them into connection-private temp
    tables; touches no shared table, so it runs before the write lock.
    Returns the folded unit and lookup rows."""
    units, lookups = _fold_ab(unit_rows, lookup_rows)
    ucols = _TABLES["ab_units"]
    con.executescript(
        "DROP TABLE IF EXISTS temp._ab_t; DROP TABLE IF EXISTS temp._ab_lt;\n"
        f"CREATE TEMP TABLE _ab_t({', '.join(map(_q, ucols))}, PRIMARY KEY(experiment, variant, unit_hash));\n"
        "CREATE TEMP TABLE _ab_lt(experiment, variant, unit_hash, layer, lookups, hits);\n")
    con.executemany(f"INSERT INTO _ab_t VALUES({', '.join('?' * len(ucols))})", units)
    con.executemany("INSERT INTO _ab_lt VALUES(?, ?, ?, ?, ?, ?)", lookups)
    con.commit()
    return units, lookups


def _write_ab(con: sqlite3.Connection, units: list, lookups: list) -> None:
    """Add the staged unit records (``units`` / ``lookups``: the folded rows
    also staged in ``_ab_t`` / ``_ab_lt``) to their units' rows, and to the A/B moments
    ``f(new totals) − f(old totals)`` (see :mod:`collectors.ab_moments`):
    one row per unit and per unit × layer. A unit with lookups but no
    request record gets an all-zero unit row, so every unit is counted once.
    Runs under the write lock (it reads the rows it adds to)."""
    import numpy as np

    keys = ", ".join(_AB_KEYS)
    on = " AND ".join(f"u.{k} = t.{k}" for k in _AB_KEYS)
    now = max((r[4] for r in units), default=None)
    if now is None:
        import time

        now = time.time()
    zero = con.execute(f"SELECT DISTINCT {keys} FROM _ab_lt t WHERE NOT EXISTS (SELECT 1 FROM _ab_t u WHERE {on}) "
                       f"AND NOT EXISTS (SELECT 1 FROM main.ab_units u WHERE {on})").fetchall()
    if zero:
        zrows = [k + (now, now) + (0,) * len(_AB_SUMS) for k in zero]
        con.executemany(f"INSERT INTO _ab_t VALUES({', '.join('?' * len(_TABLES['ab_units']))})", zrows)
        units = units + zrows
    if units:
        # Old totals of the units that exist already (most units are new), f(new) − f(old) in numpy.
        cols_o = ", ".join(f"u.{_q(c)}" for c in _TABLES["ab_units"])
        old_rows = {tuple(r[:3]): r[3:] for r in con.execute(
            f"SELECT {cols_o} FROM _ab_t t JOIN main.ab_units u ON {on}")}
        nv = len(_TABLES["ab_units"]) - 3
        d = np.array([r[3:] for r in units], dtype=float)
        o = np.zeros_like(d)
        present = np.zeros(len(units))
        if old_rows:
            idx = [i for i, r in enumerate(units) if r[:3] in old_rows]
            o[idx] = np.array([old_rows[units[i][:3]] for i in idx], dtype=float).reshape(-1, nv)
            present[idx] = 1
        new = o + d
        new[:, 0] = np.where(present > 0, np.minimum(o[:, 0], d[:, 0]), d[:, 0])
        new[:, 1] = np.where(present > 0, np.maximum(o[:, 1], d[:, 1]), d[:, 1])
        delta = _m.contributions(new, np.ones(len(units))) - _m.contributions(o, present)
        delta[:, 2], delta[:, 3] = new[:, 0], new[:, 1]  # extrema: combined with min / max
        buckets = _m.bucket_of(np.where(present > 0, o[:, 0], d[:, 0])).tolist()
        _add_moments(con, "ab_moments", [r[:2] + (b,) for r, b in zip(units, buckets)], delta, min_max=True)
        bucket_by = {r[:3]: b for r, b in zip(units, buckets)}
    else:
        bucket_by = {}
    sets = ", ".join(["first_ts = min(first_ts, excluded.first_ts)", "last_ts = max(last_ts, excluded.last_ts)"]
                     + [f"{_q(c)} = {_q(c)} + excluded.{_q(c)}" for c in _AB_SUMS])
    cols = ", ".join(map(_q, _TABLES["ab_units"]))
    con.execute(f"INSERT INTO main.ab_units({cols}) SELECT {cols} FROM _ab_t WHERE true "
                f"ON CONFLICT({keys}) DO UPDATE SET {sets}")
    if lookups:
        # Layer moments the same way: old per-layer totals of existing unit × layer rows only.
        lold = {tuple(r[:4]): r[4:] for r in con.execute(
            f"SELECT o.experiment, o.variant, o.unit_hash, o.layer, o.lookups, o.hits FROM _ab_lt t "
            f"JOIN main.ab_lookups o ON {on.replace('u.', 'o.')} AND o.layer = t.layer")}
        missing = list({r[:3] for r in lookups if r[:3] not in bucket_by})
        if missing:  # units whose unit row came in an earlier batch
            for k, (first,) in _existing(con, "ab_units", ("first_ts",), missing).items():
                bucket_by[k] = float(_m.bucket_of(np.array([first]))[0])
        t = np.array([r[4:] for r in lookups], dtype=float)
        if lold:
            o = np.array([lold.get(r[:4], (0, 0)) for r in lookups], dtype=float).reshape(-1, 2)
            present = np.array([r[:4] in lold for r in lookups], dtype=float)
        else:  # all new unit × layer rows
            o, present = np.zeros((len(lookups), 2)), np.zeros(len(lookups))
        delta = (_m.layer_contributions(o[:, 0] + t[:, 0], o[:, 1] + t[:, 1], np.ones(len(lookups)))
                 - _m.layer_contributions(o[:, 0], o[:, 1], present))
        _add_moments(con, "ab_layer_moments", [r[:2] + (bucket_by[r[:3]], r[3]) for r in lookups], delta)
    con.execute("INSERT INTO main.ab_lookups(experiment, variant, unit_hash, layer, lookups, hits) "
                f"SELECT * FROM _ab_lt WHERE true ON CONFLICT({keys}, layer) DO UPDATE SET "
                "lookups = lookups + excluded.lookups, hits = hits + excluded.hits")
    con.execute("DROP TABLE temp._ab_t")
    con.execute("DROP TABLE temp._ab_lt")


_UPSERT = {
    "hot_keys": (" ON CONFLICT(window, tenant, layer, key_hash) DO UPDATE SET "
                 "hits = hits + excluded.hits, misses = misses + excluded.misses, err = max(err, excluded.err)"),
}


def _migrate_2_to_3(con: sqlite3.Connection) -> None:
    """Schema 2 kept one A/B row per unit per flush window; 3 keeps one per
    unit: fold the old rows into the new tables (nothing is lost)."""
    sums = ", ".join(f"sum({_q(c)})" for c in _AB_SUMS)
    con.execute("ALTER TABLE ab_units RENAME TO ab_units_v2")
    con.execute("ALTER TABLE ab_lookups RENAME TO ab_lookups_v2")
    for stmt in _DDL.split(";"):
        if "TABLE IF NOT EXISTS ab_" in stmt:
            con.execute(stmt)
    con.execute(f"INSERT INTO ab_units SELECT experiment, variant, unit_hash, min(first_ts), max(last_ts), {sums} "
                "FROM ab_units_v2 GROUP BY experiment, variant, unit_hash")
    con.execute("INSERT INTO ab_lookups SELECT experiment, variant, unit_hash, layer, sum(lookups), sum(hits) "
                "FROM ab_lookups_v2 GROUP BY experiment, variant, unit_hash, layer")
    con.execute("DROP TABLE ab_units_v2")
    con.execute("DROP TABLE ab_lookups_v2")
    for stmt in _m.ddl().split(";"):
        if stmt.strip():
            con.execute(stmt)
    _m.rebuild_sql(con)
    for stmt in _rollup_ddl().split(";"):
        if stmt.strip():
            con.execute(stmt)
    _backfill_rollups(con)


def _hour(ts: float) -> float:
    return float(-(-ts // ROLLUP_S) * ROLLUP_S)  # the end of the hour holding ts (a flush's ts ends its interval)


def _fold_rollup(table: str, rows) -> dict[tuple, list]:
    """Rows summed by (hour, labels); no store access (runs before the lock)."""
    acc: dict[tuple, list] = {}
    if table == "histograms":
        for r in rows:  # ts, metric, 6 labels, bounds, counts, sum, total
            k = (_hour(r[0]), *r[1:9])
            c = json.loads(r[9])
            a = acc.get(k)
            if a is None:
                acc[k] = [c, r[10], r[11]]
            else:
                a[0] = [x + y for x, y in zip(a[0], c)]
                a[1] += r[10]
                a[2] += r[11]
        return acc
    nm = len(_MEASURES[table])
    nd = len(_TABLES[table]) - nm  # dimensions come first, measures last
    for r in rows:
        k = (_hour(r[0]), *r[1:nd])
        a = acc.get(k)
        if a is None:
            acc[k] = list(r[nd:])
        else:
            for i in range(nm):
                a[i] += r[nd + i]
    return acc


def _write_rollup(con: sqlite3.Connection, table: str, acc: dict[tuple, list]) -> None:
    cols = _TABLES[table]
    if table == "histograms":
        hours = sorted({k[0] for k in acc})
        for row in con.execute(f"SELECT {', '.join(map(_q, cols))} FROM histograms_1h "
                               f"WHERE ts IN ({', '.join('?' * len(hours))})", hours):
            a = acc.get(tuple(row[:9]))
            if a is not None:
                a[0] = [x + y for x, y in zip(a[0], json.loads(row[9]))]
                a[1] += row[10]
                a[2] += row[11]
        con.executemany(f"INSERT OR REPLACE INTO histograms_1h({', '.join(map(_q, cols))}) "
                        f"VALUES({', '.join('?' * len(cols))})",
                        [k + (",".join(map(str, v[0])).join("[]"), v[1], v[2]) for k, v in acc.items()])
        return
    meas = _MEASURES[table]
    nd = len(cols) - len(meas)
    sets = ", ".join(f"{_q(m)} = {_q(m)} + excluded.{_q(m)}" for m in meas)
    con.executemany(f"INSERT INTO {table}_1h({', '.join(map(_q, cols))}) VALUES({', '.join('?' * len(cols))}) "
                    f"ON CONFLICT({', '.join(map(_q, cols[:nd]))}) DO UPDATE SET {sets}",
                    [k + tuple(v) for k, v in acc.items()])


def _backfill_rollups(con: sqlite3.Connection) -> None:
    """Rebuild the hourly rollups from the per-flush rows (upgrades)."""
    for table, meas in _MEASURES.items():
        con.execute(f"DELETE FROM {table}_1h")
        if table == "histograms":
            cur = con.execute(f"SELECT {', '.join(map(_q, _TABLES[table]))} FROM histograms ORDER BY ts")
            while True:
                chunk = cur.fetchmany(50_000)
                if not chunk:
                    break
                _write_rollup(con, "histograms", _fold_rollup("histograms", chunk))
            continue
        cols = _TABLES[table]
        dims = [c for c in cols if c not in meas]
        x = f"(ts / {ROLLUP_S})"
        hour = f"(CAST({x} AS INTEGER) + ({x} > CAST({x} AS INTEGER))) * {ROLLUP_S}"  # ceil, for ts > 0
        con.execute(f"INSERT INTO {table}_1h({', '.join(map(_q, cols))}) SELECT {hour}, "
                    f"{', '.join(map(_q, dims[1:]))}, {', '.join(f'sum({_q(m)})' for m in meas)} FROM {table} "
                    f"GROUP BY {hour}, {', '.join(map(_q, dims[1:]))}")


_MIGRATIONS = {2: _migrate_2_to_3}


class StoreError(RuntimeError):
    """The store file cannot be opened or read; the message says what to do."""


class EmbeddedStore:
    def __init__(self, path: str | Path, readonly: bool = False, timeout: float = 5.0,
                 durable: bool = True) -> None:
        self.path = Path(path)
        self.durable = durable  # False: no fsync at all (regenerable data: the simulator)
        self.readonly = readonly
        self.timeout = timeout
        self._local = threading.local()
        if readonly:
            if not self.path.exists():
                raise StoreError(
                    f"embedded store {self.path} does not exist; run `warmscope simulate` "
                    "or point WARMSCOPE_STORE at a store the collectors wrote"
                )
            try:
                row = self._con().execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            except sqlite3.Error as e:
                raise StoreError(f"{self.path} is not a warmscope store ({e}); point WARMSCOPE_STORE at one") \
                    from None
            if row and int(row[0]) in _MIGRATIONS:
                raise StoreError(
                    f"embedded store {self.path} was written by an older warmscope (schema {row[0]}, this one "
                    f"reads {SCHEMA_VERSION}); upgrade it in place, keeping its data, with "
                    f"`warmscope --store {self.path} upgrade-store`"
                )
            if not row or int(row[0]) != SCHEMA_VERSION:
                raise StoreError(
                    f"embedded store {self.path} has schema version {row[0] if row else 'none'}, this warmscope "
                    f"reads {SCHEMA_VERSION}; regenerate it (`warmscope demo --fresh`) or use a matching warmscope"
                )
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._check_before_writing()
            if not self.path.exists():
                # Owner-only: SQLite gives the -wal and -shm files the same mode.
                try:
                    os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                except FileExistsError:  # another process made it meanwhile
                    pass
                except OSError as e:
                    raise StoreError(f"cannot create embedded store {self.path}: {e.strerror or e}") from None
            con = self._con()
            try:
                with con:
                    con.executescript(_DDL)
                    _m.ensure_columns(con)  # sums a newly declared A/B metric needs
                    con.execute(
                        "INSERT OR IGNORE INTO meta(key, value) VALUES('schema_version', ?)", (str(SCHEMA_VERSION),)
                    )
            except sqlite3.Error as e:
                self.close()
                hint = " (another process holds its write lock; try again when it is done)" \
                    if "locked" in str(e) else ""
                raise StoreError(f"cannot open embedded store {self.path}: {e}{hint}") from None
            self._upgrade(con)

    def _check_before_writing(self) -> None:
        """Refuse, without changing a byte, a file that is not a warmscope
        store or was written by a newer warmscope (opening it for writing
        would switch its journal mode and add tables)."""
        if not self.path.exists():
            return
        if self.path.is_dir():
            raise StoreError(f"embedded store {self.path} is a directory; point --store / WARMSCOPE_STORE at a file")
        if self.path.stat().st_size == 0:
            return
        try:
            con = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=self.timeout)
            try:
                tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                row = con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() \
                    if "meta" in tables else None
            finally:
                con.close()
        except sqlite3.OperationalError as e:
            if "locked" in str(e):
                raise StoreError(f"cannot open embedded store {self.path}: {e}") from None
            raise StoreError(f"{self.path} is not a warmscope store ({e}); move it away or point "
                             "--store / WARMSCOPE_STORE elsewhere") from None
        except sqlite3.Error as e:
            raise StoreError(f"{self.path} is not a warmscope store ({e}); move it away or point "
                             "--store / WARMSCOPE_STORE elsewhere") from None
        if row is None:
            if tables:
                raise StoreError(f"{self.path} is an SQLite file but not a warmscope store; move it away or "
                                 "point --store / WARMSCOPE_STORE elsewhere")
            return
        try:
            version = int(row[0])
        except ValueError:
            version = -1
        if version > SCHEMA_VERSION or (version != SCHEMA_VERSION and version not in _MIGRATIONS):
            raise StoreError(
                f"embedded store {self.path} has schema version {row[0]}, this warmscope reads {SCHEMA_VERSION} "
                "(written by a newer warmscope?); use a matching warmscope or move the file away to start a "
                "new store")

    def _upgrade(self, con: sqlite3.Connection) -> None:
        """Bring an older store up to SCHEMA_VERSION in one transaction (the
        version is re-read under the write lock: concurrent openers migrate once)."""
        try:
            con.execute("BEGIN IMMEDIATE")
            version = int(con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0])
            while version in _MIGRATIONS and version < SCHEMA_VERSION:
                _MIGRATIONS[version](con)
                version += 1
                con.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(version),))
            con.commit()
        except sqlite3.Error as e:
            con.rollback()
            raise StoreError(f"cannot upgrade embedded store {self.path}: {e}") from None
        if version != SCHEMA_VERSION:
            raise StoreError(
                f"embedded store {self.path} has schema version {version}, this warmscope "
                f"reads {SCHEMA_VERSION}; move the file away to start a new store"
            )

    def _con(self) -> sqlite3.Connection:
        con = getattr(self._local, "con", None)
        if con is None:
            try:
                if self.readonly:
                    con = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=self.timeout,
                                          check_same_thread=False)
                else:
                    con = sqlite3.connect(self.path, timeout=self.timeout, check_same_thread=False)
                    con.execute("PRAGMA journal_mode=WAL")
                    con.execute(f"PRAGMA synchronous={'NORMAL' if self.durable else 'OFF'}")
                    con.execute("PRAGMA cache_size=-65536")  # 64 MiB: A/B upserts probe unit B-trees at random
                    con.execute("PRAGMA temp_store=MEMORY")  # the A/B staging tables
                con.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")
            except sqlite3.Error as e:
                raise StoreError(f"cannot open embedded store {self.path}: {e}") from None
            self._local.con = con
        return con

    def close(self) -> None:
        con = getattr(self._local, "con", None)
        if con is not None:
            con.close()
            self._local.con = None

    # ------------------------------------------------------------- writing
    def write(self, batches: dict[str, Sequence[Sequence[Any]]]) -> int:
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
            staged = _stage_ab(con, batches.get("ab_units") or (), batches.get("ab_lookups") or ())
        rollups = {t: _fold_rollup(t, rows) for t, rows in batches.items() if rows and t in _MEASURES}
        n = 0
        con.execute("BEGIN IMMEDIATE")
        try:
            if ab:
                _write_ab(con, *staged)
                n += len(batches.get("ab_units") or ()) + len(batches.get("ab_lookups") or ())
            for table, rows in batches.items():
                if not rows or table in ("ab_units", "ab_lookups"):
                    continue
                cols = _TABLES[table]
                sql = f"INSERT INTO {table}({', '.join(map(_q, cols))}) VALUES({', '.join('?' * len(cols))})"
                if table in _UPSERT:
                    sql += _UPSERT[table]
                elif table in ("warmup_runs", "warmed_keys", "early_keys"):
                    sql = sql.replace("INSERT INTO", "INSERT OR REPLACE INTO", 1)
                con.executemany(sql, rows)
                n += len(rows)
            for table, acc in rollups.items():
                _write_rollup(con, table, acc)
            con.commit()
        except BaseException:
            con.rollback()
            raise
        return n

    def write_faults(self, faults: Iterable[dict]) -> None:
        rows = [
            (f["trap"], json.dumps(f["scope"], sort_keys=True), f["start"], f["end"],
             json.dumps(f.get("params", {}), sort_keys=True))
            for f in faults
        ]
        self.write({"faults": rows})

    def set_meta(self, key: str, value: str) -> None:
        with self._con() as con:
            con.execute("INSERT OR REPLACE INTO meta(key, value) VALUES(?, ?)", (key, value))

    def get_meta(self, key: str) -> str | None:
        row = self._con().execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    # ------------------------------------------------------------- reading
    def frame(self, name: str, start: float | None = None, end: float | None = None, step: float | None = None):
        """A canonical frame (see module docstring); time filters apply to ts columns.

        ``step=3600`` (``ROLLUP_S``) reads ``lookups``, ``writes``, ``requests``
        and ``histograms`` from their hourly rollups: the same columns, one row
        per hour and label set, ts the hour's end; the frame's
        ``attrs["step_s"]`` says which resolution it holds (0: per flush)."""
        import numpy as np
        import pandas as pd

        if name not in _TABLES:
            raise StoreError(f"unknown frame {name!r}; frames: {', '.join(FRAMES)}")
        tcol = {"hot_keys": "window", "warmup_runs": "started", "warmed_keys": "warmed_at",
                "early_keys": "first_seen", "ab_units": "last_ts", "faults": "start"}.get(name, "ts")
        where, args = [], []
        if tcol not in _TABLES[name]:  # no time column (ab_lookups): no time filter
            start = end = None
        if start is not None:
            where.append(f"{_q(tcol)} >= ?")
            args.append(start)
        if end is not None:
            where.append(f"{_q(tcol)} < ?")
            args.append(end)
        table = f"{name}_1h" if step and step >= ROLLUP_S and name in _MEASURES else name
        sql = f"SELECT {', '.join(map(_q, _TABLES[name]))} FROM {table}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        if tcol == "ts" and "ts" in _TABLES[name]:
            sql += " ORDER BY ts"  # time-sorted: analysis cuts windows by binary search
        try:
            cur = self._con().execute(sql, args)
            rows = cur.fetchall()
        except sqlite3.Error as e:
            raise StoreError(f"cannot read {name} from {self.path}: {e}") from None
        df = pd.DataFrame.from_records(rows, columns=list(_TABLES[name]))
        if name == "histograms":
            df = _explode_histograms(df)
        if table != name:  # only rollups carry attrs: pandas copies non-empty attrs on every operation
            df.attrs["step_s"] = ROLLUP_S
        if name == "histograms":
            return df
        if name == "faults":
            df["scope"] = df["scope"].map(json.loads)
            df["params"] = df["params"].map(json.loads)
        return df.replace({None: np.nan}) if name in ("warmup_runs", "warmed_keys") else df

    def units(self, experiment: str | None = None):
        """One row per A/B unit: ``ab_units`` columns plus one ``lookups_<layer>``
        / ``hits_<layer>`` column pair per cache layer (0 where the unit made
        no lookup in that layer)."""
        import pandas as pd

        keys = list(_AB_KEYS)
        cols_u = list(_TABLES["ab_units"])
        where, args = ("WHERE experiment = ?", (experiment,)) if experiment is not None else ("", ())
        try:
            con = self._con()
            u = pd.DataFrame.from_records(
                con.execute(f"SELECT {', '.join(map(_q, cols_u))} FROM ab_units {where}", args).fetchall(),
                columns=cols_u)
            lk = pd.DataFrame.from_records(
                con.execute(f"SELECT experiment, variant, unit_hash, layer, lookups, hits FROM ab_lookups {where}",
                            args).fetchall(), columns=keys + ["layer", "lookups", "hits"])
        except sqlite3.Error as e:
            raise StoreError(f"cannot read A/B units from {self.path}: {e}") from None
        out = u
        if len(lk):
            wide = lk.pivot(index=keys, columns="layer", values=["lookups", "hits"]).fillna(0).astype("int64")
            wide.columns = [f"{a}_{b}" for a, b in wide.columns]
            out = out.merge(wide.reset_index(), on=keys, how="outer")
            num = [c for c in out.columns if c not in keys and c not in ("first_ts", "last_ts")]
            out[num] = out[num].fillna(0)
        return out.reset_index(drop=True)

    def moments(self, experiment: str):
        """(``ab_moments``, ``ab_layer_moments``) rows of one experiment, sorted
        by bucket (see :mod:`collectors.ab_moments`): what an A/B report reads
        instead of one row per unit."""
        import pandas as pd

        out = []
        for table, keys, cols in (("ab_moments", ["variant", "bucket"], _m.COLUMNS),
                                  ("ab_layer_moments", ["variant", "bucket", "layer"], _m.LAYER_COLUMNS)):
            sql = (f"SELECT {', '.join(map(_q, keys + list(cols)))} FROM {table} WHERE experiment = ? "
                   "ORDER BY bucket")
            try:
                rows = self._con().execute(sql, (experiment,)).fetchall()
            except sqlite3.Error as e:
                raise StoreError(f"cannot read A/B moments from {self.path}: {e}") from None
            out.append(pd.DataFrame.from_records(rows, columns=keys + list(cols)))
        return out[0], out[1]

    def request_totals(self, experiment: str) -> dict[str, float]:
        """Requests per variant of an experiment, from the request metrics."""
        try:
            rows = self._con().execute("SELECT variant, sum(requests) FROM requests WHERE experiment = ? "
                                       "GROUP BY variant", (experiment,)).fetchall()
        except sqlite3.Error as e:
            raise StoreError(f"cannot read requests from {self.path}: {e}") from None
        return {v: float(n) for v, n in rows}

    def counts(self) -> dict[str, int]:
        con = self._con()
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in _TABLES}


def _explode_histograms(df):
    """One row per non-empty bucket (vectorised: one parse per bounds layout)."""
    import numpy as np
    import pandas as pd

    cols = ["ts", "metric", "tenant", "experiment", "variant", "model", "replica", "layer", "le", "count", "sum",
            "total"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    parts = []
    for bounds_json, g in df.groupby("bounds", sort=False):
        les = np.array(json.loads(bounds_json) + [np.inf])
        nb = len(les)
        flat = ",".join(c[1:-1] for c in g["counts"])
        counts = np.array(flat.split(","), dtype=np.int64).reshape(len(g), nb)
        rows, b = np.nonzero(counts)
        part = g.iloc[rows][cols[:8] + ["sum", "total"]].reset_index(drop=True)
        part.insert(8, "le", les[b])
        part.insert(9, "count", counts[rows, b])
        parts.append(part)
    return pd.concat(parts, ignore_index=True)[cols]


_BOUNDS_JSON: dict[tuple, str] = {}


def histogram_row(ts: float, metric: str, labels: tuple, bounds: Sequence[float],
                  counts: Sequence[int], total_sum: float, total: int) -> tuple:
    bj = _BOUNDS_JSON.get(tuple(bounds))
    if bj is None:
        bj = _BOUNDS_JSON[tuple(bounds)] = json.dumps(list(bounds))
    return (ts, metric, *labels, bj, ",".join(map(str, counts)).join("[]"), total_sum, total)

