"""The embedded store's tables, derived from :mod:`collectors.records`.

One table per record (columns, types and primary key as declared there), an
index on the time column of the per-flush tables, an hourly rollup table
(``<name>_1h``, unique on the hour and the labels) per record with
``rollup=True``, and the A/B moment tables of :mod:`model.ab_metrics`.
"""

from __future__ import annotations

from warmscope.model import ab_metrics as _m
from warmscope.model import records

__all__ = [
    "SCHEMA_VERSION",
    "TABLES",
    "DDL",
    "ROLLUP_S",
    "MEASURES",
    "UPSERT",
    "StoreError",
    "q",
    "ddl",
    "rollup_ddl",
]

# 3: ab_units / ab_lookups hold one row per unit (upsert); 4: requests.unmeasured;
# 5: misses, kv_blocks; 6: block_trace
SCHEMA_VERSION = 6
ROLLUP_S = records.ROLLUP_S


class StoreError(RuntimeError):
    """The store file cannot be opened or read; the message says what to do."""


def q(col: str) -> str:
    return f'"{col}"'


TABLES: dict[str, tuple[str, ...]] = {name: r.cols for name, r in records.RECORDS.items()}
# Measures of the tables with hourly rollups (their labels are the other columns).
MEASURES: dict[str, tuple[str, ...]] = {
    name: r.measures for name, r in records.RECORDS.items() if r.rollup
}


def _table_ddl(r: records.Record) -> str:
    cols = []
    for c in r.columns:
        d = f"{q(c.name)} {c.type}"
        if c.default is not None:
            d += f" DEFAULT {c.default}"
        cols.append(d)
    if r.key:
        cols.append(f"PRIMARY KEY({', '.join(map(q, r.key))})")
    out = (
        "CREATE TABLE IF NOT EXISTS "
        f"{r.name}({', '.join(cols)}){' WITHOUT ROWID' if r.key else ''};\n"
    )
    if r.time == "ts" and not r.key:
        out += f"CREATE INDEX IF NOT EXISTS {r.name}_ts ON {r.name}(ts);\n"
    return out


def rollup_ddl() -> str:
    out = []
    for t, meas in MEASURES.items():
        dims = [c for c in TABLES[t] if c not in meas]
        out.append(
            f"CREATE TABLE IF NOT EXISTS {t}_1h AS SELECT * FROM {t} WHERE 0;\n"
            f"CREATE UNIQUE INDEX IF NOT EXISTS {t}_1h_key ON {t}_1h({', '.join(map(q, dims))});\n"
        )
    return "".join(out)


def ddl() -> str:
    """The whole schema (idempotent: every statement is IF NOT EXISTS)."""
    return (
        "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);\n"
        + "".join(_table_ddl(r) for r in records.RECORDS.values())
        + _m.ddl()
        + rollup_ddl()
    )


DDL = ddl()


def _upsert(r: records.Record) -> str:
    if r.write == "replace":
        return ""  # INSERT OR REPLACE
    sets = ", ".join(
        f"{q(m)} = max({q(m)}, excluded.{q(m)})"
        if m in r.max_measures
        else f"{q(m)} = {q(m)} + excluded.{q(m)}"
        for m in r.measures
    )
    return f" ON CONFLICT({', '.join(map(q, r.key))}) DO UPDATE SET {sets}"


# Upsert clauses of the tables written row by row with write="add" (A/B units
# have their own path: they also keep the moments).
UPSERT = {
    name: _upsert(r)
    for name, r in records.RECORDS.items()
    if r.write == "add" and name not in ("ab_units", "ab_lookups")
}
REPLACE = tuple(name for name, r in records.RECORDS.items() if r.write == "replace")
