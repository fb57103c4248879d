"""Load test: 8 writer processes emulating inference replicas write A/B unit
records, lookups, hot keys and warm-up runs through the collectors into Redis —
one server, then a Redis Cluster (3 masters, 1 replica each), then the same
cluster with a master killed mid-run. Loopback only, bounded in count and time.

    python -m bench.bench_load [--writers 8] [--sessions 6000] [--max-s 60]

Each writer is a real collector pipeline (``Telemetry`` with ``redis_url``):
sessions (the A/B units; 5 % of them shared by all writers, as sessions that
move between replicas) of 1–3 requests with 4 lookups each over two layers,
flushed every 250 sessions (a replica's flush interval). Printed:

* sustained unit records/s and lookups/s (all writers, wall time from start
  to the last close), as a ratio to the same writers with no sink (the
  baseline measured first, in the same run);
* flush P50 / P99 (one flush: collect, hash, write to Redis);
* Redis memory per million units (``used_memory`` over all masters, after
  minus before);
* the A/B report from the moments in Redis (time), and the report from the
  unit rows for comparison;
* exactly once: requests, lookups and units in Redis against what the writers
  recorded (lost / duplicated), moments against f(unit totals) recomputed
  from the unit rows; for the failover run, the telemetry error counter and
  rows dropped.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import subprocess
import tempfile
import threading
import time
import zlib
from pathlib import Path

import numpy as np

from bench.redis_cluster import LocalCluster, free_port

EXP = "load"


def _writer(i: int, url: str | None, sessions: int, flush_every: int, max_s: float, go, out) -> None:
    from warmscope.collectors import InstrumentedCache, request_context
    from warmscope.collectors.config import CollectorConfig
    from warmscope.collectors.pipeline import Telemetry

    cfg = CollectorConfig.load(env={}, exporter="none", redis_url=url or "", key_secret="bench-secret",
                               replica=f"w{i}", side_flush_s=0, max_pending_rows=2_000_000,
                               max_buffered_units=1_000_000, close_timeout_s=60)
    tel = Telemetry(cfg, background=False)
    rng = np.random.default_rng(100 + i)
    kv = InstrumentedCache({f"kv:{k}": 1 for k in range(300)}, layer="prefix_kv", telemetry=tel)
    resp = InstrumentedCache({f"resp:{k}": 1 for k in range(100)}, layer="response", telemetry=tel)
    requests = lookups = 0
    units: list[str] = []
    flushes: list[float] = []
    go.wait()
    t0 = time.perf_counter()
    for s in range(sessions):
        unit = f"shared-{(s // 20) % 300}" if s % 20 == 0 else f"w{i}-{s}"
        units.append(unit)
        var = "AB"[zlib.crc32(unit.encode()) % 2]
        with request_context(tenant=f"t{s % 8}", unit=unit, experiment=EXP, variant=var, telemetry=tel):
            for _ in range(int(rng.integers(1, 4))):
                for _ in range(2):
                    kv.get(f"kv:{int(rng.zipf(1.3)) % 400}")
                    resp.get(f"resp:{int(rng.integers(0, 150))}")
                lookups += 4
                tel.record_request(latency_s=float(rng.gamma(2, 0.4)), ttft_s=float(rng.gamma(2, 0.05)),
                                   gpu_s=float(rng.gamma(2, 0.1)), conversion=bool(rng.random() < 0.1),
                                   value=1.0, sla_met=True)
                requests += 1
        if s % 2000 == 0:
            with tel.warmup("static_topk", layer="prefix_kv", tenant=f"t{s % 8}") as run:
                for k in range(20):
                    run.warmed(f"kv:{k}", gpu_s=0.01)
        if (s + 1) % flush_every == 0:
            t = time.perf_counter()
            tel.flush()
            flushes.append(time.perf_counter() - t)
        if time.perf_counter() - t0 > max_s:
            break
    t = time.perf_counter()
    tel.close()
    flushes.append(time.perf_counter() - t)
    agg = tel.aggregator
    out.put(dict(i=i, requests=requests, lookups=lookups, units=units, flushes=flushes,
                 wall=time.perf_counter() - t0, errors=int(agg.errors.get("redis", 0)),
                 dropped=int(sum(agg.dropped_counts().values())), pending=tel.pending_rows("redis"),
                 conflicts=getattr(tel.redis_sink, "conflicts", 0)))


def run_writers(url: str | None, n: int, sessions: int, flush_every: int, max_s: float, during=None) -> dict:
    ctx = mp.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(i, url, sessions, flush_every, max_s, go, out)) for i in range(n)]
    for p in procs:
        p.start()
    time.sleep(1.0)  # let every writer import and build its pipeline
    t0 = time.perf_counter()
    go.set()
    event = during(t0) if during else None
    res = [out.get(timeout=max_s * 6 + 120) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join(10)
    units = set()
    for r in res:
        units.update(r["units"])
    return dict(wall=wall, requests=sum(r["requests"] for r in res), lookups=sum(r["lookups"] for r in res),
                unit_records=sum(len(r["units"]) for r in res), units=len(units),
                flushes=np.concatenate([r["flushes"] for r in res]), errors=sum(r["errors"] for r in res),
                dropped=sum(r["dropped"] for r in res), pending=sum(r["pending"] for r in res),
                conflicts=sum(r["conflicts"] for r in res), event=event)


def check(url: str) -> dict:
    from warmscope.analysis.ab_report import build_report, report_for
    from warmscope.model import ab_metrics as M
    from warmscope.model.records import UNIT_HIST
    from warmscope.sources.redis_source import RedisSource

    src = RedisSource(url)
    t = time.perf_counter()
    rep = report_for(src, EXP)
    report_s = time.perf_counter() - t
    m, lm = src.moments(EXP)
    t = time.perf_counter()
    u = src.units(EXP)
    rep_u = build_report(u, EXP)
    units_s = time.perf_counter() - t
    vals = u[["first_ts", "last_ts", *M.FIELDS, *UNIT_HIST]].to_numpy(float)
    want = M.contributions(vals, np.ones(len(u))).sum(axis=0)
    got = m[list(M.COLUMNS)].sum().to_numpy()
    sel = [j for j, c in enumerate(M.COLUMNS) if c not in ("min_first", "max_last")]
    rel = float(np.max(np.abs(got[sel] - want[sel]) / np.maximum(np.abs(want[sel]), 1.0)))
    return dict(report_s=report_s, units_report_s=units_s, moment_hashes=len(m) + 0, n=int(m["n"].sum()),
                requests=int(round(m["s_requests"].sum())), lookups=int(round(lm["s_lookups"].sum())),
                unit_rows=len(u), moments_rel_err=rel, verdict_same=rep.verdict == rep_u.verdict,
                primary=rep.primary)


def week_report(url: str, units: int = 20_000) -> str:
    """The A/B report's cost at any number of units: a week-long experiment has 16 shards x 2 variants x
    672 fifteen-minute buckets of moment hashes whether it holds 20k units or 10M. ``units`` units, first
    seen uniformly over 7 days, are written straight through the sink (batches of 2,000), so every
    moment hash exists; then the report from moments is timed."""
    from warmscope.analysis.ab_report import report_for
    from warmscope.collectors.redis_sink import RedisSink
    from warmscope.model.records import UNIT_HIST
    from warmscope.sources.redis_source import RedisSource

    rng = np.random.default_rng(7)
    sink = RedisSink(None, url, 3600, None)
    t0 = 1_700_000_000.0
    nh = len(UNIT_HIST)
    t = time.perf_counter()
    for b in range(0, units, 2000):
        rows, lk = [], []
        for j in range(b, min(b + 2000, units)):
            ts = t0 + float(rng.uniform(0, 7 * 86400))
            req = int(rng.integers(1, 6))
            h = [0] * nh
            h[int(rng.integers(0, nh))] = req
            var = "AB"[j % 2]
            rows.append(("week", var, f"u{j:08x}", ts, ts + 60, req, req * 0.8, req * 0.7, req * 0.1,
                         int(rng.random() < 0.1), 1.0, req * 0.2, req, *h))
            lk.append(("week", var, f"u{j:08x}", "prefix_kv", 4 * req, int(rng.integers(0, 4 * req + 1))))
        sink.write({"ab_units": rows, "ab_lookups": lk}, batch_id=f"week-{b}")
    write_s = time.perf_counter() - t
    src = RedisSource(url)
    t = time.perf_counter()
    rep = report_for(src, "week")
    report_s = time.perf_counter() - t
    m, _ = src.moments("week")
    return (f"week-long experiment: {units:,} units written straight through the sink in {write_s:.1f} s "
            f"({units / write_s:,.0f} units/s); report from {len(m):,} moment rows (summed over 16 shards; "
            f"the same count at 10M units) in {report_s:.2f} s; units counted {int(m['n'].sum()):,}; "
            f"verdict: {rep.verdict[:60]}")


def single_redis(tmp: Path):
    port = free_port()
    p = subprocess.Popen([shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--dir", str(tmp)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.STDOUT)
    import redis

    r = redis.Redis(port=port)
    for _ in range(200):
        try:
            r.ping()
            break
        except Exception:
            time.sleep(0.05)
    return p, f"redis://127.0.0.1:{port}/0", r


def used_memory_single(r) -> int:
    return int(r.info("memory")["used_memory"])


def line(name: str, res: dict, chk: dict | None, base: dict | None, mem: float | None) -> str:
    ur = res["unit_records"] / res["wall"]
    lr = res["lookups"] / res["wall"]
    f = res["flushes"]
    s = (f"{name:<26} {res['unit_records']:>8,} unit records {ur:>8,.0f}/s ({ur / base['ur']:.2f}x)  "
         f"lookups {lr:>9,.0f}/s  flush P50 {np.percentile(f, 50) * 1e3:7.1f} ms "
         f"P99 {np.percentile(f, 99) * 1e3:7.1f} ms"
         if base else f"{name:<26} {res['unit_records']:>8,} unit records {ur:>8,.0f}/s (1.00)  lookups {lr:>9,.0f}/s")
    if mem is not None:
        s += f"  memory {mem / 2**20:7.1f} MiB per 1M units"
    if chk is not None:
        lost_r = res["requests"] - chk["requests"]
        s += (f"\n{'':<26} exactly once: requests {chk['requests']:,}/{res['requests']:,} (lost {max(lost_r, 0)}, "
              f"duplicated {max(-lost_r, 0)}), lookups {chk['lookups']:,}/{res['lookups']:,}, units "
              f"{chk['n']:,}/{res['units']:,}; moments vs unit rows max rel err {chk['moments_rel_err']:.1e}; "
              f"version conflicts re-read {res['conflicts']}"
              f"\n{'':<26} A/B report from moments {chk['report_s'] * 1e3:.0f} ms ({chk['moment_hashes']} moment "
              f"rows) vs from {chk['unit_rows']:,} unit rows {chk['units_report_s'] * 1e3:.0f} ms "
              f"({chk['units_report_s'] / chk['report_s']:.1f}x); same verdict: {chk['verdict_same']}"
              f"\n{'':<26} redis errors counted {res['errors']}, rows dropped {res['dropped']}, left pending "
              f"{res['pending']}")
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--writers", type=int, default=8, help="writer processes (emulated replicas)")
    ap.add_argument("--sessions", type=int, default=6000, help="sessions (A/B units) per writer")
    ap.add_argument("--flush-every", type=int, default=250, help="sessions between a writer's flushes")
    ap.add_argument("--max-s", type=float, default=60.0, help="time bound per writer and scenario, seconds")
    ap.add_argument("--week-units", type=int, default=20_000,
                    help="units spread over a week for the report-time check (0: skip)")
    ap.add_argument("--only", choices=["single", "cluster", "failover"], nargs="*",
                    help="run only these scenarios (default: all)")
    args = ap.parse_args()
    os.environ.pop("WARMSCOPE_REDIS_URL", None)
    tmp = Path(tempfile.mkdtemp(prefix="ws-load-"))
    print(f"{args.writers} writers x {args.sessions:,} sessions, flush every {args.flush_every}; "
          f"load before: {os.getloadavg()[0]:.1f}")
    kw = dict(n=args.writers, sessions=args.sessions, flush_every=args.flush_every, max_s=args.max_s)
    base = run_writers(None, **kw)
    base["ur"] = base["unit_records"] / base["wall"]
    print(line("baseline: no sink", base, None, None, None), flush=True)

    want = args.only or ("single", "cluster", "failover")
    for name in ("single", "cluster", "failover"):
        if name in want:
            SCENARIOS[name](base, kw, args.week_units, tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"load after: {os.getloadavg()[0]:.1f}")


def scenario_single(base: dict, kw: dict, week_units: int, tmp: Path) -> None:
    proc, url, r = single_redis(tmp)
    try:
        m0 = used_memory_single(r)
        res = run_writers(url, **kw)
        mem = (used_memory_single(r) - m0) / res["units"] * 1e6
        print(line("one Redis", res, check(url), base, mem), flush=True)
        if week_units:
            print(f"{'':<26} {week_report(url, week_units)}", flush=True)
    finally:
        proc.terminate()
        proc.wait(5)


def scenario_cluster(base: dict, kw: dict, week_units: int, tmp: Path) -> None:
    with LocalCluster(masters=3, replicas=1) as c:
        m0 = c.memory_used()
        res = run_writers(c.url, **kw)
        mem = (c.memory_used() - m0) / res["units"] * 1e6
        print(line("cluster 3 masters + 3 rep", res, check(c.url), base, mem), flush=True)
        if week_units:
            print(f"{'':<26} {week_report(c.url, week_units)}", flush=True)


def scenario_failover(base: dict, kw: dict, week_units: int, tmp: Path) -> None:
    with LocalCluster(masters=3, replicas=1) as c:
        info: dict = {}

        def kill_later(t0: float) -> dict:
            def go() -> None:
                time.sleep(max(2.0, base["wall"] * 0.3))
                info["killed"] = c.kill_master_of("ws:{ab:load:0}")
                t = time.perf_counter()
                info["new_master"] = c.wait_failover("ws:{ab:load:0}", timeout=120)
                info["failover_s"] = time.perf_counter() - t

            info["thread"] = threading.Thread(target=go, daemon=True)
            info["thread"].start()
            return info

        res = run_writers(c.url, during=kill_later, **kw)
        info["thread"].join(60)
        print(line("cluster, a master killed", res, check(c.live_url), base, None)
              + f"\n{'':<26} master :{info.get('killed')} SIGKILLed mid-run; its replica :{info.get('new_master')} "
              f"took over its slots after {info.get('failover_s', float('nan')):.1f} s", flush=True)


SCENARIOS = {"single": scenario_single, "cluster": scenario_cluster, "failover": scenario_failover}


if __name__ == "__main__":
    main()
