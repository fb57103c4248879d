"""Redis sink: hot keys, A/B unit records, A/B moments and warm-up runs, on one
Redis or a Redis Cluster.

Layout (layout version 2; only keyed hashes of cache keys and units). Every
key a script touches is ``ws:{TAG}:...``: its hash tag ``{TAG}`` decides the
cluster slot, so all keys one script reads and writes live on one node, and
different tags spread over the cluster's masters. Label values inside keys are
percent-encoded (``%``, ``{``, ``}``, ``:`` and anything not printable).

* A/B units and moments, tag ``{ab:<experiment>:<shard>}`` with shard =
  crc32(unit hash) mod ``AB_SHARDS`` (16): a unit and the moments it feeds
  share a slot, so a unit's totals and the sums of ``f(totals)`` change in one
  atomic step; 16 shards per experiment spread one experiment's write load over
  the masters.

  - ``...:u:<variant>:<unit hash>`` — hash of the unit's totals: the request
    fields and ``h<k>`` of ``store.ab_units``, per layer ``<layer>:lookups`` /
    ``<layer>:hits``, ``first_ts`` / ``last_ts``, and ``_v`` (a version
    bumped by every write, for the compare-and-apply below);
  - ``...:m:<variant>:<bucket>`` — hash of the A/B moments of the shard's units
    that arrived in the 15-minute ``bucket`` (the ``ab_moments`` columns of
    :mod:`model.ab_metrics`, plus ``L:<layer>:<column>`` for the
    ``ab_layer_moments`` columns);
  - ``...:mi`` — set of ``<variant>:<bucket>`` moment hashes; ``...:units`` —
    set of ``<variant>:<unit hash>``.

  A report sums the moment hashes of the 16 shards: a few thousand small
  hashes for a week, whatever the number of units.
* Hot keys, tag ``{hot:<window>:<tenant>}``: ``...:<layer>:hits`` /
  ``:misses`` — sorted sets, member = key hash, score = count in the window;
  ``:fam`` — key hash -> family; ``:err`` — key hash -> Space-Saving error bound.
* Warm-up runs, tag ``{run:<run id>}``: ``ws:{run:<id>}`` — hash of the run
  record; ``...:warmed`` / ``:early`` — key hash -> JSON row (as
  ``store.warmed_keys`` / ``store.early_keys`` minus ids).
* Indexes, plain keys written after the scripts (idempotent: a retry rewrites
  the same members): ``ws:hot:windows`` (sorted set of
  ``<window>:<tenant>:<layer>`` by window), ``ws:runs`` (run ids by start),
  ``ws:ab:experiments`` (set of experiment names).

Everything gets a TTL (``hot_key_ttl_s``; runs, units and moments 30 days).

Exactly once. A batch is split by hash tag; each part is applied by one Lua
script that declares every key it touches, and that first checks the marker
``ws:{TAG}:batch:<batch id>``: if present the part was applied before and is
skipped. A batch that timed out after Redis received it (a stalled server,
a master that died) is retried with the same id, so each part counts once.
The moments need a unit's old totals: the writer reads them, computes
``f(new) − f(old)`` in numpy, and the script applies the part only if every
unit's ``_v`` is still the one read (else it applies nothing and the writer
re-reads those units) — concurrent writers of one unit stay exact.

On a cluster whose masters have replicas, each script is followed by ``WAIT 1``
on the same connection; a part no replica acknowledged is retried (skipped by
its marker if the master kept it, re-applied if a promoted replica never saw
it), so a master failing over loses no acknowledged row.

Compatibility: layout 1 (keys ``ws:ab:<exp>:<variant>:<unit>``,
``ws:hot:<window>:<tenant>:<layer>:*``, ``ws:run:<id>``, no hash tags, no
moments) is neither read nor deleted; its keys expire within 30 days.
:func:`migrate_layout1` rewrites a layout-1 database into layout 2 (units and
their moments, hot keys, runs), exactly once per unit, and deletes the old keys.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
import zlib
from collections import defaultdict
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, unquote

import numpy as np
from warmscope.model import ab_metrics as _m
from warmscope.model.records import RUN_COLUMNS as _RUN_COLS
from warmscope.model.records import UNIT_FIELDS
from warmscope.model.records import UNIT_HIST as _H

__all__ = [
    "RedisSink",
    "PREFIX",
    "RUN_TTL_S",
    "AB_SHARDS",
    "connect",
    "is_cluster",
    "ab_tag",
    "ab_shard",
    "hot_tag",
    "run_tag",
    "key",
    "enc",
    "dec",
    "migrate_layout1",
]

PREFIX = "ws"
RUN_TTL_S = 30 * 86400
BATCH_TTL_S = 86400  # applied batch ids are remembered this long
AB_SHARDS = 16
MAX_CONFLICT_ROUNDS = 20
_FIELDS = UNIT_FIELDS[2:] + tuple(_H)  # unit totals after first_ts, last_ts
_NV = 2 + len(_FIELDS)


@functools.lru_cache(maxsize=4096)
def enc(s: Any) -> str:
    """A label value as it appears inside keys and index members."""
    return quote(str(s), safe="!#$&'()*+,-./;<=>?@[]^_`|~")


def dec(s: str) -> str:
    return unquote(s)


def key(tag: str, *rest: str) -> str:
    return ":".join((f"{PREFIX}:{{{tag}}}",) + rest) if rest else f"{PREFIX}:{{{tag}}}"


def ab_shard(unit_hash: str) -> int:
    return zlib.crc32(unit_hash.encode()) % AB_SHARDS


def ab_tag(experiment: str, shard: int) -> str:
    return f"ab:{enc(experiment)}:{shard}"


def hot_tag(window: float, tenant: str) -> str:
    return f"hot:{int(window)}:{enc(tenant)}"


def run_tag(run_id: str) -> str:
    return f"run:{enc(run_id)}"


def _bucket_s(b: float) -> str:
    return repr(float(b)) if b != int(b) else str(int(b))


# KEYS[1]: the part's marker; KEYS[2..]: every key the part touches.
# ARGV[1]: marker ttl; ARGV[2]: JSON [checks, ops] (one argument: cheap to send).
# checks: [key index, expected _v]; ops: [code, key index, args...], values as strings. Python
# writes them through _Part's named operations; the two-letter codes keep the payload small:
# Returns 0 (applied before: skipped), 1 (applied), or the key indexes whose
# _v changed since they were read (nothing applied).
# code: (the _Part method that writes it, what the script does)
OPS: dict[str, tuple[str | None, str]] = {
    "hi": ("hash_add_int", "HINCRBY k field n"),
    "hf": ("hash_add_float", "HINCRBYFLOAT k field x"),
    "hv": ("hash_add_floats", "HINCRBYFLOAT k field x for each (field, x) of a flat list"),
    "hs": ("hash_set", "HSET k field value"),
    "mn": ("hash_keep_min", "HSET k field x where the field is absent or larger"),
    "mx": ("hash_keep_max", "HSET k field x where the field is absent or smaller"),
    "zi": ("zset_add", "ZINCRBY k n member"),
    "za": (None, "ZADD k score member (nothing writes it now)"),
    "sa": ("set_add", "SADD k member"),
    "ex": ("expire", "EXPIRE k seconds"),
}
_APPLY = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local d = cjson.decode(ARGV[2])
local bad = {}
for _, c in ipairs(d[1]) do
  local v = redis.call('HGET', KEYS[c[1]], '_v') or '0'
  if v ~= c[2] then bad[#bad + 1] = c[1] end
end
if #bad > 0 then return bad end
redis.call('SET', KEYS[1], 'applied', 'EX', ARGV[1])
for _, o in ipairs(d[2]) do
  local op, k = o[1], KEYS[o[2]]
  if op == 'hv' then
    local fv = o[3]
    for j = 1, #fv, 2 do redis.call('HINCRBYFLOAT', k, fv[j], fv[j + 1]) end
  elseif op == 'hf' then redis.call('HINCRBYFLOAT', k, o[3], o[4])
  elseif op == 'hi' then redis.call('HINCRBY', k, o[3], o[4])
  elseif op == 'hs' then redis.call('HSET', k, o[3], o[4])
  elseif op == 'zi' then redis.call('ZINCRBY', k, o[3], o[4])
  elseif op == 'mn' or op == 'mx' then
    local cur = redis.call('HGET', k, o[3])
    if (not cur) or (op == 'mn' and tonumber(o[4]) < tonumber(cur))
        or (op == 'mx' and tonumber(o[4]) > tonumber(cur)) then
      redis.call('HSET', k, o[3], o[4])
    end
  elseif op == 'za' then redis.call('ZADD', k, o[3], o[4])
  elseif op == 'sa' then redis.call('SADD', k, o[3])
  elseif op == 'ex' then redis.call('EXPIRE', k, o[3])
  else return redis.error_reply('unknown op ' .. tostring(op)) end
end
return 1
"""


