"""Redis source: hot keys, A/B unit records and warm-up runs written by the
collectors' Redis sink (layout in :mod:`collectors.redis_sink`), read back
into the canonical frames.

Example::

    src = RedisSource("redis://redis:6379/0")
    units = src.units("warmup-strategy")          # same columns as EmbeddedStore.units
    hot = src.frame("hot_keys", start=t0, end=t1)
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from warmscope.collectors.redis_sink import PREFIX
from warmscope.collectors.store import _TABLES

from .sources import SourceError

__all__ = ["RedisSource"]


class RedisSource:
    label = "Redis"

    def __init__(self, url: str, client: Any = None) -> None:
        import redis

        self.url = url
        self.r = client or redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=3,
                                                decode_responses=True)

    def describe(self) -> str:
        return f"Redis · {self.url}"

    def _call(self, fn, *a):
        import redis

        try:
            return fn(*a)
        except redis.exceptions.ConnectionError:
            raise SourceError(f"Redis at {self.url} is unreachable; start it or set WARMSCOPE_REDIS_URL to the "
                              "right address") from None
        except redis.exceptions.TimeoutError:
            raise SourceError(f"Redis at {self.url} did not answer in time") from None
        except redis.exceptions.ResponseError as e:
            raise SourceError(f"Redis at {self.url} refused a read ({e}); is this warmscope's database?") from None

    def frame(self, name: str, start: float | None = None, end: float | None = None) -> pd.DataFrame:
        cols = list(_TABLES[name]) if name in _TABLES else []
        lo = "-inf" if start is None else start
        hi = "+inf" if end is None else f"({end}"
        if name == "hot_keys":
            rows = []
            for member in self._call(self.r.zrangebyscore, f"{PREFIX}:hot:windows", lo, hi):
                window, tenant, layer = member.split(":", 2)
                base = f"{PREFIX}:hot:{member}"
                p = self.r.pipeline()
                p.zrange(base + ":hits", 0, -1, withscores=True)
                p.zrange(base + ":misses", 0, -1, withscores=True)
                p.hgetall(base + ":fam")
                p.hgetall(base + ":err")
                hits, misses, fam, err = self._call(p.execute)
                hits, misses = dict(hits), dict(misses)
                for kh in set(hits) | set(misses):
                    rows.append((float(window), tenant, layer, kh, fam.get(kh, ""), int(hits.get(kh, 0)),
                                 int(misses.get(kh, 0)), int(err.get(kh, 0))))
            return pd.DataFrame(rows, columns=cols)
        if name == "warmup_runs":
            ids = self._call(self.r.zrangebyscore, f"{PREFIX}:runs", lo, hi)
            p = self.r.pipeline()
            for rid in ids:
                p.hgetall(f"{PREFIX}:run:{rid}")
            recs = self._call(p.execute) if ids else []
            df = pd.DataFrame(recs, columns=cols)
            for c in ("started", "ended", "gpu_s"):
                df[c] = pd.to_numeric(df[c], errors="coerce")
            for c in ("keys", "bytes", "memory_bytes"):
                df[c] = pd.to_numeric(df[c], errors="coerce").fillna(0).astype(int)
            df["error"] = df["error"].replace("", float("nan"))
            return df
        if name in ("warmed_keys", "early_keys"):
            runs = self.frame("warmup_runs", start, end)
            suffix = "warmed" if name == "warmed_keys" else "early"
            rows = []
            for rid in runs["run_id"]:
                for kh, js in self._call(self.r.hgetall, f"{PREFIX}:run:{rid}:{suffix}").items():
                    rows.append((rid, kh, *json.loads(js)))
            return pd.DataFrame(rows, columns=cols).astype({c: float for c in cols[5:] if c != "hits"}, errors="ignore")
        raise SourceError(f"frame {name!r} does not come from Redis (it holds hot keys, A/B units and warm-up "
                          "runs); lookups and requests come from Prometheus or the embedded store")

    def units(self, experiment: str) -> pd.DataFrame:
        """A/B units summed per unit, like :meth:`collectors.store.EmbeddedStore.units`."""
        members = sorted(self._call(self.r.smembers, f"{PREFIX}:ab:{experiment}:units"))
        p = self.r.pipeline()
        for m in members:
            var, uh = m.split(":", 1)
            p.hgetall(f"{PREFIX}:ab:{experiment}:{var}:{uh}")
        hashes = self._call(p.execute) if members else []
        keys = ["experiment", "variant", "unit_hash"]
        sums = [c for c in _TABLES["ab_units"] if c not in keys]
        rows = []
        for m, h in zip(members, hashes):
            var, uh = m.split(":", 1)
            row = {"experiment": experiment, "variant": var, "unit_hash": uh}
            for c in sums:
                row[c] = float(h.get(c, 0) or 0)
            for f, v in h.items():
                if ":" in f:
                    layer, what = f.rsplit(":", 1)
                    row[f"{what}_{layer}"] = float(v)
            rows.append(row)
        df = pd.DataFrame(rows)
        if df.empty:
            return pd.DataFrame(columns=keys + sums)
        lk = [c for c in df.columns if c.startswith(("lookups_", "hits_"))]
        df[lk] = df[lk].fillna(0)
        return df
