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
    ``ab_layer_moments``; see :mod:`model.ab_metrics` and
    :meth:`EmbeddedStore.moments`) from which a report needs no unit rows.
``faults``
    trap, scope (JSON object dimension -> value), start, end, params (JSON) —
    ground truth written by the simulator.
``misses``
    ts, tenant, engine (the serving replica), family, miss_class (elsewhere,
    evicted, isolated, drifted, cold, partial, unknown), tokens, requests —
    missed prompt tokens (prompt − cached) by why they missed, per time bucket
    (the flush interval ending at ts); rows for one bucket add up (upsert).
``kv_blocks``
    ts, engine, salt (hashed), stored, reused, evicted, resident — an engine's
    KV blocks per salt in the flush interval ending at ts; resident is the
    count at its end.

Every frame's columns, types, labels, measures and time column are declared
in :mod:`collectors.records`; the tables, rollups and upserts here are
derived from those declarations. The package is split along its steps:
:mod:`.layout` (tables and DDL), :mod:`.migrations` (upgrades of older
files), :mod:`.writer` (the write transaction) and :mod:`.reader` (frames).

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

import os
import sqlite3
import threading
from pathlib import Path

from warmscope.model import ab_metrics as _m
from warmscope.model import records

from .layout import DDL, MEASURES, ROLLUP_S, SCHEMA_VERSION, TABLES, StoreError
from .migrations import MIGRATIONS
from .reader import StoreReader
from .writer import StoreWriter, backfill_rollups, histogram_row

__all__ = ["EmbeddedStore", "StoreError", "FRAMES", "SCHEMA_VERSION", "ROLLUP_S", "histogram_row"]

FRAMES = records.FRAMES
# Names kept for callers of the single-module store.
_TABLES = TABLES
_DDL = DDL
_H = list(records.UNIT_HIST)
_MEASURES = MEASURES
_backfill_rollups = backfill_rollups


