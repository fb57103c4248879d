"""Redis sink: hot keys, A/B unit records and warm-up runs for production.

Layout (every key under ``ws:``; only keyed hashes of cache keys and units):

* ``ws:hot:{window}:{tenant}:{layer}:hits`` / ``:misses`` — sorted sets,
  member = key hash, score = count in the window (ZINCRBY); ``:fam`` — hash
  key hash -> family; ``:err`` — hash key hash -> Space-Saving error bound;
  ``ws:hot:windows`` — sorted set of ``{window}:{tenant}:{layer}`` by window.
* ``ws:ab:{experiment}:{variant}:{unit hash}`` — hash of the unit's sums
  (HINCRBY / HINCRBYFLOAT): request-level fields as ``store.ab_units``, and per
  layer ``{layer}:lookups`` / ``{layer}:hits``; plus ``first_ts`` / ``last_ts``; ``ws:ab:{experiment}:units`` — set of ``{variant}:{unit hash}``;
  ``ws:ab:experiments`` — set of experiment names.
* ``ws:run:{run_id}`` — hash of the warm-up run record; ``ws:runs`` — sorted set
  of run ids by start; ``ws:run:{run_id}:warmed`` / ``:early`` — hashes key hash
  -> JSON row (as ``store.warmed_keys`` / ``store.early_keys`` minus ids).

Everything gets a TTL (``hot_key_ttl_s``; runs and units 30 days).

Exactly once: each batch (at most a few thousand rows) is applied by one Lua
script that first sets ``ws:batch:{batch id}`` (NX, kept 1 day) and skips the
whole batch if that id was applied before. A batch that timed out after Redis
received it (a stalled server) is retried with the same id, so its increments
count once. The analysis Redis source reads this layout back into the
canonical frames.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from .records import RUN_COLUMNS as _RUN_COLS
from .records import UNIT_FIELDS
from .records import UNIT_HIST as _H

__all__ = ["RedisSink", "PREFIX", "RUN_TTL_S"]

PREFIX = "ws"
RUN_TTL_S = 30 * 86400
BATCH_TTL_S = 86400  # applied batch ids are remembered this long

# ARGV: marker ttl, then ops: "zi" key incr member | "hs" key field value |
# "hn" key field value (HSETNX) | "hi"/"hf" key field incr | "ex" key ttl |
# "za" key score member | "sa" key member. KEYS[1]: the batch marker.
_APPLY = """
if not redis.call('SET', KEYS[1], 'applied', 'NX', 'EX', ARGV[1]) then return 0 end
local a = ARGV
local i = 2
local n = #a
while i <= n do
  local op = a[i]
  if op == 'zi' then redis.call('ZINCRBY', a[i+1], a[i+2], a[i+3]); i = i + 4
  elseif op == 'hs' then redis.call('HSET', a[i+1], a[i+2], a[i+3]); i = i + 4
  elseif op == 'hn' then redis.call('HSETNX', a[i+1], a[i+2], a[i+3]); i = i + 4
  elseif op == 'hi' then redis.call('HINCRBY', a[i+1], a[i+2], a[i+3]); i = i + 4
  elseif op == 'hf' then redis.call('HINCRBYFLOAT', a[i+1], a[i+2], a[i+3]); i = i + 4
  elseif op == 'za' then redis.call('ZADD', a[i+1], a[i+2], a[i+3]); i = i + 4
  elseif op == 'ex' then redis.call('EXPIRE', a[i+1], a[i+2]); i = i + 3
  elseif op == 'sa' then redis.call('SADD', a[i+1], a[i+2]); i = i + 3
  else return redis.error_reply('unknown op ' .. tostring(op)) end