class NotReplicated(Exception):
    """No replica acknowledged a part within the timeout: it is retried."""


def is_cluster(client: Any) -> bool:
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def connect(url: str | None, client: Any = None, **kw: Any) -> Any:
    """A client for ``url`` (or ``client``): a ``RedisCluster`` when the server
    runs in cluster mode (``cluster_enabled:1``), else the plain client. Talks
    to the server (to ask); raises redis-py's errors."""
    import redis
    from redis.cluster import RedisCluster

    if client is not None and is_cluster(client):
        return client
    # url is a str whenever client is None (the callers pass one or the other)
    plain = client if client is not None else redis.Redis.from_url(url, **kw)  # type: ignore[arg-type]
    info = plain.info("cluster")
    if not int(info.get("cluster_enabled", 0)):
        return plain
    ck = plain.connection_pool.connection_kwargs
    opts = {
        k: ck[k]
        for k in (
            "socket_timeout",
            "socket_connect_timeout",
            "password",
            "username",
            "decode_responses",
        )
        if ck.get(k) is not None
    }
    opts.update(kw)
    if client is None:
        plain.close()
    return RedisCluster(host=ck.get("host", "127.0.0.1"), port=int(ck.get("port", 6379)), **opts)


class _Part:
    """One hash tag's share of a batch: the keys it touches (by index), the versions it expects
    (checks) and its operations, written through the named methods below (codes in ``OPS``)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.keys: dict[str, int] = {}
        self.checks: list[list[Any]] = []
        self.ops: list[list[Any]] = []

    def k(self, name: str) -> int:
        i = self.keys.get(name)
        if i is None:
            i = self.keys[name] = len(self.keys) + 2  # KEYS[1] is the marker
        return i

    def op(self, op: str, name: str, *args: Any) -> None:
        self.ops.append([op, self.k(name), *(a if isinstance(a, list) else str(a) for a in args)])

    def hash_add_int(self, name: str, field: str, n: int) -> None:
        self.op("hi", name, field, int(n))

    def hash_add_float(self, name: str, field: str, x: float) -> None:
        self.op("hf", name, field, repr(float(x)))

    def hash_add_floats(self, name: str, fields_and_values: list[str]) -> None:
        """``[field, repr(x), field, repr(x), ...]``: one operation for many fields."""
        self.op("hv", name, fields_and_values)

    def hash_set(self, name: str, field: str, value: Any) -> None:
        self.op("hs", name, field, value)

    def hash_keep_min(self, name: str, field: str, x: float) -> None:
        self.op("mn", name, field, repr(float(x)))

    def hash_keep_max(self, name: str, field: str, x: float) -> None:
        self.op("mx", name, field, repr(float(x)))

    def zset_add(self, name: str, n: int, member: str) -> None:
        self.op("zi", name, n, member)

    def set_add(self, name: str, member: str) -> None:
        self.op("sa", name, member)

    def expire(self, name: str, seconds: int) -> None:
        self.op("ex", name, seconds)

    def check(self, name: str, version: str) -> None:
        self.checks.append([self.k(name), version])

    def payload(self) -> str:
        return json.dumps([self.checks, self.ops], separators=(",", ":"))


Deltas = dict[tuple[Any, ...], np.ndarray]  # moment changes per group
Spans = dict[tuple[Any, ...], list[Any]]  # [min first_ts, max last_ts] per group


def _str_keys(h: dict[Any, Any]) -> dict[str, Any]:
    return {(k if isinstance(k, str) else k.decode()): v for k, v in h.items()}


class _UnitTotals:
    """The units of one part, as arrays with a row per unit and the columns first_ts, last_ts,
    then ``_FIELDS``: what Redis holds (``stored``, ``present`` where the hash exists) and what
    this batch adds (``added``; ``has_row`` where the unit gets a row now)."""

    def __init__(self, n: int) -> None:
        self.names: list[str] = []  # each unit's hash key
        self.hashes: list[dict[str, Any]] = []  # each unit's hash as read (str keys)
        self.stored = np.zeros((n, _NV))
        self.added = np.zeros((n, _NV))
        self.present = np.zeros(n)
        self.has_row = np.zeros(n, dtype=bool)

    @classmethod
    def read(
        cls,
        p: _Part,
        tag: str,
        units: list[tuple[Any, ...]],
        olds: dict[str, dict[Any, Any]],
        unit_rows: dict[tuple[Any, ...], list[Any]],
        now: float,
    ) -> _UnitTotals:
        """The units' stored and added totals; a version check per unit on ``p``."""
        t = cls(len(units))
        for i, unit in enumerate(units):
            name = key(tag, "u", enc(unit[1]), unit[2])
            t.names.append(name)
            h = _str_keys(olds.get(name) or {})
            t.hashes.append(h)
            if "first_ts" in h:
                t.present[i] = 1
                first = float(h["first_ts"])
                t.stored[i, 0], t.stored[i, 1] = first, float(h.get("last_ts", first))
                t.stored[i, 2:] = [float(h.get(f, 0) or 0) for f in _FIELDS]
                v = h.get("_v", b"0")
                p.check(name, v.decode() if isinstance(v, bytes) else str(v))
            else:
                p.check(name, "0")
            row = unit_rows.get(unit)
            if row is not None:
                t.has_row[i] = True
                t.added[i] = row
            elif not t.present[i]:  # lookups only, a new unit: an all-zero unit row, counted once
                t.has_row[i] = True
                t.added[i, 0] = t.added[i, 1] = now
        return t

    @property
    def first_seen(self) -> np.ndarray:
        return np.where(self.present > 0, self.stored[:, 0], self.added[:, 0])

    def totals(self) -> np.ndarray:
        """The totals after this batch: sums, the earlier first_ts and the later last_ts."""
        old, add = self.stored, self.added
        new = old + add
        seen = self.present > 0
        new[:, 0] = np.where(seen, np.minimum(old[:, 0], add[:, 0]), add[:, 0])
        new[:, 1] = np.where(seen, np.maximum(old[:, 1], add[:, 1]), add[:, 1])
        return new

    def moment_deltas(
        self, units: list[tuple[Any, ...]], bucket: np.ndarray
    ) -> tuple[Deltas, Spans]:
        """Per (variant, first-seen bucket): the change of the unit moments (``ab_moments``
        columns) and the span [min first_ts, max last_ts] of the units that changed. Units
        without a row keep their totals: they change nothing."""
        changed = np.flatnonzero(self.has_row)
        deltas: Deltas = {}
        spans: Spans = {}
        if not len(changed):
            return deltas, spans
        new = self.totals()
        delta = _m.contributions(new[changed], np.ones(len(changed))) - _m.contributions(
            self.stored[changed], self.present[changed]
        )
        for j, i in enumerate(changed):
            group = (units[i][1], float(bucket[i]))
            if group in deltas:
                deltas[group] += delta[j]
                span = spans[group]
                span[0], span[1] = min(span[0], new[i, 0]), max(span[1], new[i, 1])
            else:
                deltas[group] = delta[j].copy()
                spans[group] = [new[i, 0], new[i, 1]]
        return deltas, spans

    def add_totals(
        self, p: _Part, units: list[tuple[Any, ...]], unit_rows: dict[tuple[Any, ...], list[Any]]
    ) -> None:
        """Each changed unit's sums added to its hash; first_ts and last_ts kept at the extremes."""
        for i in np.flatnonzero(self.has_row):
            name, unit = self.names[i], units[i]
            sums = unit_rows[unit][2:] if unit in unit_rows else ()
            for f, v in zip(_FIELDS, sums, strict=False):
                if v:
                    if isinstance(v, float):
                        p.hash_add_float(name, f, v)
                    else:
                        p.hash_add_int(name, f, int(v))
            p.hash_keep_min(name, "first_ts", float(self.added[i, 0]))
            p.hash_keep_max(name, "last_ts", float(self.added[i, 1]))


