"""ns per instrumented lookup vs the raw lookup and a synchronous OTel counter.

    python -m bench.bench_lookup [--n 300000]

Three ways to serve the same lookups (one run, same keys):
  raw            dict.get on the cache
  warmscope      InstrumentedCache.get inside a request context with an A/B unit
                 (label tuple, per-thread counter, hot-key sketch, unit record)
  otel sync      dict.get + OTel SDK Counter.add with the same 9 attributes
Workloads: Zipf(1.1) over 100k keys (typical), and 1M distinct keys (every key
new: worst case for the hot-key sketch and the family memo).

Tail latency under load (``--threads``, default 4): each thread serves requests
with a new A/B unit each, timing every lookup; P99, P99.9 and the maximum per
lookup while the pipeline flushes every second to the embedded store, against
the same load with a pipeline that never flushes (the baseline: what the
interpreter itself costs, GIL hand-offs and collections included).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from warmscope.collectors import InstrumentedCache, request_context
from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.pipeline import Telemetry
from warmscope.model import schema

from bench.common import best_ns, table


def tail_latency(tmp: str, flushing: bool, threads: int, per_thread: int) -> dict[str, float]:
    """Per-lookup latency percentiles (µs) with ``threads`` host threads."""
    cfg = CollectorConfig.load(env={}, store_path=f"{tmp}/tail-{int(flushing)}.sqlite", key_secret="b",
                               flush_interval_s=1.0, side_flush_s=1.0)
    tel = Telemetry(cfg, background=flushing)
    cache = InstrumentedCache({f"k{i}": 1 for i in range(0, 1000, 2)}, layer="response", telemetry=tel)
    lat: list[int] = []

    def work(j: int) -> None:
        mine = []
        pc = time.perf_counter_ns
        get = cache.get
        for i in range(per_thread):
            with request_context(tenant="t", unit=f"u{j}-{i}", experiment="e", variant="AB"[i % 2], telemetry=tel):
                t0 = pc()
                get(f"k{i % 1000}")
                mine.append(pc() - t0)
                tel.record_request(latency_s=0.1, gpu_s=0.01)
        lat.extend(mine)

    ts = [threading.Thread(target=work, args=(j,)) for j in range(threads)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    tel.close()
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] / 1000  # noqa: E731
    return {"p99": q(0.99), "p99.9": q(0.999), "max": lat[-1] / 1000}


def _get_loop(keys: list[str], get: Callable[[str], Any]) -> Callable[[], None]:
    """The timed loop: ``get`` each key once."""
    def run() -> None:
        for k in keys:
            get(k)

    return run


def _otel_loop(keys: list[str], raw_get: Callable[[str], Any], attrs: dict[str, str],
               counter: Any) -> Callable[[], None]:
    """The same loop counting each lookup with an OpenTelemetry counter, as hand-written instrumentation would."""
    def run() -> None:
        for k in keys:
            v = raw_get(k)
            attrs[schema.ATTR.RESULT] = "hit" if v is not None else "miss"
            counter.add(1, attrs)

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300_000)
    ap.add_argument("--threads", type=int, default=4, help="host threads for the tail-latency run")
    ap.add_argument("--tail-n", type=int, default=50_000, help="lookups per thread in the tail-latency run")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    tel = Telemetry(CollectorConfig.load(env={}, store_path=f"{tmp}/b.sqlite", key_secret="b"), background=False)
    rng = np.random.default_rng(1)
    workloads = {
        "zipf 100k keys": [f"chat:prefix:{int(k)}" for k in (rng.zipf(1.1, args.n) % 100_000)],
        "1M distinct keys": [f"chat:prefix:{i}" for i in range(args.n)],
    }
    meter = MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("bench")
    counter = meter.create_counter(schema.CACHE_LOOKUPS.name)
    for name, keys in workloads.items():
        backend = {k: 1 for k in keys[::2]}
        raw_get = backend.get
        inst = InstrumentedCache(backend, layer="prefix_kv", telemetry=tel)
        attrs = {a: "x" for a in schema.LOOKUP_LABELS}

        raw = _get_loop(keys, raw_get)
        otel = _otel_loop(keys, raw_get, attrs, counter)
        with request_context(tenant="t1", unit="u1", experiment="e", variant="A", model="m",
                             prompt_tokens=900, telemetry=tel):
            ws = _get_loop(keys, inst.get)
            rows = [("raw dict.get", best_ns(raw, len(keys))),
                    ("warmscope", best_ns(ws, len(keys))),
                    ("otel sync counter.add", best_ns(otel, len(keys), repeat=2))]
        added = rows[1][1] - rows[0][1]
        print(f"\n== {name} ({len(keys):,} lookups)")
        print(table(rows, "raw dict.get"))
        print(f"added by warmscope: {added:.0f} ns/lookup (target <= 1000); "
              f"otel sync / warmscope added = {(rows[2][1] - rows[0][1]) / added:.1f}x")
        tel.flush(settle=True)
    tel.close()
    base = tail_latency(tmp, False, args.threads, args.tail_n)
    load = tail_latency(tmp, True, args.threads, args.tail_n)
    print(f"\n== tail latency per lookup, {args.threads} threads x {args.tail_n:,} lookups, one A/B unit per request")
    print(f"{'case':<34} {'P99 µs':>9} {'P99.9 µs':>10} {'max µs':>11}")
    for name, r in (("no flushing (baseline)", base), ("flushing every 1 s to the store", load)):
        print(f"{name:<34} {r['p99']:>9.1f} {r['p99.9']:>10.1f} {r['max']:>11.0f}")
    print(f"flushing / baseline: P99 {load['p99'] / base['p99']:.2f}x, P99.9 {load['p99.9'] / base['p99.9']:.2f}x, "
          f"max {load['max'] / base['max']:.2f}x")


if __name__ == "__main__":
    main()
