"""A/B report time from the moments Redis keeps, at 10 million units.

    python -m bench.bench_ab_moments [--units 10000000] [--days 7] [--cluster] [--real-units 3000]

Writing 10M units through the collectors takes hours on one machine, so this
loads the moments instead: unit totals are drawn in numpy, chunk by chunk
(memory stays bounded), each unit's moment contributions are computed with the
project's encoding (:func:`model.ab_metrics.contributions` and
``layer_contributions``, the functions the sinks use), summed per (shard,
variant, 15-minute bucket) — a unit's shard drawn uniformly, as the crc32 of
its hash is — and written as the hashes the Redis sink keeps
(``ws:{ab:<exp>:<shard>}:m:<variant>:<bucket>`` plus the shard indexes). What
is real: a redis-server (and with ``--cluster`` a 3-master Redis Cluster)
holding the moment hashes of 10M units, and the report read from it the way
the dashboard reads it. What is not: the writers' throughput at 10M units
(see ``bench_load``).

The same report built from the in-memory sums (no Redis) is the check: the
Redis round trip must give the same units, verdict and table. With
``--real-units N`` (default 3,000) N units are first written through a real
collector pipeline to the same Redis, and that experiment's report is timed
from its unit rows (the dashboard's path before it read moments) and from its
moments.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np
import pandas as pd
from warmscope.analysis.ab_report import build_report, build_report_from_moments, report_for
from warmscope.collectors.redis_sink import AB_SHARDS, PREFIX, _bucket_s, ab_tag, connect, enc, key
from warmscope.model import ab_metrics as M
from warmscope.model.schema import DURATION_BUCKETS
from warmscope.sources import from_env
from warmscope.sources.redis_source import RedisSource

EXPERIMENT = "bench-10m"
VARIANTS = ("A", "B")
LAYERS = ("prefix_kv", "response")


def _units(rng: np.random.Generator, n: int, t0: float, days: float) -> dict[str, Any]:
    """``n`` synthetic units: per-request draws summed per unit (B is a little faster and hits more)."""
    var = rng.integers(0, 2, n)
    shard = rng.integers(0, AB_SHARDS, n)
    first = t0 + rng.random(n) * days * 86400
    req = 1 + rng.poisson(1.1, n)
    uid = np.repeat(np.arange(n), req)
    vb = var[uid]
    lat = rng.gamma(2.0, 0.6 - 0.03 * vb)
    ttft = rng.gamma(2.0, 0.05, len(uid))
    gpu = rng.gamma(2.0, 0.1, len(uid))
    conv = rng.random(len(uid)) < 0.2 + 0.004 * vb
    sla = ttft <= 0.25

    def per_unit(x: np.ndarray) -> np.ndarray:
        return np.bincount(uid, weights=x.astype(float), minlength=n)

    fields = {"requests": req.astype(float), "latency_sum": per_unit(lat), "latency_sq": per_unit(lat * lat),
              "ttft_sum": per_unit(ttft), "conversions": per_unit(conv), "value": per_unit(3.0 * conv),
              "gpu_s": per_unit(gpu), "sla_met": per_unit(sla)}
    hb = np.searchsorted(np.asarray(DURATION_BUCKETS), lat, side="left")
    hist = np.bincount(uid * M.NB + hb, minlength=n * M.NB).reshape(n, M.NB).astype(float)
    last = first + rng.random(n) * 1800
    vals = np.column_stack([first, last] + [fields[f] for f in M.FIELDS] + [hist])
    layers = {}
    for i, ly in enumerate(LAYERS):
        lk = (req * rng.poisson(3.0 if i == 0 else 1.0, n)).astype(float)
        hits = rng.binomial(lk.astype(np.int64), 0.55 + 0.03 * var - 0.2 * i).astype(float)
        layers[ly] = (lk, hits)
    return {"var": var, "shard": shard, "vals": vals, "layers": layers}


def moment_sums(n_units: int, days: float, chunk: int, seed: int = 7,
                t0: float = 1_767_000_000.0) -> tuple[dict[tuple[int, int, float], np.ndarray],
                                                       dict[tuple[int, int, float, str], np.ndarray]]:
    """(per (shard, variant, bucket) moment rows, per (shard, variant, bucket, layer) layer rows) of
    ``n_units`` units, ``chunk`` units at a time."""
    rng = np.random.default_rng(seed)
    nb = int(np.ceil(days * 86400 / M.BUCKET_S)) + 1
    b0 = float(np.floor(t0 / M.BUCKET_S) * M.BUCKET_S)
    groups = AB_SHARDS * len(VARIANTS) * nb
    ncol = len(M.COLUMNS)
    acc = np.zeros((groups, ncol))
    acc[:, 2], acc[:, 3] = np.inf, -np.inf
    lacc = {ly: np.zeros((groups, len(M.LAYER_COLUMNS))) for ly in LAYERS}
    done = 0
    while done < n_units:
        m = min(chunk, n_units - done)
        u = _units(rng, m, t0, days)
        vals = u["vals"]
        bucket = M.bucket_of(vals[:, 0])
        g = (u["shard"] * len(VARIANTS) + u["var"]) * nb + ((bucket - b0) / M.BUCKET_S).astype(np.int64)
        c = M.contributions(vals, np.ones(m))
        for j in range(ncol):
            if j == 2:
                np.minimum.at(acc[:, 2], g, vals[:, 0])
            elif j == 3:
                np.maximum.at(acc[:, 3], g, vals[:, 1])
            else:
                acc[:, j] += np.bincount(g, weights=c[:, j], minlength=groups)
        for ly, (lk, hits) in u["layers"].items():
            lc = M.layer_contributions(lk, hits, (lk > 0).astype(float))
            for j in range(lc.shape[1]):
                lacc[ly][:, j] += np.bincount(g, weights=lc[:, j], minlength=groups)
        done += m
    out: dict[tuple[int, int, float], np.ndarray] = {}
    lout: dict[tuple[int, int, float, str], np.ndarray] = {}
    for gi in np.flatnonzero(acc[:, 0] > 0):
        s, rest = divmod(int(gi), len(VARIANTS) * nb)
        v, bi = divmod(rest, nb)
        out[(s, v, b0 + bi * M.BUCKET_S)] = acc[gi]
        for ly in LAYERS:
            if lacc[ly][gi, 0] > 0:
                lout[(s, v, b0 + bi * M.BUCKET_S, ly)] = lacc[ly][gi]
    return out, lout


def load(client: Any, experiment: str, mom: dict[tuple[int, int, float], np.ndarray],
         lmom: dict[tuple[int, int, float, str], np.ndarray]) -> int:
    """Write the moment hashes and indexes as the Redis sink lays them out; returns the hash count."""
    fields: dict[str, dict[str, str]] = {}
    index: dict[str, set[str]] = {}
    for (s, v, b), row in mom.items():
        tag = ab_tag(experiment, s)
        var = enc(VARIANTS[v])
        name = key(tag, "m", var, _bucket_s(b))
        fields[name] = {c: repr(float(x)) for c, x in zip(M.COLUMNS, row.tolist(), strict=True) if x}
        index.setdefault(key(tag, "mi"), set()).add(f"{var}:{_bucket_s(b)}")
    for (s, v, b, ly), row in lmom.items():
        name = key(ab_tag(experiment, s), "m", enc(VARIANTS[v]), _bucket_s(b))
        fields[name].update({f"L:{enc(ly)}:{c}": repr(float(x))
                             for c, x in zip(M.LAYER_COLUMNS, row.tolist(), strict=True) if x})
    names = list(fields)
    for i in range(0, len(names), 500):
        p = client.pipeline(transaction=False)
        for n in names[i:i + 500]:
            p.hset(n, mapping=fields[n])
        p.execute()
    p = client.pipeline(transaction=False)
    for k, members in index.items():
        p.sadd(k, *members)
    p.execute()
    client.sadd(f"{PREFIX}:ab:experiments", experiment)
    return len(names)


def frames(mom: dict[tuple[int, int, float], np.ndarray],
           lmom: dict[tuple[int, int, float, str], np.ndarray]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The same sums as ``moments()`` frames, without Redis (the check)."""
    cols = list(M.COLUMNS)
    m = pd.DataFrame([(VARIANTS[v], b, *row) for (_, v, b), row in mom.items()], columns=["variant", "bucket"] + cols)
    g = m.groupby(["variant", "bucket"])
    s = g[cols].sum()
    s["min_first"], s["max_last"] = g["min_first"].min(), g["max_last"].max()
    lcols = list(M.LAYER_COLUMNS)
    lm = pd.DataFrame([(VARIANTS[v], b, ly, *row) for (_, v, b, ly), row in lmom.items()],
                      columns=["variant", "bucket", "layer"] + lcols)
    lm = lm.groupby(["variant", "bucket", "layer"])[lcols].sum().reset_index()
    return (s.reset_index().sort_values(["bucket", "variant"]).reset_index(drop=True),
            lm.sort_values(["bucket", "variant", "layer"]).reset_index(drop=True))


