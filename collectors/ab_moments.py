"""The A/B moment encoding the embedded store applies as unit records arrive.

Defined with the A/B metrics in :mod:`warmscope.model.ab_metrics` (one
list drives the stored sums, the report and the dashboard); re-exported here
for the store's write path. That module needs numpy only.
"""

from __future__ import annotations

from warmscope.model.ab_metrics import (
    BUCKET_S,
    COLUMNS,
    FIELDS,
    LAYER_COLUMNS,
    NB,
    bucket_of,
    bucket_sql,
    contributions,
    ddl,
    ensure_columns,
    layer_contributions,
    layer_exprs,
    rebuild_sql,
    unit_exprs,
    upsert_sql,
)

__all__ = [
    "BUCKET_S",
    "FIELDS",
    "NB",
    "COLUMNS",
    "LAYER_COLUMNS",
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
]