def _add_layer_totals(
    p: _Part,
    units: list[tuple[Any, ...]],
    u: _UnitTotals,
    layer_rows: dict[tuple[Any, ...], dict[str, list[Any]]],
    bucket: np.ndarray,
) -> Deltas:
    """Each unit's per-layer lookups and hits added to its hash; returns the change of the layer
    moments per (variant, first-seen bucket, layer), all unit × layer pairs computed at once."""
    pairs: list[tuple[int, str]] = []
    stored: list[tuple[float, float]] = []  # (lookups, hits) as stored
    present: list[float] = []  # 1.0 where the unit's hash has the layer
    added: list[tuple[float, float]] = []  # (lookups, hits) of this batch
    for i, unit in enumerate(units):
        h = u.hashes[i]
        for layer, (lookups, hits) in (layer_rows.get(unit) or {}).items():
            pairs.append((i, layer))
            lf, hf = f"{layer}:lookups", f"{layer}:hits"
            stored.append((float(h.get(lf, 0) or 0), float(h.get(hf, 0) or 0)))
            present.append(float(lf in h))
            added.append((lookups, hits))
            p.hash_add_int(u.names[i], lf, int(lookups))
            p.hash_add_int(u.names[i], hf, int(hits))
    deltas: Deltas = {}
    if not pairs:
        return deltas
    old, add = np.array(stored, dtype=float), np.array(added, dtype=float)
    new = old + add
    delta = _m.layer_contributions(
        new[:, 0], new[:, 1], np.ones(len(pairs))
    ) - _m.layer_contributions(old[:, 0], old[:, 1], np.array(present))
    for (i, layer), row in zip(pairs, delta, strict=True):
        group = (units[i][1], float(bucket[i]), layer)
        if group in deltas:
            deltas[group] += row
        else:
            deltas[group] = row.copy()
    return deltas


