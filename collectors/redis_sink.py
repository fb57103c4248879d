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

import contextvars
import functools
import json
import queue
import threading
import time
import uuid
import zlib
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any
from urllib.parse import quote, unquote

import numpy as np
from warmscope.model import ab_metrics as _m
from warmscope.model.records import AB_UNITS, INTEGER, UNIT_FIELDS
from warmscope.model.records import RUN_COLUMNS as _RUN_COLS
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
_SLICES, _SLICE_UNITS = 4, 1000  # a batch of 4,000+ units goes out in 4 slices of its hash tags
_FIELDS = UNIT_FIELDS[2:] + tuple(_H)
_INT_FIELDS = {
    c.name for c in AB_UNITS.columns if c.type == INTEGER
}  # unit totals after first_ts, last_ts
_NV = 2 + len(_FIELDS)
ROW_FIELDS = ("first_ts", "last_ts", *_FIELDS)  # a unit's totals, as the sink computes them
_INT_COLS = [j for j, f in enumerate(ROW_FIELDS) if f in _INT_FIELDS]  # counts, written as ints
_ROW_NAMES = np.array(ROW_FIELDS, dtype=object)
_INT_MASK = np.isin(np.arange(len(ROW_FIELDS)), _INT_COLS)


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


# A part is one Lua script call. KEYS[1]: the part's marker; KEYS[2..U+1]: its U units' hashes;
# KEYS[U+2]: its set of units; then every other key it touches.
# ARGV[1]: marker TTL; ARGV[2]: unit TTL; ARGV[3]: U; ARGV[4]: per unit, two float64
# (little-endian): the _v read and its number of field/value pairs; ARGV[5]: the length of
# ``ws:{TAG}:u:`` (a unit's member in the set is the rest of its key); then each unit's
# field/value pairs (its new totals, absolute, computed from the hash as read); then the
# operations, each as code, key index, argument count n, n arguments. Python writes them through
# _Part's named operations; the two-letter codes keep the payload small. Everything is a plain
# argument: nothing to decode or convert, and a unit is one HSET of arguments as they came.
# The part is applied only if every unit's version _v is still the one read.
# Returns 0 (applied before: skipped), 1 (applied), or the key indexes whose
# _v changed since they were read (nothing applied).
# code: (the _Part method that writes it, what the script does)
OPS: dict[str, tuple[str | None, str]] = {
    "hi": ("hash_add_int", "HINCRBY k field n"),
    "hf": ("hash_add_float", "HINCRBYFLOAT k field x"),
    "hv": (
        "hash_add_floats",
        "add x to field for each (field, x) of a flat list: HMGET the fields, HSET the sums",
    ),
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
local nu, heads = tonumber(ARGV[3]), ARGV[4]
local bad = {}
for u = 1, nu do
  local want = struct.unpack('<d', heads, (u - 1) * 16 + 1)
  if tonumber(redis.call('HGET', KEYS[u + 1], '_v') or '0') ~= want then bad[#bad + 1] = u + 1 end
end
if #bad > 0 then return bad end
redis.call('SET', KEYS[1], 'applied', 'EX', ARGV[1])
local ttl, plen, i, members = ARGV[2], tonumber(ARGV[5]), 6, {}
for u = 1, nu do
  local v, n = struct.unpack('<dd', heads, (u - 1) * 16 + 1)
  local k = KEYS[u + 1]
  if n > 0 then
    redis.call('HSET', k, '_v', v + 1, unpack(ARGV, i, i + 2 * n - 1))
    i = i + 2 * n
  else
    redis.call('HSET', k, '_v', v + 1)
  end
  redis.call('EXPIRE', k, ttl)
  members[#members + 1] = string.sub(k, plen + 1)
  if #members == 1000 or u == nu then
    redis.call('SADD', KEYS[nu + 2], unpack(members))
    members = {}
  end
end
while i <= #ARGV do
  local op, k, n = ARGV[i], KEYS[tonumber(ARGV[i + 1])], tonumber(ARGV[i + 2])
  local a, b = i + 3, i + 2 + n
  i = b + 1
  if op == 'hv' and b >= a then  -- one read and one write for the whole list
    local f = {}
    for j = a, b, 2 do f[#f + 1] = ARGV[j] end
    local cur, t = redis.call('HMGET', k, unpack(f)), {}
    for j = 1, #f do
      t[#t + 1] = f[j]
      t[#t + 1] = (cur[j] and tonumber(cur[j]) or 0) + tonumber(ARGV[a + 2 * j - 1])
    end
    redis.call('HSET', k, unpack(t))
  elseif op == 'hv' then  -- nothing to add
  elseif op == 'hf' then redis.call('HINCRBYFLOAT', k, ARGV[a], ARGV[a + 1])
  elseif op == 'hi' then redis.call('HINCRBY', k, ARGV[a], ARGV[a + 1])
  elseif op == 'hs' then redis.call('HSET', k, ARGV[a], ARGV[a + 1])
  elseif op == 'zi' then redis.call('ZINCRBY', k, ARGV[a], ARGV[a + 1])
  elseif op == 'mn' or op == 'mx' then
    local cur = redis.call('HGET', k, ARGV[a])
    if (not cur) or (op == 'mn' and tonumber(ARGV[a + 1]) < tonumber(cur))
        or (op == 'mx' and tonumber(ARGV[a + 1]) > tonumber(cur)) then
      redis.call('HSET', k, ARGV[a], ARGV[a + 1])
    end
  elseif op == 'za' then redis.call('ZADD', k, ARGV[a], ARGV[a + 1])
  elseif op == 'sa' then redis.call('SADD', k, ARGV[a])
  elseif op == 'ex' then redis.call('EXPIRE', k, ARGV[a])
  else return redis.error_reply('unknown op ' .. tostring(op)) end
end
return 1
"""
# Each key's hash, as flat [field, value, ...] lists (all keys of one hash tag).
_READ = """
local out = {}
for i = 1, #KEYS do out[i] = redis.call('HGETALL', KEYS[i]) end
return out
"""


class _Sender:
    """Runs calls in order on its own daemon thread: a script waits on the network there while
    the caller prepares the next one (and, on a cluster, nodes are written in parallel). Each
    call runs in the context it was submitted from (warmscope's own commands stay marked)."""

    def __init__(self, name: str) -> None:
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        f: Future[Any] = Future()
        self._q.put((f, contextvars.copy_context(), fn, args))
        return f

    def stop(self) -> None:
        self._q.put(None)

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            f, ctx, fn, args = item
            try:
                f.set_result(ctx.run(fn, *args))
            except BaseException as e:
                f.set_exception(e)


def _wait_all(futures: list[Future[Any]]) -> list[Any]:
    """Every future's result, after all of them ended (none left running); the first error is
    raised then."""
    out, err = [], None
    for f in futures:
        try:
            out.append(f.result())
        except BaseException as e:
            out.append(None)
            err = err or e
    if err is not None:
        raise err
    return out


class NotReplicated(Exception):
    """No replica acknowledged a part within the timeout: it is retried."""


def _settle(out: Future[Any], f: Future[Any], fn: Callable[[Any], Any]) -> None:
    try:
        out.set_result(fn(f.result()))
    except BaseException as e:
        out.set_exception(e)


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
    """One hash tag's share of a batch: its units (``set_units``, first), the other keys it
    touches (by index) and its operations, written through the named methods below (codes in
    ``OPS``); see ``_APPLY`` for the layout."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.keys: dict[str, int] = {}
        self.ops: list[list[Any]] = []  # each: code, key index, arguments
        self.unit_args: list[Any] = [0, 0, b"", 0]

    def set_units(
        self,
        names: list[str],
        units_set: str,
        heads: bytes,
        pairs: list[Any],
        member_at: int,
        seconds: int,
    ) -> None:
        """The part's units (their hash keys, then the set that lists them): per unit the _v
        read and its number of field/value pairs (``heads``), and the pairs, in unit order (see
        ``_APPLY``); called before any other key is added."""
        for n in names:
            self.keys[n] = len(self.keys) + 2
        self.k(units_set)
        self.unit_args = [seconds, len(names), heads, member_at, *pairs]

    def k(self, name: str) -> int:
        i = self.keys.get(name)
        if i is None:
            i = self.keys[name] = len(self.keys) + 2  # KEYS[1] is the marker
        return i

    def op(self, op: str, name: str, *args: Any) -> None:
        self.ops.append([op, self.k(name), *(str(a) for a in args)])

    def hash_add_int(self, name: str, field: str, n: int) -> None:
        self.op("hi", name, field, int(n))

    def hash_add_float(self, name: str, field: str, x: float) -> None:
        self.op("hf", name, field, repr(float(x)))

    def hash_add_floats(self, name: str, fields_and_values: list[str]) -> None:
        """``[field, repr(x), field, repr(x), ...]``: one operation for many fields."""
        self.ops.append(["hv", self.k(name), *fields_and_values])

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

    def args(self) -> list[Any]:
        """The script's arguments after the marker TTL (see ``_APPLY``)."""
        out: list[Any] = list(self.unit_args)
        for o in self.ops:
            out += (o[0], o[1], len(o) - 2)
            out += o[2:]
        return out


Deltas = dict[tuple[Any, ...], np.ndarray]  # moment changes per group
Spans = dict[tuple[Any, ...], list[Any]]  # [min first_ts, max last_ts] per group


def _str(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


class _ABBatch:
    """A batch's A/B rows folded per unit, as arrays with a row per unit and the columns
    ``ROW_FIELDS`` (first_ts, last_ts, then ``_FIELDS``): ``added`` holds what the batch adds,
    ``has_row`` where a request-level row came; the per-layer rows as flat arrays (unit, layer,
    lookups, hits). A unit's rows of one batch are applied together, by one script."""

    def __init__(
        self, unit_rows: Sequence[Sequence[Any]], lookup_rows: Sequence[Sequence[Any]]
    ) -> None:
        index: dict[tuple[Any, ...], int] = {}
        ui = [index.setdefault((r[0], r[1], r[2]), len(index)) for r in unit_rows]
        vals = np.array([r[3:] for r in unit_rows], dtype=float).reshape(len(unit_rows), _NV)
        n_rows = len(index)
        if n_rows == len(unit_rows):  # the usual case: a unit once
            added = vals
        else:  # a retried batch can repeat a unit: sums added, first/last at the extremes
            at = np.array(ui)
            added = np.zeros((n_rows, _NV))
            added[:, 0], added[:, 1] = np.inf, -np.inf
            np.minimum.at(added[:, 0], at, vals[:, 0])
            np.maximum.at(added[:, 1], at, vals[:, 1])
            np.add.at(added[:, 2:], at, vals[:, 2:])
        seen: dict[tuple[int, str], int] = {}
        lay_u: list[int] = []
        lay_name: list[str] = []
        lay_n: list[list[int]] = []  # [lookups, hits]
        for exp, var, uh, layer, lookups, hits in lookup_rows:
            i = index.setdefault((exp, var, uh), len(index))
            k = seen.setdefault((i, layer), len(lay_u))
            if k == len(lay_u):
                lay_u.append(i)
                lay_name.append(layer)
                lay_n.append([lookups, hits])
            else:  # a retried batch can repeat a unit's layer
                lay_n[k][0] += lookups
                lay_n[k][1] += hits
        self.lay_u = np.array(lay_u, dtype=np.int64)
        self.lay_name = lay_name
        self.lay_n = np.array(lay_n, dtype=np.int64).reshape(len(lay_u), 2)
        self.units = list(index)
        n = len(self.units)
        self.now = float(added[:, 1].max()) if n_rows else time.time()
        self.added = np.zeros((n, _NV))
        self.added[:n_rows] = added
        self.has_row = np.zeros(n, dtype=bool)
        self.has_row[:n_rows] = True
        tags: dict[tuple[str, int], str] = {}
        variants: dict[str, int] = {}
        self.variants: list[str] = []
        var_id = np.zeros(n, dtype=np.int64)
        self.name: list[str] = []
        self.by_tag: dict[str, list[int]] = defaultdict(list)
        for i, (exp, var, uh) in enumerate(self.units):
            s = ab_shard(uh)
            t = tags.get((exp, s))
            if t is None:
                t = tags[(exp, s)] = ab_tag(exp, s)
            v = variants.get(var)
            if v is None:
                v = variants[var] = len(self.variants)
                self.variants.append(var)
            var_id[i] = v
            self.name.append(f"{PREFIX}:{{{t}}}:u:{enc(var)}:{uh}")
            self.by_tag[t].append(i)
        self.var_id = var_id

    def experiments(self) -> set[str]:
        return {u[0] for u in self.units}

    def parts(self, tags: list[str], hashes: dict[int, list[Any]], ttl: int) -> list[_Part]:
        """One part per tag: each unit's new totals (from ``hashes``, the units' hashes as read)
        checked against the version read, and the moment changes they make."""
        idx = np.array([i for t in tags for i in self.by_tag[t]], dtype=np.int64)
        m = len(idx)
        pos_of = np.full(len(self.units), -1, dtype=np.int64)
        pos_of[idx] = np.arange(m)
        stored = np.zeros((m, _NV))
        present = np.zeros(m)
        versions = np.zeros(m)
        olds: dict[int, dict[str, Any]] = {}  # position -> hash as read, where there is one
        col = {f: j for j, f in enumerate(ROW_FIELDS)}
        for i, flat in hashes.items():
            j = int(pos_of[i])
            if j < 0 or not flat:
                continue
            h = {_str(flat[k]): flat[k + 1] for k in range(0, len(flat), 2)}
            olds[j] = h
            versions[j] = int(h.get("_v", 0) or 0)
            if "first_ts" in h:
                present[j] = 1
                row = stored[j]
                for f, v in h.items():
                    c = col.get(f)
                    if c is not None:
                        row[c] = float(v or 0)
                if "last_ts" not in h:
                    row[1] = row[0]
        added = self.added[idx]
        has_row = self.has_row[idx]
        new_unit = ~has_row & (present == 0)  # lookups only, a new unit: an all-zero unit row
        added[new_unit, 0] = added[new_unit, 1] = self.now
        has_row = has_row | new_unit
        seen = present > 0
        new = stored + added
        new[:, 0] = np.where(seen, np.minimum(stored[:, 0], added[:, 0]), added[:, 0])
        new[:, 1] = np.where(seen, np.maximum(stored[:, 1], added[:, 1]), added[:, 1])
        bucket = _m.bucket_of(np.where(seen, stored[:, 0], added[:, 0]))  # first seen
        ti = np.repeat(np.arange(len(tags)), [len(self.by_tag[t]) for t in tags])
        var = self.var_id[idx]

        # per-layer lookups and hits of these units: old (as read) and new totals
        sel = np.flatnonzero(pos_of[self.lay_u] >= 0)
        lj = pos_of[self.lay_u[sel]]
        order = np.argsort(lj, kind="stable")
        sel, lj = sel[order], lj[order]
        l_add = self.lay_n[sel].astype(float)
        l_old = np.zeros((len(sel), 3))  # lookups, hits, whether the hash had the layer
        names = [self.lay_name[k] for k in sel.tolist()]
        if olds:
            for e, j in enumerate(lj.tolist()):
                was = olds.get(j)
                if was is not None:
                    ol = was.get(f"{names[e]}:lookups")
                    if ol is not None:
                        l_old[e] = (int(ol), int(was.get(f"{names[e]}:hits") or 0), 1.0)
        l_new = (l_old[:, :2] + l_add).astype(np.int64)

        # each unit's hash: field/value pairs of its new totals (a new unit's zero fields left
        # out), then its layers' new lookups and hits; values as Python numbers (sent as text)
        write = ((new != 0) | seen[:, None]) & has_row[:, None]
        rj = np.nonzero(write)[0]
        vo = new[write].astype(object)
        ints = np.flatnonzero(_INT_MASK[np.nonzero(write)[1]])
        vo[ints] = new[write][ints].astype(np.int64).astype(object)
        fields = [_layer_fields(n) for n in names]
        lnames = np.array([f for pair in fields for f in pair], dtype=object)
        unit_of = np.concatenate([rj, np.repeat(lj, 2)])
        order = np.argsort(unit_of, kind="stable")  # a unit's row fields, then its layers
        both = np.empty(2 * len(unit_of), dtype=object)
        both[0::2] = np.concatenate([_ROW_NAMES[np.nonzero(write)[1]], lnames])[order]
        both[1::2] = np.concatenate([vo, l_new.reshape(-1).astype(object)])[order]
        pairs = both.tolist()
        n_pairs = np.bincount(unit_of, minlength=m)
        off = np.r_[0, np.cumsum(2 * n_pairs)].tolist()
        head = np.column_stack([versions, n_pairs]).astype("<f8")
        parts = []
        starts = np.searchsorted(ti, np.arange(len(tags) + 1)).tolist()
        for k, t in enumerate(tags):
            a, b = starts[k], starts[k + 1]
            p = _Part(t)
            p.set_units(
                [self.name[i] for i in idx[a:b].tolist()],
                key(t, "units"),
                head[a:b].tobytes(),
                pairs[off[a] : off[b]],
                len(key(t, "u")) + 1,
                ttl,
            )
            parts.append(p)

        # moments of the units whose totals changed, per (tag, variant, first-seen bucket)
        moments: dict[int, Deltas] = defaultdict(dict)
        spans: dict[int, Spans] = defaultdict(dict)
        ch = np.flatnonzero(has_row)
        if len(ch):
            delta = _m.contributions(new[ch], np.ones(len(ch)))
            had = np.flatnonzero(present[ch] > 0)  # a new unit's old row counts nothing
            if len(had):
                delta[had] -= _m.contributions(stored[ch[had]], np.ones(len(had)))
            g = _group((ti[ch], var[ch], bucket[ch]), delta)
            for (tk, v, b), rows_of, d in g:
                moments[tk][(self.variants[v], b)] = d
                s = ch[rows_of]
                spans[tk][(self.variants[v], b)] = [float(new[s, 0].min()), float(new[s, 1].max())]
        layer_moments: dict[int, Deltas] = defaultdict(dict)
        if len(sel):
            tot = l_old[:, :2] + l_add
            ldelta = _m.layer_contributions(
                tot[:, 0], tot[:, 1], np.ones(len(sel))
            ) - _m.layer_contributions(l_old[:, 0], l_old[:, 1], l_old[:, 2])
            layer_ids: dict[str, int] = {}
            lid = np.array([layer_ids.setdefault(n, len(layer_ids)) for n in names])
            layer_names = list(layer_ids)
            for (tk, v, b, li), _, d in _group((ti[lj], var[lj], bucket[lj], lid), ldelta):
                layer_moments[tk][(self.variants[v], b, layer_names[li])] = d
        for k, (t, p) in enumerate(zip(tags, parts, strict=True)):
            _add_moments(p, t, moments.get(k, {}), spans.get(k, {}), layer_moments.get(k, {}))
            p.expire(key(t, "mi"), RUN_TTL_S)
            p.expire(key(t, "units"), RUN_TTL_S)
        return parts


@functools.lru_cache(maxsize=1024)
def _layer_fields(layer: str) -> tuple[str, str]:
    return f"{layer}:lookups", f"{layer}:hits"


def _group(
    keys: tuple[np.ndarray, ...], rows: np.ndarray
) -> list[tuple[tuple[Any, ...], np.ndarray, np.ndarray]]:
    """(group key, the positions of its rows, the sum of its rows) per distinct key; ``keys``
    are equal-length columns (ints, or floats for the bucket)."""
    cols = np.column_stack(keys)
    uniq, gi = np.unique(cols, axis=0, return_inverse=True)
    gi = gi.reshape(-1)
    order = np.argsort(gi, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(gi[order]) != 0])
    sums = np.add.reduceat(rows[order], starts, axis=0)
    ends = np.r_[starts[1:], len(order)]
    out = []
    for k, (s, e) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        u = uniq[gi[order[s]]].tolist()
        key_ = tuple(int(x) if j != 2 else float(x) for j, x in enumerate(u))
        out.append((key_, order[s:e], sums[k]))
    return out


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
        self._shas: dict[str, str] = {}  # script -> its SHA1
        self._senders: dict[str, _Sender] = {}  # node -> the thread that writes to it

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
        return self.client

    def _by_node(self, tags: list[str]) -> dict[str, tuple[Any, bool, list[int]]]:
        """Calls grouped by the node that holds their hash tag: node -> (connection, whether its
        masters have replicas to WAIT for, the calls' positions)."""
        c = self._client()
        if not is_cluster(c):
            return {"one": (c, False, list(range(len(tags))))}
        out: dict[str, tuple[Any, bool, list[int]]] = {}
        for i, tag in enumerate(tags):
            mk = key(tag)
            node = c.get_node_from_key(mk)
            g = out.get(node.name)
            if g is None:
                wait = len(c.nodes_manager.slots_cache.get(c.keyslot(mk), ())) > 1
                g = out[node.name] = (c.get_redis_connection(node), wait, [])
            g[2].append(i)
        return out

    def _eval(
        self,
        script: str,
        calls: list[tuple[str, list[str], list[Any]]],
        check_replicas: bool = False,
    ) -> Future[list[Any]]:
        """Run ``script`` once per call (hash tag, keys, arguments): one pipeline per node, each
        on that node's sender thread. The future gives each call's answer. With
        ``check_replicas``, each node's pipeline ends with ``WAIT 1`` where its masters have
        replicas, and raises NotReplicated if none answered."""
        sha = self._shas.get(script)
        if sha is None:
            import hashlib

            sha = self._shas[script] = hashlib.sha1(script.encode()).hexdigest()
        groups = self._by_node([c[0] for c in calls])
        futures = []
        for ident, (conn, wait, idx) in groups.items():
            sender = self._senders.get(ident)
            if sender is None:
                sender = self._senders[ident] = _Sender(f"warmscope-redis-{ident}")
            node_calls = [calls[i] for i in idx]
            futures.append(
                sender.submit(
                    self._node_pipeline,
                    conn,
                    ident,
                    script,
                    sha,
                    node_calls,
                    wait and check_replicas,
                )
            )
        out: Future[list[Any]] = Future()
        if len(futures) == 1:
            futures[0].add_done_callback(lambda f: _settle(out, f, lambda r: r))
            return out

        def gather(_: Any) -> None:
            if all(f.done() for f in futures) and not out.done():
                try:
                    res: list[Any] = [None] * len(calls)
                    for (_, _, idx), r in zip(groups.values(), _wait_all(futures), strict=True):
                        for i, x in zip(idx, r, strict=True):
                            res[i] = x
                    out.set_result(res)
                except BaseException as e:
                    out.set_exception(e)

        for f in futures:
            f.add_done_callback(gather)
        return out

    def _node_pipeline(
        self,
        conn: Any,
        ident: str,
        script: str,
        sha: str,
        calls: list[tuple[str, list[str], list[Any]]],
        wait: bool,
    ) -> list[Any]:
        from redis.exceptions import NoScriptError

        for attempt in (0, 1):
            p = conn.pipeline(transaction=False)
            for _, keys, args in calls:
                p.evalsha(sha, len(keys), *keys, *args)
            if wait:
                p.execute_command("WAIT", 1, self.wait_timeout_ms)
            try:
                res = p.execute()
            except NoScriptError:  # a new or restarted node: load the script, run again
                if attempt:
                    raise
                conn.script_load(script)
                continue
            if wait and int(res[-1]) < 1:
                raise NotReplicated(
                    f"no replica of {ident} acknowledged a write within {self.wait_timeout_ms} ms"
                )
            return list(res[: len(calls)])
        raise AssertionError("unreachable")  # pragma: no cover

    def _run(self, parts: list[_Part], bid: str) -> list[Any]:
        """Apply parts (one pipeline per node); returns each script's answer."""
        return self._submit(parts, bid).result()

    def _submit(self, parts: list[_Part], bid: str) -> Future[list[Any]]:
        """Start applying parts; the future gives each script's answer."""
        calls = [
            (p.tag, [key(p.tag, "batch", bid), *p.keys], [BATCH_TTL_S, *p.args()]) for p in parts
        ]
        return self._eval(_APPLY, calls, check_replicas=True)

    def _read_units(self, batch: _ABBatch, tags: list[str]) -> dict[int, list[Any]]:
        """The hashes of the units of ``tags`` as flat [field, value, ...] lists, by unit
        position in ``batch``; one script call per tag."""
        calls: list[tuple[str, list[str], list[Any]]] = [
            (t, [batch.name[i] for i in batch.by_tag[t]], []) for t in tags
        ]
        out: dict[int, list[Any]] = {}
        for t, flats in zip(tags, self._eval(_READ, calls).result(), strict=True):
            for i, flat in zip(batch.by_tag[t], flats, strict=True):
                if flat:
                    out[i] = flat
        return out

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
        """Unit totals and A/B moments, one script per (experiment, shard); ``other`` parts go
        out with the first round. Each unit's hash is set to its new totals (read, then added
        to) and each moment hash gets the change those totals make, applied only if no unit's
        version ``_v`` changed since the read (else that part is read and computed again).
        A large batch goes out in slices of tags: a slice is computed while the previous one
        is written. Returns once nothing is in flight."""
        batch = _ABBatch(unit_rows, lookup_rows)
        pending = sorted(batch.by_tag)
        for _ in range(MAX_CONFLICT_ROUNDS):
            if not pending:
                break
            hashes = self._read_units(batch, pending)
            n = max(1, min(_SLICES, len(batch.units) // _SLICE_UNITS))
            per = -(-len(pending) // n)
            slices = [pending[i : i + per] for i in range(0, len(pending), per)]
            futures = []
            try:
                for tags in slices:
                    futures.append(self._submit(batch.parts(tags, hashes, RUN_TTL_S) + other, bid))
                    other = []
            finally:
                answers = _wait_all(futures)  # raises the first error once none is in flight
            retry = []
            for tags, res in zip(slices, answers, strict=True):
                for tag, r in zip(tags, res, strict=False):
                    if isinstance(r, list):  # another writer changed these units since the read
                        self.conflicts += 1
                        retry.append(tag)
            pending = retry
        if pending:
            raise RuntimeError(
                f"A/B units kept changing under {MAX_CONFLICT_ROUNDS} reads; "
                "retried at the next flush"
            )
        return batch.experiments()

    def close(self) -> None:
        for sender in self._senders.values():
            sender.stop()
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