def _memory(client: Any) -> int:
    from warmscope.collectors.redis_sink import is_cluster

    if is_cluster(client):
        info = client.info("memory", target_nodes=client.PRIMARIES)
        return sum(int(v["used_memory"]) for v in info.values())
    return int(client.info("memory")["used_memory"])


def _real_units(url: str, n: int, tmp: str) -> None:
    """``n`` units through a real collector pipeline to Redis (experiment ``bench-real``)."""
    from warmscope.collectors import InstrumentedCache, request_context
    from warmscope.collectors.config import CollectorConfig
    from warmscope.collectors.pipeline import Telemetry

    cfg = CollectorConfig.load(env={}, redis_url=url, store_path=os.path.join(tmp, "s.sqlite"),
                               key_secret="bench", exporter="embedded", side_flush_s=0)
    tel = Telemetry(cfg, background=False)
    rng = np.random.default_rng(3)
    kv = InstrumentedCache({f"k:{i}": 1 for i in range(50)}, layer="prefix_kv", telemetry=tel)
    t = 1_767_000_000.0
    for u in range(n):
        var = "AB"[u % 2]
        with request_context(tenant="t1", unit=f"s{u}", experiment="bench-real", variant=var, telemetry=tel):
            for _ in range(int(rng.integers(1, 4))):
                for _ in range(3):
                    kv.get(f"k:{int(rng.integers(0, 70 if var == 'A' else 60))}")
                tel.record_request(latency_s=float(rng.gamma(2.0, 0.3)), ttft_s=float(rng.gamma(2.0, 0.05)),
                                   gpu_s=0.1, conversion=bool(rng.random() < 0.2), value=3.0, sla_met=True)
        if u % 500 == 499:
            tel.flush(now=t + u)
    tel.flush(now=t + n)
    tel.close()