def _add_moments(p: _Part, tag: str, moments: Deltas, spans: Spans, layer_moments: Deltas) -> None:
    """The moment changes added to one hash per (variant, bucket), listed in the part's index."""
    hashes = set()
    for (variant, b), delta in moments.items():
        mk = key(tag, "m", enc(variant), _bucket_s(b))
        hashes.add((mk, f"{enc(variant)}:{_bucket_s(b)}"))
        fv: list[str] = []
        for c, v in zip(_m.COLUMNS, delta.tolist(), strict=True):
            if v and c not in ("min_first", "max_last"):
                fv += (c, repr(v))
        p.hash_add_floats(mk, fv)
        first, last = spans[(variant, b)]
        p.hash_keep_min(mk, "min_first", float(first))
        p.hash_keep_max(mk, "max_last", float(last))
    for (variant, b, layer), delta in layer_moments.items():
        mk = key(tag, "m", enc(variant), _bucket_s(b))
        hashes.add((mk, f"{enc(variant)}:{_bucket_s(b)}"))
        fv = []
        for c, v in zip(_m.LAYER_COLUMNS, delta.tolist(), strict=True):
            if v:
                fv += (f"L:{enc(layer)}:{c}", repr(v))
        p.hash_add_floats(mk, fv)
    for mk, member in hashes:
        p.set_add(key(tag, "mi"), member)
        p.expire(mk, RUN_TTL_S)


