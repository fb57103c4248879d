"""ns per instrumented lookup vs the raw lookup and a synchronous OTel counter.

    python -m bench.bench_lookup [--n 300000]

Three ways to serve the same lookups (one run, same keys):
  raw            dict.get on the cache
  warmscope      InstrumentedCache.get inside a request context with an A/B unit
                 (label tuple, per-thread counter, hot-key sketch, unit record)
  otel sync      dict.get + OTel SDK Counter.add with the same 9 attributes
Workloads: Zipf(1.1) over 100k keys (typical), and 1M distinct keys (every key
new: worst case for the hot-key sketch and the family memo).
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from bench.common import best_ns, table
from warmscope.collectors import InstrumentedCache, request_context, schema
from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.pipeline import Telemetry


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300_000)
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

        def raw():
            for k in keys:
                raw_get(k)

        def otel():
            for k in keys:
                v = raw_get(k)
                attrs[schema.ATTR.RESULT] = "hit" if v is not None else "miss"
                counter.add(1, attrs)

        with request_context(tenant="t1", unit="u1", experiment="e", variant="A", model="m",
                             prompt_tokens=900, telemetry=tel):
            get = inst.get

            def ws():
                for k in keys:
                    get(k)

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


if __name__ == "__main__":
    main()
