"""Upgrades of older embedded stores, one step per schema version.

``MIGRATIONS[v](con)`` brings a store from version ``v`` to ``v + 1`` inside
the caller's transaction. Adding a field to a record in
:mod:`collectors.records` needs a step here (e.g. ``ALTER TABLE t ADD COLUMN
c ... DEFAULT ...``) and ``layout.SCHEMA_VERSION`` raised by one."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from warmscope.model import ab_metrics as _m
from warmscope.model import records

from .layout import DDL, q, rollup_ddl
from .writer import backfill_rollups

__all__ = ["MIGRATIONS"]


def _migrate_2_to_3(con: sqlite3.Connection) -> None:
    """Schema 2 kept one A/B row per unit per flush window; 3 keeps one per
    unit: fold the old rows into the new tables (nothing is lost)."""
    sums = ", ".join(f"sum({q(c)})" for c in records.AB_UNITS.measures)
    keys = ", ".join(records.UNIT_KEYS)
    con.execute("ALTER TABLE ab_units RENAME TO ab_units_v2")
    con.execute("ALTER TABLE ab_lookups RENAME TO ab_lookups_v2")
    for stmt in DDL.split(";"):
        if "TABLE IF NOT EXISTS ab_" in stmt:
            con.execute(stmt)
    con.execute(
        f"INSERT INTO ab_units SELECT {keys}, min(first_ts), max(last_ts), {sums} "
        f"FROM ab_units_v2 GROUP BY {keys}"
    )
    con.execute(
        f"INSERT INTO ab_lookups SELECT {keys}, layer, sum(lookups), sum(hits) "
        f"FROM ab_lookups_v2 GROUP BY {keys}, layer"
    )
    con.execute("DROP TABLE ab_units_v2")
    con.execute("DROP TABLE ab_lookups_v2")
    for stmt in _m.ddl().split(";"):
        if stmt.strip():
            con.execute(stmt)
    _m.rebuild_sql(con)
    for stmt in rollup_ddl().split(";"):
        if stmt.strip():
            con.execute(stmt)
    backfill_rollups(con)


def _migrate_3_to_4(con: sqlite3.Connection) -> None:
    """Schema 4 counts LLM requests without token usage (``requests.unmeasured``)."""
    for table in ("requests", "requests_1h"):
        cols = {r[1] for r in con.execute(f"PRAGMA table_info({table})")}
        if cols and "unmeasured" not in cols:
            con.execute(f'ALTER TABLE {table} ADD COLUMN "unmeasured" INTEGER DEFAULT 0')


def _migrate_4_to_5(con: sqlite3.Connection) -> None:
    """Schema 5 adds the ``misses`` and ``kv_blocks`` records (new tables, empty)."""
    for stmt in DDL.split(";"):
        if "EXISTS misses" in stmt or "EXISTS kv_blocks" in stmt:
            con.execute(stmt)


def _migrate_5_to_6(con: sqlite3.Connection) -> None:
    """Schema 6 adds the ``block_trace`` record (a new table, empty)."""
    for stmt in DDL.split(";"):
        if "EXISTS block_trace" in stmt:
            con.execute(stmt)


MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {
    2: _migrate_2_to_3,
    3: _migrate_3_to_4,
    4: _migrate_4_to_5,
    5: _migrate_5_to_6,
}