def _timed(fn: Any, repeat: int = 3) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def run(url: str, label: str, args: argparse.Namespace, mom: Any, lmom: Any, check: Any) -> None:
    client = connect(url)
    before = _memory(client)
    t = time.perf_counter()
    hashes = load(client, EXPERIMENT, mom, lmom)
    load_s = time.perf_counter() - t
    mem = _memory(client) - before
    src = RedisSource(url)
    t_m, (m, lm) = _timed(lambda: src.moments(EXPERIMENT))
    t_r, rep = _timed(lambda: report_for(src, EXPERIMENT, "A", "B"))
    app = from_env({"WARMSCOPE_REDIS_URL": url}, store_path=os.path.join(args.tmp, "absent.sqlite"))
    t_a, rep_a = _timed(lambda: report_for(app, EXPERIMENT, "A", "B"))
    same = (rep.units == check.units and rep.verdict == check.verdict
            and np.allclose(rep.table().select_dtypes("number").to_numpy(dtype=float),
                            check.table().select_dtypes("number").to_numpy(dtype=float), rtol=1e-9, equal_nan=True))
    print(f"{label}: {hashes:,} moment hashes ({len(m):,} variant x bucket rows, {len(lm):,} layer rows) for "
          f"{sum(rep.units.values()):,} units; loaded in {load_s:.1f} s; {mem / 2**20:.1f} MiB of Redis memory",
          flush=True)
    print(f"  moments() {t_m:.2f} s; report_for(RedisSource) {t_r:.2f} s; the dashboard's path (from_env) "
          f"{t_a:.2f} s (best of 3); same report as the in-memory sums: {same and rep_a.units == rep.units}",
          flush=True)
    if args.real_units:
        _real_units(url, args.real_units, args.tmp)
        t_u, rep_u = _timed(lambda: build_report(src.units("bench-real"), "bench-real", "A", "B"))
        t_v, rep_v = _timed(lambda: report_for(app, "bench-real", "A", "B"))
        print(f"  {sum(rep_v.units.values()):,} units written by a collector pipeline: report from unit rows "
              f"{t_u:.2f} s, from moments (dashboard's path) {t_v:.2f} s ({t_u / t_v:.1f}x); "
              f"same units: {rep_u.units == rep_v.units}", flush=True)
    client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description="A/B report time from Redis moments at 10M units (moments bulk-loaded).")
    ap.add_argument("--units", type=int, default=10_000_000, help="synthetic units in the experiment")
    ap.add_argument("--days", type=float, default=7.0, help="days over which the units' first records spread")
    ap.add_argument("--chunk", type=int, default=500_000, help="units drawn at a time (bounds memory)")
    ap.add_argument("--cluster", action="store_true", help="also load a local 3-master Redis Cluster")
    ap.add_argument("--real-units", type=int, default=3000,
                    help="units written through a real pipeline for the unit-rows vs moments timing (0: skip)")
    args = ap.parse_args()
    import tempfile
    from pathlib import Path

    from bench.bench_load import single_redis
    from bench.redis_cluster import LocalCluster

    args.tmp = tempfile.mkdtemp(prefix="ws-bench-ab-")
    print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    t = time.perf_counter()
    mom, lmom = moment_sums(args.units, args.days, args.chunk)
    print(f"moments of {args.units:,} units computed in {time.perf_counter() - t:.1f} s "
          f"({len(mom):,} shard x variant x bucket rows)", flush=True)
    m, lm = frames(mom, lmom)
    t_c, check = _timed(lambda: build_report_from_moments(m, lm, EXPERIMENT, "A", "B"), 1)
    print(f"report from the in-memory sums (no Redis): {t_c:.2f} s; units {check.units}; verdict: {check.verdict}",
          flush=True)
    proc, url, r = single_redis(Path(args.tmp))
    try:
        run(url, "one redis-server", args, mom, lmom, check)
    finally:
        r.close()
        proc.terminate()
        proc.wait(10)
    if args.cluster:
        with LocalCluster(masters=3) as c:
            run(c.url, "Redis Cluster, 3 masters", args, mom, lmom, check)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