end
return 1
"""


class _Ops:
    """Commands recorded as flat script arguments (the pipeline API the
    writer used before, kept so the layout code reads the same)."""

    def __init__(self) -> None:
        self.args: list = []

    def zincrby(self, key: str, amount: float, member: str) -> None:
        self.args += ("zi", key, amount, member)

    def hset(self, key: str, field: str | None = None, value: Any = None, mapping: dict | None = None) -> None:
        if mapping is not None:
            for f, v in mapping.items():
                self.args += ("hs", key, f, v)
        else:
            self.args += ("hs", key, field, value)

    def hsetnx(self, key: str, field: str, value: Any) -> None:
        self.args += ("hn", key, field, value)

    def hincrby(self, key: str, field: str, amount: int) -> None:
        self.args += ("hi", key, field, int(amount))

    def hincrbyfloat(self, key: str, field: str, amount: float) -> None:
        self.args += ("hf", key, field, repr(float(amount)))

    def expire(self, key: str, ttl: int) -> None:
        self.args += ("ex", key, int(ttl))

    def zadd(self, key: str, mapping: dict) -> None:
        for member, score in mapping.items():
            self.args += ("za", key, score, member)

    def sadd(self, key: str, member: str) -> None:
        self.args += ("sa", key, member)


class RedisSink:
    def __init__(self, client: Any, url: str, hot_ttl_s: int, agg: Any) -> None:
        if client is None:
            import redis

            # Short timeouts: the flusher must not hang on a dead server.
            client = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self.client = client
        self._apply = client.register_script(_APPLY)
        self.hot_ttl_s = int(hot_ttl_s)
        self.agg = agg

    def write(self, batches: dict[str, list], batch_id: str | None = None) -> int:
        """Apply one batch atomically and at most once per ``batch_id``
        (a retry after a timeout passes the same id). Returns rows in it."""
        p = _Ops()
        n = 0
        ttl = self.hot_ttl_s
        for window, tenant, layer, kh, fam, hits, misses, err in batches.get("hot_keys", ()):
            base = f"{PREFIX}:hot:{int(window)}:{tenant}:{layer}"
            if hits:
                p.zincrby(base + ":hits", hits, kh)
            if misses:
                p.zincrby(base + ":misses", misses, kh)
            p.hset(base + ":fam", kh, fam)
            if err:
                p.hset(base + ":err", kh, err)
            for suffix in (":hits", ":misses", ":fam", ":err"):
                p.expire(base + suffix, ttl)
            p.zadd(f"{PREFIX}:hot:windows", {f"{int(window)}:{tenant}:{layer}": window})
            n += 1
        fields = UNIT_FIELDS[2:] + tuple(_H)
        touched: set[tuple[str, str, str]] = set()
        for row in batches.get("ab_units", ()):
            exp, var, uh, first_ts, last_ts = row[:5]
            key = f"{PREFIX}:ab:{exp}:{var}:{uh}"
            for f, v in zip(fields, row[5:]):
                if v:
                    if isinstance(v, float):
                        p.hincrbyfloat(key, f, v)
                    else:
                        p.hincrby(key, f, v)
            p.hsetnx(key, "first_ts", first_ts)
            p.hset(key, "last_ts", last_ts)
            touched.add((exp, var, uh))
            n += 1
        for exp, var, uh, layer, lookups, hits in batches.get("ab_lookups", ()):
            key = f"{PREFIX}:ab:{exp}:{var}:{uh}"
            if lookups:
                p.hincrby(key, f"{layer}:lookups", lookups)
            if hits:
                p.hincrby(key, f"{layer}:hits", hits)
            touched.add((exp, var, uh))
            n += 1
        for exp, var, uh in touched:
            p.expire(f"{PREFIX}:ab:{exp}:{var}:{uh}", RUN_TTL_S)
            p.sadd(f"{PREFIX}:ab:{exp}:units", f"{var}:{uh}")
        for exp in {t[0] for t in touched}:
            p.expire(f"{PREFIX}:ab:{exp}:units", RUN_TTL_S)
            p.sadd(f"{PREFIX}:ab:experiments", exp)
        for row in batches.get("warmup_runs", ()):
            rec = {c: ("" if v is None else v) for c, v in zip(_RUN_COLS, row)}
            key = f"{PREFIX}:run:{rec['run_id']}"
            p.hset(key, mapping=rec)
            p.expire(key, RUN_TTL_S)
            p.zadd(f"{PREFIX}:runs", {rec["run_id"]: float(rec["started"] or 0)})
            n += 1
        for row in batches.get("warmed_keys", ()):
            key = f"{PREFIX}:run:{row[0]}:warmed"
            p.hset(key, row[1], json.dumps(list(row[2:])))
            p.expire(key, RUN_TTL_S)
            n += 1
        for row in batches.get("early_keys", ()):
            key = f"{PREFIX}:run:{row[0]}:early"
            p.hset(key, row[1], json.dumps(list(row[2:])))
            p.expire(key, RUN_TTL_S)
            n += 1
        if n:
            bid = batch_id or uuid.uuid4().hex
            self._apply(keys=[f"{PREFIX}:batch:{bid}"], args=[BATCH_TTL_S, *p.args])
        return n

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:
            pass
