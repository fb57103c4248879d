"""The embedded store's read path: canonical pandas frames (see
:mod:`collectors.store`) and the A/B reads."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from warmscope.model import ab_metrics as _m
from warmscope.model import records

from .layout import MEASURES, ROLLUP_S, TABLES, StoreError, q

if TYPE_CHECKING:
    from pathlib import Path

    import pandas as pd

__all__ = ["StoreReader"]

_AB_KEYS = list(records.UNIT_KEYS)


class StoreReader:
    """Read methods of :class:`collectors.store.EmbeddedStore` (needs ``_con()`` and ``path``)."""

    path: Path

    def _con(self) -> sqlite3.Connection:  # pragma: no cover - provided by EmbeddedStore
        raise NotImplementedError

    def frame(
        self,
        name: str,
        start: float | None = None,
        end: float | None = None,
        step: float | None = None,
    ) -> pd.DataFrame:
        """A canonical frame (see module docstring); time filters apply to the
        record's time column.

        ``step=3600`` (``ROLLUP_S``) reads ``lookups``, ``writes``, ``requests``
        and ``histograms`` from their hourly rollups: the same columns, one row
        per hour and label set, ts the hour's end; the frame's
        ``attrs["step_s"]`` says which resolution it holds (0: per flush)."""
        import numpy as np
        import pandas as pd

        rec = records.RECORDS.get(name)
        if rec is None:
            raise StoreError(f"unknown frame {name!r}; frames: {', '.join(records.FRAMES)}")
        tcol = rec.time
        where, args = [], []
        if tcol is None:  # no time column (ab_lookups): no time filter
            start = end = None
        if start is not None:
            where.append(f"{q(tcol)} >= ?")  # type: ignore[arg-type]
            args.append(start)
        if end is not None:
            where.append(f"{q(tcol)} < ?")  # type: ignore[arg-type]
            args.append(end)
        table = f"{name}_1h" if step and step >= ROLLUP_S and name in MEASURES else name
        sql = f"SELECT {', '.join(map(q, rec.cols))} FROM {table}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        if tcol == "ts":
            sql += " ORDER BY ts"  # time-sorted: analysis cuts windows by binary search
        try:
            rows = self._con().execute(sql, args).fetchall()
        except sqlite3.Error as e:
            raise StoreError(f"cannot read {name} from {self.path}: {e}") from None
        df = pd.DataFrame.from_records(rows, columns=list(rec.cols))
        if name == "histograms":
            df = _explode_histograms(df)
        if (
            table != name
        ):  # only rollups carry attrs: pandas copies non-empty attrs on every operation
            df.attrs["step_s"] = ROLLUP_S
        if name == "histograms":
            return df
        if name == "faults":
            df["scope"] = df["scope"].map(json.loads)
            df["params"] = df["params"].map(json.loads)
        return df.replace({None: np.nan}) if name in ("warmup_runs", "warmed_keys") else df

    def units(self, experiment: str | None = None) -> pd.DataFrame:
        """One row per A/B unit: ``ab_units`` columns plus one ``lookups_<layer>``
        / ``hits_<layer>`` column pair per cache layer (0 where the unit made
        no lookup in that layer)."""
        import pandas as pd

        keys = _AB_KEYS
        cols_u = list(records.AB_UNITS.cols)
        cols_l = list(records.AB_LOOKUPS.cols)
        where, args = (
            ("WHERE experiment = ?", (experiment,)) if experiment is not None else ("", ())
        )
        try:
            con = self._con()
            u = pd.DataFrame.from_records(
                con.execute(
                    f"SELECT {', '.join(map(q, cols_u))} FROM ab_units {where}", args
                ).fetchall(),
                columns=cols_u,
            )
            lk = pd.DataFrame.from_records(
                con.execute(
                    f"SELECT {', '.join(map(q, cols_l))} FROM ab_lookups {where}", args
                ).fetchall(),
                columns=cols_l,
            )
        except sqlite3.Error as e:
            raise StoreError(f"cannot read A/B units from {self.path}: {e}") from None
        out = u
        if len(lk):
            wide = lk.pivot(index=keys, columns="layer", values=list(records.AB_LOOKUPS.measures))
            wide = wide.fillna(0).astype("int64")
            wide.columns = [f"{a}_{b}" for a, b in wide.columns]  # type: ignore[str-unpack]  # MultiIndex pairs
            out = out.merge(wide.reset_index(), on=keys, how="outer")
            num = [c for c in out.columns if c not in keys and c not in ("first_ts", "last_ts")]
            out[num] = out[num].fillna(0)
        return out.reset_index(drop=True)

    def moments(self, experiment: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(``ab_moments``, ``ab_layer_moments``) rows of one experiment, sorted
        by bucket (see :mod:`model.ab_metrics`): what an A/B report reads
        instead of one row per unit."""
        import pandas as pd

        out = []
        for table, keys, cols in (
            ("ab_moments", ["variant", "bucket"], _m.COLUMNS),
            ("ab_layer_moments", ["variant", "bucket", "layer"], _m.LAYER_COLUMNS),
        ):
            sql = (
                f"SELECT {', '.join(map(q, keys + list(cols)))} FROM {table} WHERE experiment = ? "
                "ORDER BY bucket"
            )
            try:
                rows = self._con().execute(sql, (experiment,)).fetchall()
            except sqlite3.Error as e:
                raise StoreError(f"cannot read A/B moments from {self.path}: {e}") from None
            out.append(pd.DataFrame.from_records(rows, columns=keys + list(cols)))
        return out[0], out[1]

    def request_totals(self, experiment: str) -> dict[str, float]:
        """Requests per variant of an experiment, from the request metrics."""
        try:
            rows = (
                self._con()
                .execute(
                    "SELECT variant, sum(requests) FROM requests WHERE experiment = ? "
                    "GROUP BY variant",
                    (experiment,),
                )
                .fetchall()
            )
        except sqlite3.Error as e:
            raise StoreError(f"cannot read requests from {self.path}: {e}") from None
        return {v: float(n) for v, n in rows}

    def counts(self) -> dict[str, int]:
        con = self._con()
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of one read-only SQL statement (for sources that need an aggregate the frames do not
        give)."""
        try:
            return self._con().execute(sql, tuple(params)).fetchall()
        except sqlite3.Error as e:
            raise StoreError(f"cannot read {self.path}: {e}") from None


def _explode_histograms(df: pd.DataFrame) -> pd.DataFrame:
    """One row per non-empty bucket (vectorised: one parse per bounds layout)."""
    import numpy as np
    import pandas as pd

    cols = list(records.HISTOGRAMS.frame)
    if df.empty:
        return pd.DataFrame(columns=cols)
    labels = cols[: cols.index("le")]
    parts = []
    for bounds_json, g in df.groupby("bounds", sort=False):
        les = np.array(json.loads(bounds_json) + [np.inf])  # type: ignore[arg-type]  # group keys are str
        nb = len(les)
        flat = ",".join(c[1:-1] for c in g["counts"])
        counts = np.array(flat.split(","), dtype=np.int64).reshape(len(g), nb)
        rows, b = np.nonzero(counts)
        part = g.iloc[rows][labels + ["sum", "total"]].reset_index(drop=True)
        part.insert(len(labels), "le", les[b])
        part.insert(len(labels) + 1, "count", counts[rows, b])
        parts.append(part)
    return pd.concat(parts, ignore_index=True)[cols]
