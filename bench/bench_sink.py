"""How many new A/B units per second one process writes into Redis, against a bare pipelined
HINCRBY loop measured in the same run.

    python -m bench.bench_sink [--units 40000] [--repeat 3] [--no-cluster] [--sustained 20000 --seconds 20]

Three cases per target (a local redis-server, then a 3-master Redis Cluster started like the
tests start it), each on an emptied database, repeated and interleaved, best kept:

* ``bare HINCRBY``: one ``HINCRBY ws:bench:u:<i> requests 1`` per unit, pipelined 1,000 at a time
  (one command per unit, nothing computed: the floor of any sink that writes a unit);
* ``sink``: :class:`collectors.redis_sink.RedisSink` writing prebuilt rows in the pipeline's chunks
  (each unit: its request row and one layer's lookups, exactly once, with its A/B moments);
* ``pipeline flush``: the same units recorded through a :class:`collectors.pipeline.Telemetry`
  (one cache lookup and one request each), then one flush timed: taking the buffers, hashing the
  unit ids, chunking, and the sink.

Each case prints units per second of wall clock (the ratio to the bare loop is the figure to compare
across machines: on a loaded machine every case slows down) and units per CPU-second of this process,
all its threads (what one process sustains when it has a core to itself; Redis runs in its own
processes). Every sink run is checked: as many unit hashes as units and ``requests`` summing to the units.
With ``--sustained RATE``, threads create RATE new units per second for ``--seconds`` into a
pipeline with its background flusher, then close it; the run prints units created, delivered
(unit hashes with their request and lookup fields), counted as dropped, and unaccounted for (the
last must be 0).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.bench_load import single_redis
from bench.redis_cluster import ClusterUnavailable, LocalCluster


def _flush_all(client: Any) -> None:
    from redis.cluster import RedisCluster

    if isinstance(client, RedisCluster):
        client.flushall(target_nodes=RedisCluster.PRIMARIES)
    else:
        client.flushall()


def bare(client: Any, n: int) -> tuple[float, float]:
    """(wall, CPU) seconds for n pipelined HINCRBY, 1,000 per round trip."""
    t, c = time.perf_counter(), time.process_time()
    for b in range(0, n, 1000):
        p = client.pipeline(transaction=False)
        for i in range(b, min(b + 1000, n)):
            p.hincrby(f"ws:bench:u:{i}", "requests", 1)
        p.execute()
    return time.perf_counter() - t, time.process_time() - c


def _rows(n: int, seed: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    from warmscope.model.records import UNIT_HIST

    units, lookups = [], []
    t0 = 1_767_000_000.0
    for i in range(n):
        h = [0] * len(UNIT_HIST)
        h[i % len(UNIT_HIST)] = 1
        uh = f"{seed:04x}{i:012x}"
        var = "AB"[i % 2]
        lat = 0.05 + (i % 97) * 0.001
        units.append(("bench", var, uh, t0 + i * 1e-3, t0 + i * 1e-3, 1, lat, lat * lat, 0.01, 0, 0.0,
                      0.0, 1, *h))
        lookups.append(("bench", var, uh, "prefix_kv", 1, i % 2))
    return units, lookups


def sink_write(url: str, n: int, seed: int) -> tuple[float, float]:
    """(wall, CPU) seconds for the sink to write n new units (request row + one layer each) in the pipeline's
    chunks."""
    from warmscope.collectors.pipeline import _CHUNK_ROWS
    from warmscope.collectors.redis_sink import RedisSink

    units, lookups = _rows(n, seed)
    sink = RedisSink(None, url, 3600, None)
    sink.write({"hot_keys": []})  # connect (and learn a cluster's map) before the clock starts
    per = max(1, _CHUNK_ROWS // 2)
    t, c = time.perf_counter(), time.process_time()
    for b in range(0, n, per):
        sink.write({"ab_units": units[b:b + per], "ab_lookups": lookups[b:b + per]}, batch_id=f"s{seed}-{b}")
    dt = time.perf_counter() - t, time.process_time() - c
    sink.close()
    return dt


def pipeline_flush(url: str, n: int, seed: int) -> tuple[float, float]:
    """(wall, CPU) seconds for one flush of a pipeline holding n new units (one lookup, one request each)."""
    from warmscope.collectors import InstrumentedCache, request_context
    from warmscope.collectors.config import CollectorConfig
    from warmscope.collectors.pipeline import Telemetry

    cfg = CollectorConfig.load(env={}, exporter="none", redis_url=url, key_secret="bench", replica="bench",
                               max_buffered_units=2 * n + 1, max_pending_rows=2 * n + 1)
    tel = Telemetry(cfg, background=False)
    tel.redis_sink.write({"hot_keys": []})
    cache = InstrumentedCache({}, layer="prefix_kv", telemetry=tel)
    for i in range(n):
        with request_context(tenant="t", unit=f"{seed}-{i}", experiment="bench", variant="AB"[i % 2],
                             telemetry=tel):
            cache.get("k")
            tel.record_request(latency_s=0.05, ttft_s=0.01)
    t, c = time.perf_counter(), time.process_time()
    tel.flush()
    dt = time.perf_counter() - t, time.process_time() - c
    left, dropped = tel.pending_rows("redis"), tel.aggregator.dropped_counts()
    tel.close()
    if left or dropped:
        raise SystemExit(f"pipeline flush left {left} rows pending, dropped {dropped}")
    return dt


def check(client: Any, n: int) -> None:
    names = list(client.scan_iter(match="ws:{ab:bench:*}:u:*", count=10_000))
    if len(names) != n:
        raise SystemExit(f"{len(names)} unit hashes for {n} units")
    p = client.pipeline(transaction=False)
    for k in names:
        p.hget(k, "requests")
    total = sum(int(x) for x in p.execute())
    if total != n:
        raise SystemExit(f"requests sum to {total} for {n} units")


def compare(name: str, url: str, client: Any, n: int, repeat: int) -> dict[str, float]:
    cases = ("bare HINCRBY", "sink", "pipeline flush")
    wall = dict.fromkeys(cases, float("inf"))
    cpu = dict.fromkeys(cases, float("inf"))
    for r in range(repeat):
        for case in cases:
            _flush_all(client)
            if case == "bare HINCRBY":
                w, c = bare(client, n)
            elif case == "sink":
                w, c = sink_write(url, n, r)
                check(client, n)
            else:
                w, c = pipeline_flush(url, n, r)
                check(client, n)
            wall[case], cpu[case] = min(wall[case], w), min(cpu[case], c)
    rate = {c: n / s for c, s in wall.items()}
    base = rate["bare HINCRBY"]
    print(f"\n{name}: {n:,} new units, best of {repeat} (wall clock; CPU: this process's, all its threads)")
    for c in cases:
        print(f"  {c:<16} {rate[c]:>9,.0f} units/s  {rate[c] / base:5.2f} x bare HINCRBY   "
              f"{n / cpu[c]:>9,.0f} units per CPU-second  {cpu[c] / n * 1e6:5.1f} us CPU per unit")
    return rate


def sustained(url: str, client: Any, rate: float, seconds: float, threads: int = 8) -> None:
    from warmscope.collectors import InstrumentedCache, request_context
    from warmscope.collectors.config import CollectorConfig
    from warmscope.collectors.pipeline import Telemetry

    _flush_all(client)
    cfg = CollectorConfig.load(env={}, exporter="none", redis_url=url, key_secret="bench", replica="bench")
    tel = Telemetry(cfg, background=True)
    cache = InstrumentedCache({}, layer="prefix_kv", telemetry=tel)
    made = [0] * threads

    def work(i: int) -> None:
        per, t0, k = rate / threads, time.monotonic(), 0
        while (el := time.monotonic() - t0) < seconds:
            while k < int(el * per):
                with request_context(tenant="t", unit=f"{i}-{k}", experiment="bench", variant="AB"[k % 2],
                                     telemetry=tel):
                    cache.get("k")
                    tel.record_request(latency_s=0.05, ttft_s=0.01)
                k += 1
            time.sleep(0.002)
        made[i] = k

    t0, c0 = time.monotonic(), time.process_time()
    ths = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    t1 = time.monotonic()
    tel.close()
    t2, cpu = time.monotonic(), time.process_time() - c0
    created = sum(made)
    req = lk = 0
    for k in client.scan_iter(match="ws:{ab:bench:*}:u:*", count=10_000):
        a, b = client.hmget(k, "requests", "prefix_kv:lookups")
        req += a is not None
        lk += b is not None
    dropped = tel.aggregator.dropped_counts()
    counted = sum(dropped.values())
    print(f"\nsustained: {created:,} new units in {t1 - t0:.1f} s ({created / (t1 - t0):,.0f}/s, {threads} threads), "
          f"close {t2 - t1:.1f} s; this process used {cpu:.1f} s of CPU ({cpu / (t2 - t0):.2f} cores)")
    print(f"  records (a request row and a lookup row per unit): created {2 * created:,}, delivered "
          f"{req + lk:,} (request rows {req:,}, lookup rows {lk:,}), counted as dropped {counted:,} {dropped}, "
          f"unaccounted {2 * created - req - lk - counted:,}, units half-written {abs(req - lk):,}")
    print(f"  units delivered per CPU-second of this process (recording them included): {req / cpu:,.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, default=40_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-cluster", action="store_true")
    ap.add_argument("--sustained", type=float, default=0.0, help="new units per second (0: skip)")
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    os.environ.pop("WARMSCOPE_REDIS_URL", None)
    print(f"load before: {os.getloadavg()[0]:.1f}")
    tmp = Path(tempfile.mkdtemp(prefix="ws-sink-"))
    proc, url, client = single_redis(tmp)
    try:
        compare("local redis-server", url, client, args.units, args.repeat)
        if args.sustained:
            sustained(url, client, args.sustained, args.seconds)
    finally:
        client.close()
        proc.terminate()
        proc.wait(10)
    if not args.no_cluster:
        from redis.cluster import RedisCluster

        try:
            cluster = LocalCluster(masters=3)
        except ClusterUnavailable as e:
            print(f"\nRedis Cluster skipped: {e}")
        else:
            try:
                cc = RedisCluster.from_url(cluster.url)
                compare("Redis Cluster, 3 masters", cluster.url, cc, args.units, args.repeat)
                if args.sustained:
                    sustained(cluster.url, cc, args.sustained, args.seconds)
                cc.close()
            finally:
                cluster.stop()
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nload after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