class RedisSink:
    def __init__(
        self, client: Any, url: str, hot_ttl_s: int, agg: Any, wait_timeout_ms: int = 2000
    ) -> None:
        self._own = client is None
        if client is None:
            import redis

            # A bad URL fails here, at setup; short timeouts: the flusher must not hang on a dead
            # server.
            client = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self._given = client
        self.url = url
        self.client: Any = None  # connected lazily, at the first write (never in the host's setup)
        self.hot_ttl_s = int(hot_ttl_s)
        self.agg = agg
        self.wait_timeout_ms = int(wait_timeout_ms)
        self.conflicts = (
            0  # parts re-read because another writer changed one of their units meanwhile
        )
        self._sha: str | None = None

    def heartbeat(self, replica: str, instance: str, now: float, alive_s: float) -> list[str]:
        """Note that process ``instance`` writes as ``replica`` (a hash per replica,
        instance -> last write); the other instances that wrote as ``replica``
        within ``alive_s``: two processes with one replica label."""
        name = f"{PREFIX}:replica:{{{enc(replica)}}}"
        c = self._client()
        pipe = c.pipeline(transaction=False)
        pipe.hset(name, instance, f"{now:.3f}")
        pipe.expire(name, max(int(alive_s * 4), 60))
        pipe.hgetall(name)
        seen = pipe.execute()[-1] or {}
        others = []
        for k, v in seen.items():
            k = k.decode() if isinstance(k, bytes) else str(k)
            try:
                last = float(v)
            except (TypeError, ValueError):
                continue
            if k != instance and now - last <= alive_s:
                others.append(k)
        return sorted(others)

    # ---------------------------------------------------------------- connection
    def _client(self) -> Any:
        if self.client is None:
            self.client = connect(None, self._given)
            if self._own and self.client is not self._given:  # a cluster: the probe client is done
                self._given.close()
            import hashlib

            self._sha = hashlib.sha1(_APPLY.encode()).hexdigest()
        return self.client

    def _run(self, parts: list[_Part], bid: str) -> list[Any]:
        """Apply parts (one pipeline per node); returns each script's answer."""
        from redis.exceptions import NoScriptError

        c = self._client()
        by_conn: dict[Any, list[int]] = {}
        conns: dict[str, Any] = {}
        waits: dict[str, bool] = {}
        for i, part in enumerate(parts):
            mk = key(part.tag, "batch", bid)
            if not is_cluster(c):
                ident, conn, wait = "one", c, False
            else:
                node = c.get_node_from_key(mk)
                ident = node.name
                conn = c.get_redis_connection(node)
                wait = len(c.nodes_manager.slots_cache.get(c.keyslot(mk), ())) > 1
            conns[ident] = conn
            waits[ident] = waits.get(ident, False) or wait
            by_conn.setdefault(ident, []).append(i)
        out: list[Any] = [None] * len(parts)
        for ident, idx in by_conn.items():
            conn, wait = conns[ident], waits[ident]
            for attempt in (0, 1):
                p = conn.pipeline(transaction=False)
                for i in idx:
                    part = parts[i]
                    keys = [key(part.tag, "batch", bid)] + list(part.keys)
                    p.evalsha(self._sha, len(keys), *keys, BATCH_TTL_S, part.payload())
                if wait:
                    p.execute_command("WAIT", 1, self.wait_timeout_ms)
                try:
                    res = p.execute()
                except (
                    NoScriptError
                ):  # a new or restarted node: load the script, run again (nothing applied)
                    if attempt:
                        raise
                    conn.script_load(_APPLY)
                    continue
                if wait and int(res[-1]) < 1:
                    raise NotReplicated(
                        f"no replica of {ident} acknowledged a write within "
                        f"{self.wait_timeout_ms} ms"
                    )
                for i, r in zip(idx, res, strict=False):
                    out[i] = r
                break
        return out

    def _hgetall_many(self, names: list[str]) -> list[dict[str, Any]]:
        c = self._client()
        out: list[dict[Any, Any]] = []
        for i in range(0, len(names), 2000):
            p = c.pipeline(transaction=False)
            for n in names[i : i + 2000]:
                p.hgetall(n)
            out += p.execute()
        return [{(k.decode() if isinstance(k, bytes) else k): v for k, v in h.items()} for h in out]

    def _index(self, zadd: dict[str, dict[str, float]], sadd: dict[str, set[str]]) -> None:
        if not zadd and not sadd:
            return
        c = self._client()
        p = c.pipeline(transaction=False)
        for name, mapping in zadd.items():
            p.zadd(name, mapping)
        for name, members in sadd.items():
            p.sadd(name, *members)
        p.execute()

    # --------------------------------------------------------------------- write
    def write(self, batches: dict[str, list[Any]], batch_id: str | None = None) -> int:
        """Apply one batch, each hash tag's part atomically and at most once per
        ``batch_id`` (a retry after a timeout passes the same id). Returns the
        rows in it; raises redis-py's errors (the caller keeps the batch)."""
        try:
            return self._write(batches, batch_id)
        except Exception:
            c = self.client
            if c is not None and is_cluster(
                c
            ):  # a moved slot or a dead master: learn the map for the retry
                try:
                    c.nodes_manager.initialize()
                except Exception:
                    pass
            raise

    def _write(self, batches: dict[str, list[Any]], batch_id: str | None) -> int:
        bid = batch_id or uuid.uuid4().hex
        parts: dict[str, _Part] = {}
        zidx: dict[str, dict[str, float]] = defaultdict(dict)
        sidx: dict[str, set[str]] = defaultdict(set)

        def part(tag: str) -> _Part:
            p = parts.get(tag)
            if p is None:
                p = parts[tag] = _Part(tag)
            return p

        n = 0
        ttl = self.hot_ttl_s
        for window, tenant, layer, kh, fam, hits, misses, err in batches.get("hot_keys", ()):
            tag = hot_tag(window, tenant)
            p = part(tag)
            base = key(tag, enc(layer))
            if hits:
                p.zset_add(base + ":hits", hits, kh)
            if misses:
                p.zset_add(base + ":misses", misses, kh)
            p.hash_set(base + ":fam", kh, fam)
            if err:
                p.hash_set(base + ":err", kh, err)
            zidx[f"{PREFIX}:hot:windows"][f"{int(window)}:{enc(tenant)}:{enc(layer)}"] = window
            n += 1
        for p in parts.values():
            for name in list(p.keys):
                p.expire(name, ttl)

        for row in batches.get("warmup_runs", ()):
            rec = {c: ("" if v is None else v) for c, v in zip(_RUN_COLS, row, strict=True)}
            tag = run_tag(rec["run_id"])
            p = part(tag)
            for f, v in rec.items():
                p.hash_set(key(tag), f, v)
            p.expire(key(tag), RUN_TTL_S)
            zidx[f"{PREFIX}:runs"][rec["run_id"]] = float(rec["started"] or 0)
            n += 1
        for what in ("warmed", "early"):
            for row in batches.get(f"{what}_keys", ()):
                tag = run_tag(row[0])
                p = part(tag)
                p.hash_set(key(tag, what), row[1], json.dumps(list(row[2:])))
                p.expire(key(tag, what), RUN_TTL_S)
                n += 1
        units = batches.get("ab_units", ())
        lookups = batches.get("ab_lookups", ())
        n += len(units) + len(lookups)
        if units or lookups:
            sidx[f"{PREFIX}:ab:experiments"].update(
                self._write_ab(units, lookups, bid, list(parts.values()))
            )
        elif parts:
            self._run(list(parts.values()), bid)  # 0 for a part applied before (a retry): skipped
        self._index(zidx, sidx)
        return n

    def _write_ab(
        self,
        unit_rows: Sequence[Sequence[Any]],
        lookup_rows: Sequence[Sequence[Any]],
        bid: str,
        other: list[_Part],
    ) -> set[str]:
        """Unit totals and A/B moments, one script per (experiment, shard);
        ``other`` parts go out with the first round."""
        ukeys: dict[tuple[Any, ...], list[Any]] = {}
        for r in unit_rows:  # fold: a retried batch can repeat a unit
            k = tuple(r[:3])
            a = ukeys.get(k)
            if a is None:
                ukeys[k] = [float(r[3]), float(r[4]), *r[5:]]
            else:
                a[0], a[1] = min(a[0], r[3]), max(a[1], r[4])
                for i, v in enumerate(r[5:]):
                    a[2 + i] += v
        lk: dict[tuple[Any, ...], dict[str, list[Any]]] = {}
        for exp, var, uh, layer, lookups, hits in lookup_rows:
            a = lk.setdefault((exp, var, uh), {}).setdefault(layer, [0, 0])
            a[0] += lookups
            a[1] += hits
        now = max((v[1] for v in ukeys.values()), default=None)
        if now is None:
            now = time.time()
        groups: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
        for u in set(ukeys) | set(lk):
            groups[ab_tag(u[0], ab_shard(u[2]))].append(u)
        pending = {tag: sorted(us) for tag, us in groups.items()}
        for _ in range(MAX_CONFLICT_ROUNDS):
            if not pending:
                break
            names = [
                (tag, u, key(tag, "u", enc(u[1]), u[2])) for tag, us in pending.items() for u in us
            ]
            olds = dict(
                zip([x[2] for x in names], self._hgetall_many([x[2] for x in names]), strict=True)
            )
            tags = list(pending)
            ab_parts = [self._ab_part(tag, pending[tag], olds, ukeys, lk, now) for tag in tags]
            res = self._run(ab_parts + other, bid)
            other = []
            retry: dict[str, list[tuple[Any, ...]]] = {}
            for tag, r in zip(tags, res, strict=False):
                if isinstance(
                    r, list
                ):  # another writer changed these units since the read: read again
                    self.conflicts += 1
                    retry[tag] = pending[tag]
            pending = retry
        if pending:
            raise RuntimeError(
                f"A/B units kept changing under {MAX_CONFLICT_ROUNDS} reads; "
                "retried at the next flush"
            )
        return {u[0] for u in list(ukeys) + list(lk)}

    def _ab_part(
        self,
        tag: str,
        units: list[tuple[Any, ...]],
        olds: dict[str, dict[Any, Any]],
        unit_rows: dict[tuple[Any, ...], list[Any]],
        layer_rows: dict[tuple[Any, ...], dict[str, list[Any]]],
        now: float,
    ) -> _Part:
        """One (experiment, shard) part of a batch: each unit's totals and per-layer totals, and the
        A/B moments of its (variant, first-seen bucket), as the difference its new totals make to
        what is stored. ``olds`` holds the units' hashes as read; the script applies the part only
        if no unit's version ``_v`` changed since (else the caller reads again)."""
        p = _Part(tag)
        u = _UnitTotals.read(p, tag, units, olds, unit_rows, now)
        bucket = _m.bucket_of(u.first_seen)
        moments, spans = u.moment_deltas(units, bucket)
        u.add_totals(p, units, unit_rows)
        layer_moments = _add_layer_totals(p, units, u, layer_rows, bucket)
        for name in u.names:
            p.hash_add_int(name, "_v", 1)  # the version the next writer's checks expect
            p.expire(name, RUN_TTL_S)
            p.set_add(key(tag, "units"), name.rsplit(":u:", 1)[1])
        _add_moments(p, tag, moments, spans, layer_moments)
        p.expire(key(tag, "mi"), RUN_TTL_S)
        p.expire(key(tag, "units"), RUN_TTL_S)
        return p

    def close(self) -> None:
        try:
            (self.client if self.client is not None else self._given).close()
        except Exception:
            pass


