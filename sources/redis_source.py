"""Redis source: hot keys, A/B unit records, A/B moments and warm-up runs
written by the collectors' Redis sink (layout in :mod:`collectors.redis_sink`),
read back into the canonical frames. One Redis or a Redis Cluster (detected
from the server: any node's address will do).

Example::

    src = RedisSource("redis://redis:6379/0")
    m, lm = src.moments("warmup-strategy")        # same frames as EmbeddedStore.moments
    units = src.units("warmup-strategy")          # same columns as EmbeddedStore.units
    hot = src.frame("hot_keys", start=t0, end=t1)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from warmscope.collectors import redis_sink as _rs
from warmscope.collectors.redis_sink import AB_SHARDS, PREFIX, ab_tag, dec, hot_tag, key, run_tag
from warmscope.collectors.store import _TABLES
from warmscope.model import ab_metrics as _m
from warmscope.sources.base import SourceError

__all__ = ["RedisSource"]


class RedisSource:
    label = "Redis"

    def __init__(self, url: str, client: Any = None) -> None:
        self.url = url
        self._given = client
        self._r: Any = None

    @property
    def r(self) -> Any:
        """The client (a ``RedisCluster`` when the server is a cluster node); connects at first
        use."""
        if self._r is None:
            kw = dict(socket_timeout=5, socket_connect_timeout=3, decode_responses=True)
            self._r = self._call(
                _rs.connect,
                self.url if self._given is None else None,
                self._given,
                **({} if self._given is not None else kw),
            )
        return self._r

    def experiments(self) -> list[str]:
        """Experiment names with A/B records."""
        return sorted(_s(x) for x in self._call(self.r.smembers, f"{PREFIX}:ab:experiments"))

    def _hgetall(self, names: list[str]) -> list[dict[str, Any]]:
        out: list[dict[Any, Any]] = []
        for i in range(0, len(names), 5000):
            p = self.r.pipeline(transaction=False)
            for n in names[i : i + 5000]:
                p.hgetall(n)
            out += self._call(p.execute)
        return [{_s(k): _s(v) for k, v in h.items()} for h in out]

    def _smembers(self, names: list[str]) -> list[set[str]]:
        p = self.r.pipeline(transaction=False)
        for n in names:
            p.smembers(n)
        return [{_s(x) for x in m} for m in self._call(p.execute)]

    def describe(self) -> str:
        return f"Redis · {self.url}"

    def _call(self, fn: Callable[..., Any], *a: Any, **kw: Any) -> Any:
        import redis

        try:
            return fn(*a, **kw)
        except redis.exceptions.ConnectionError:
            raise SourceError(
                f"Redis at {self.url} is unreachable; start it or set WARMSCOPE_REDIS_URL to the "
                "right address"
            ) from None
        except redis.exceptions.TimeoutError:
            raise SourceError(f"Redis at {self.url} did not answer in time") from None
        except redis.exceptions.RedisClusterException as e:
            raise SourceError(f"Redis Cluster at {self.url} is not usable ({e})") from None
        except redis.exceptions.ResponseError as e:
            raise SourceError(
                f"Redis at {self.url} refused a read ({e}); is this warmscope's database?"
            ) from None

    def frame(
        self, name: str, start: float | None = None, end: float | None = None
    ) -> pd.DataFrame:
        cols = list(_TABLES[name]) if name in _TABLES else []
        lo = "-inf" if start is None else start
        hi = "+inf" if end is None else f"({end}"
        if name == "hot_keys":
            rows = []
            members = [
                _s(m).split(":", 2)
                for m in self._call(self.r.zrangebyscore, f"{PREFIX}:hot:windows", lo, hi)
            ]
            p = self.r.pipeline(transaction=False)
            for window, tenant, layer in members:
                base = key(hot_tag(float(window), dec(tenant)), layer)
                p.zrange(base + ":hits", 0, -1, withscores=True)
                p.zrange(base + ":misses", 0, -1, withscores=True)
                p.hgetall(base + ":fam")
                p.hgetall(base + ":err")
            got = self._call(p.execute) if members else []
            for j, (window, tenant, layer) in enumerate(members):
                hits, misses, fam, err = got[4 * j : 4 * j + 4]
                hits = {_s(k): v for k, v in hits}
                misses = {_s(k): v for k, v in misses}
                fam = {_s(k): _s(v) for k, v in fam.items()}
                err = {_s(k): v for k, v in err.items()}
                for kh in set(hits) | set(misses):
                    rows.append(
                        (
                            float(window),
                            dec(tenant),
                            dec(layer),
                            kh,
                            fam.get(kh, ""),
                            int(hits.get(kh, 0)),
                            int(misses.get(kh, 0)),
                            int(err.get(kh, 0)),
                        )
                    )
            return pd.DataFrame(rows, columns=cols)
        if name == "warmup_runs":
            ids = [_s(x) for x in self._call(self.r.zrangebyscore, f"{PREFIX}:runs", lo, hi)]
            recs = [h for h in self._hgetall([key(run_tag(rid)) for rid in ids]) if h]
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
            ids = list(runs["run_id"])
            for rid, h in zip(
                ids, self._hgetall([key(run_tag(rid), suffix) for rid in ids]), strict=True
            ):
                for kh, js in h.items():
                    rows.append((rid, kh, *json.loads(js)))
            return pd.DataFrame(rows, columns=cols).astype(
                {c: float for c in cols[5:] if c != "hits"}, errors="ignore"
            )
        raise SourceError(
            f"frame {name!r} does not come from Redis (it holds hot keys, A/B units and warm-up "
            "runs); lookups and requests come from Prometheus or the embedded store"
        )

    def _unit_names(self, experiment: str) -> list[tuple[str, str, str]]:
        tags = [ab_tag(experiment, s) for s in range(AB_SHARDS)]
        out = []
        for tag, members in zip(
            tags, self._smembers([key(tag, "units") for tag in tags]), strict=True
        ):
            for m in sorted(members):
                var, uh = m.split(":", 1)
                out.append((dec(var), uh, key(tag, "u", var, uh)))
        return out

    def units(self, experiment: str) -> pd.DataFrame:
        """A/B units summed per unit, like :meth:`collectors.store.EmbeddedStore.units`."""
        names = self._unit_names(experiment)
        hashes = self._hgetall([n for _, _, n in names])
        keys = ["experiment", "variant", "unit_hash"]
        sums = [c for c in _TABLES["ab_units"] if c not in keys]
        rows = []
        for (var, uh, _), h in zip(names, hashes, strict=True):
            row: dict[str, Any] = {"experiment": experiment, "variant": var, "unit_hash": uh}
            for c in sums:
                row[c] = float(h.get(c, 0) or 0)
            for f, v in h.items():
                if ":" in f:
                    layer, what = f.rsplit(":", 1)
                    row[f"{what}_{dec(layer)}"] = float(v)
            rows.append(row)
        df = pd.DataFrame(rows)
        if df.empty:
            return pd.DataFrame(columns=keys + sums)
        lk = [c for c in df.columns if c.startswith(("lookups_", "hits_"))]
        df[lk] = df[lk].fillna(0)
        return df

    def _moment_names(self, experiment: str) -> list[tuple[str, float, str]]:
        tags = [ab_tag(experiment, s) for s in range(AB_SHARDS)]
        names = []
        for tag, members in zip(
            tags, self._smembers([key(tag, "mi") for tag in tags]), strict=True
        ):
            for m in members:
                var, b = m.split(":", 1)
                names.append((dec(var), float(b), key(tag, "m", var, b)))
        return names

    def moments(self, experiment: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(``ab_moments``, ``ab_layer_moments``) of one experiment, summed over
        the shards, sorted by bucket — the frames of
        :meth:`collectors.store.EmbeddedStore.moments`."""
        names = self._moment_names(experiment)
        cols = list(_m.COLUMNS)
        idx = {c: j for j, c in enumerate(cols)}
        rows, keys, lrows = [], [], []
        for (var, b, _), h in zip(names, self._hgetall([n for _, _, n in names]), strict=True):
            if not h:
                continue
            v = np.zeros(len(cols))
            v[idx["min_first"]], v[idx["max_last"]] = np.inf, -np.inf
            for f, x in h.items():
                j = idx.get(f)
                if j is not None:
                    v[j] = float(x)
                elif f.startswith("L:"):
                    _, ly, c = f.split(":", 2)
                    lrows.append((var, b, dec(ly), c, float(x)))
            rows.append(v)
            keys.append((var, b))
        m = pd.concat(
            [
                pd.DataFrame(keys, columns=["variant", "bucket"]),
                pd.DataFrame(np.array(rows).reshape(-1, len(cols)), columns=cols),
            ],
            axis=1,
        )
        if len(m):  # the shards' hashes of one (variant, bucket) add up; the extrema combine
            g = m.groupby(["variant", "bucket"])
            s = g[cols].sum()
            s["min_first"], s["max_last"] = g["min_first"].min(), g["max_last"].max()
            m = s.reset_index()
        m = m[m["n"] > 0] if len(m) else m
        lcols = ["variant", "bucket", "layer"] + list(_m.LAYER_COLUMNS)
        if lrows:
            lm = (
                pd.DataFrame(lrows, columns=["variant", "bucket", "layer", "col", "v"])
                .pivot_table(
                    index=["variant", "bucket", "layer"],
                    columns="col",
                    values="v",
                    aggfunc="sum",
                    fill_value=0.0,
                )
                .reindex(columns=list(_m.LAYER_COLUMNS), fill_value=0.0)
                .reset_index()
            )
            lm.columns.name = None
        else:
            lm = pd.DataFrame(columns=lcols)
        return (
            m.sort_values(["bucket", "variant"]).reset_index(drop=True),
            lm[lcols].sort_values(["bucket", "variant", "layer"]).reset_index(drop=True),
        )

    def request_totals(self, experiment: str) -> dict[str, float]:
        """Requests per variant. Redis holds no request metrics: these are the
        requests in the experiment's unit records (pass the metric source's
        totals to the report where it has them)."""
        names = self._moment_names(experiment)
        p = self.r.pipeline(transaction=False)
        for _, _, n in names:
            p.hget(n, "s_requests")
        out: dict[str, float] = {}
        for (var, _, _), x in zip(names, self._call(p.execute) if names else [], strict=True):
            out[var] = out.get(var, 0.0) + float(x or 0)
        return out


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else x