class EmbeddedStore(StoreReader, StoreWriter):
    """One store file: open (create, check, upgrade) and per-thread connections;
    writes come from :class:`.writer.StoreWriter`, reads from :class:`.reader.StoreReader`."""

    def __init__(
        self, path: str | Path, readonly: bool = False, timeout: float = 5.0, durable: bool = True
    ) -> None:
        self.path = Path(path)
        self.durable = durable  # False: no fsync at all (regenerable data: the simulator)
        self.readonly = readonly
        self.timeout = timeout
        self._local = threading.local()
        if self.path.is_dir():  # (SQLite would say "disk I/O error" or "unable to open")
            raise StoreError(
                f"embedded store {self.path} is a directory; point --store / WARMSCOPE_STORE "
                "at a file"
            )
        if readonly:
            if not self.path.exists():
                raise StoreError(
                    f"embedded store {self.path} does not exist; run `warmscope simulate` "
                    "or point --store / WARMSCOPE_STORE at a store the collectors wrote"
                )
            try:
                row = (
                    self._con()
                    .execute("SELECT value FROM meta WHERE key='schema_version'")
                    .fetchone()
                )
            except sqlite3.Error as e:
                if "unable to open" in str(e) and not os.access(self.path.parent, os.W_OK):
                    raise StoreError(
                        f"cannot read embedded store {self.path} on a read-only file system or "
                        f"directory ({e}): a store in WAL mode is read with its -shm file beside "
                        "it; copy the store (with its -wal file) to a writable place and point "
                        "--store / WARMSCOPE_STORE there"
                    ) from None
                raise StoreError(
                    f"{self.path} is not a warmscope store ({e}); point --store / WARMSCOPE_STORE "
                    "at one"
                ) from None
            if row and int(row[0]) in MIGRATIONS:
                raise StoreError(
                    f"embedded store {self.path} was written by an older warmscope (schema "
                    f"{row[0]}, this one reads {SCHEMA_VERSION}); upgrade it in place, keeping its "
                    f"data, with `warmscope --store {self.path} upgrade-store`"
                )
            if not row or int(row[0]) != SCHEMA_VERSION:
                raise StoreError(
                    f"embedded store {self.path} has schema version {row[0] if row else 'none'}, "
                    f"this warmscope reads {SCHEMA_VERSION}; regenerate it "
                    "(`warmscope demo --fresh`) or use a matching warmscope"
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
                    raise StoreError(
                        f"cannot create embedded store {self.path}: {e.strerror or e}"
                    ) from None
            con = self._con()
            try:
                with con:
                    con.executescript(DDL)
                    _m.ensure_columns(con)  # sums a newly declared A/B metric needs
                    con.execute(
                        "INSERT OR IGNORE INTO meta(key, value) VALUES('schema_version', ?)",
                        (str(SCHEMA_VERSION),),
                    )
            except sqlite3.Error as e:
                self.close()
                hint = (
                    " (another process holds its write lock; try again when it is done)"
                    if "locked" in str(e)
                    else ""
                )
                raise StoreError(f"cannot open embedded store {self.path}: {e}{hint}") from None
            self._upgrade(con)

    def _check_before_writing(self) -> None:
        """Refuse, without changing a byte, a file that is not a warmscope
        store or was written by a newer warmscope (opening it for writing
        would switch its journal mode and add tables)."""
        if not self.path.exists():
            return
        if self.path.is_dir():
            raise StoreError(
                f"embedded store {self.path} is a directory; point --store / "
                "WARMSCOPE_STORE at a file"
            )
        if self.path.stat().st_size == 0:
            return
        try:
            con = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=self.timeout)
            try:
                tables = {
                    r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")
                }
                row = (
                    con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
                    if "meta" in tables
                    else None
                )
            finally:
                con.close()
        except sqlite3.OperationalError as e:
            if "locked" in str(e):
                raise StoreError(f"cannot open embedded store {self.path}: {e}") from None
            raise StoreError(
                f"{self.path} is not a warmscope store ({e}); move it away or point "
                "--store / WARMSCOPE_STORE elsewhere"
            ) from None
        except sqlite3.Error as e:
            raise StoreError(
                f"{self.path} is not a warmscope store ({e}); move it away or point "
                "--store / WARMSCOPE_STORE elsewhere"
            ) from None
        if row is None:
            if tables:
                raise StoreError(
                    f"{self.path} is an SQLite file but not a warmscope store; move it away or "
                    "point --store / WARMSCOPE_STORE elsewhere"
                )
            return
        try:
            version = int(row[0])
        except ValueError:
            version = -1
        if version > SCHEMA_VERSION or (version != SCHEMA_VERSION and version not in MIGRATIONS):
            raise StoreError(
                f"embedded store {self.path} has schema version {row[0]}, this warmscope reads "
                f"{SCHEMA_VERSION} (written by a newer warmscope?); use a matching warmscope or "
                "move the file away to start a new store"
            )

    def _upgrade(self, con: sqlite3.Connection) -> None:
        """Bring an older store up to SCHEMA_VERSION in one transaction (the
        version is re-read under the write lock: concurrent openers migrate once)."""
        try:
            con.execute("BEGIN IMMEDIATE")
            version = int(
                con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
            )
            while version in MIGRATIONS and version < SCHEMA_VERSION:
                MIGRATIONS[version](con)
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
                    con = sqlite3.connect(
                        f"file:{self.path}?mode=ro",
                        uri=True,
                        timeout=self.timeout,
                        check_same_thread=False,
                    )
                else:
                    con = sqlite3.connect(self.path, timeout=self.timeout, check_same_thread=False)
                    con.execute("PRAGMA journal_mode=WAL")
                    con.execute(f"PRAGMA synchronous={'NORMAL' if self.durable else 'OFF'}")
                    con.execute(
                        "PRAGMA cache_size=-65536"
                    )  # 64 MiB: A/B upserts probe unit B-trees at random
                    con.execute("PRAGMA temp_store=MEMORY")  # sorts and temp B-trees
                con.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")
            except sqlite3.Error as e:
                raise StoreError(f"cannot open embedded store {self.path}: {e}") from None
            self._local.con = con
        return con

    def heartbeat(self, replica: str, instance: str, now: float, alive_s: float) -> list[str]:
        """Note that process ``instance`` writes as ``replica`` (a ``meta`` row);
        the other instances that wrote as ``replica`` within ``alive_s``."""
        prefix = f"instance\x1f{replica}\x1f"
        con = self._con()
        with con:
            con.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES(?, ?)",
                (prefix + instance, f"{now:.3f}"),
            )
            con.execute(
                "DELETE FROM meta WHERE substr(key, 1, ?) = ? AND CAST(value AS REAL) < ?",
                (len(prefix), prefix, now - 86400),
            )  # processes gone a day ago
            rows = con.execute(
                "SELECT key, value FROM meta WHERE substr(key, 1, ?) = ?", (len(prefix), prefix)
            ).fetchall()
        out = []
        for k, v in rows:
            other = k[len(prefix) :]
            try:
                if other != instance and now - float(v) <= alive_s:
                    out.append(other)
            except ValueError:
                continue
        return sorted(out)

    def close(self) -> None:
        con = getattr(self._local, "con", None)
        if con is not None:
            con.close()
            self._local.con = None