def migrate_layout1(client: Any, hot_ttl_s: int = 7 * 86400) -> dict[str, int]:
    """Rewrite a layout-1 database (before hash tags and moments) into layout 2:
    units with their moments, hot keys, warm-up runs; then delete the old keys.
    Run once, with the collectors stopped; a repeat finds nothing to move."""
    c = connect(None, client)
    sink = RedisSink(c, "", hot_ttl_s, None)
    moved = {"units": 0, "hot_keys": 0, "runs": 0}
    legacy = c.smembers(f"{PREFIX}:ab:experiments")
    for exp in sorted(x.decode() if isinstance(x, bytes) else x for x in legacy):
        old_set = f"{PREFIX}:ab:{exp}:units"
        if c.type(old_set) not in (b"set", "set"):
            continue
        units, lookups, dead = [], [], [old_set]
        for m in c.smembers(old_set):
            m = m.decode() if isinstance(m, bytes) else m
            var, uh = m.split(":", 1)
            name = f"{PREFIX}:ab:{exp}:{var}:{uh}"
            h = {
                (k.decode() if isinstance(k, bytes) else k): (
                    v.decode() if isinstance(v, bytes) else v
                )
                for k, v in c.hgetall(name).items()
            }
            dead.append(name)
            if not h:
                continue
            vals = []
            for f in _FIELDS:
                v = h.get(f, "0")
                vals.append(float(v) if "." in v or "e" in v else int(v))
            if "first_ts" in h:
                units.append(
                    (
                        exp,
                        var,
                        uh,
                        float(h["first_ts"]),
                        float(h.get("last_ts", h["first_ts"])),
                        *vals,
                    )
                )
            for f, v in h.items():
                if f.endswith(":lookups"):
                    layer = f[: -len(":lookups")]
                    lookups.append((exp, var, uh, layer, int(v), int(h.get(f"{layer}:hits", 0))))
        if units or lookups:
            sink.write({"ab_units": units, "ab_lookups": lookups}, batch_id=f"migrate-{exp}")
            moved["units"] += len({u[2] for u in units} | {x[2] for x in lookups})
        c.delete(*dead)
    for member in list(c.zrange(f"{PREFIX}:hot:windows", 0, -1)):
        m = member.decode() if isinstance(member, bytes) else member
        window, tenant, layer = m.split(":", 2)
        base = f"{PREFIX}:hot:{m}"
        if not c.exists(base + ":fam"):
            continue
        hits = {k.decode(): v for k, v in c.zrange(base + ":hits", 0, -1, withscores=True)}
        misses = {k.decode(): v for k, v in c.zrange(base + ":misses", 0, -1, withscores=True)}
        fam = {k.decode(): v.decode() for k, v in c.hgetall(base + ":fam").items()}
        err = {k.decode(): int(v) for k, v in c.hgetall(base + ":err").items()}
        rows = [
            (
                float(window),
                tenant,
                layer,
                kh,
                fam.get(kh, ""),
                int(hits.get(kh, 0)),
                int(misses.get(kh, 0)),
                err.get(kh, 0),
            )
            for kh in set(hits) | set(misses)
        ]
        c.zrem(f"{PREFIX}:hot:windows", m)
        sink.write({"hot_keys": rows}, batch_id=f"migrate-hot-{m}")
        c.delete(*(base + s for s in (":hits", ":misses", ":fam", ":err")))
        moved["hot_keys"] += len(rows)

    for rid in c.zrange(f"{PREFIX}:runs", 0, -1):
        rid = rid.decode() if isinstance(rid, bytes) else rid
        name = f"{PREFIX}:run:{rid}"
        rec = {k.decode(): v.decode() for k, v in c.hgetall(name).items()}
        if not rec:
            continue
        batch = {"warmup_runs": [tuple(rec.get(col) or None for col in _RUN_COLS)]}
        for what in ("warmed", "early"):
            batch[f"{what}_keys"] = [
                (rid, kh.decode(), *json.loads(js))
                for kh, js in c.hgetall(f"{name}:{what}").items()
            ]
        sink.write(batch, batch_id=f"migrate-run-{rid}")
        c.delete(name, f"{name}:warmed", f"{name}:early")
        moved["runs"] += 1
    return moved
