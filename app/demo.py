"""A small demo workload through the real collectors, in virtual time.

Used by ``warmscope demo`` to fill an empty embedded store so the dashboard has
something to show. Three tenants, three cache layers, one warm-up run per
layer at start; every lookup goes through :class:`collectors.InstrumentedCache`.
"""

from __future__ import annotations

import random
from collections import OrderedDict

from collectors import InstrumentedCache, request_context
from collectors.config import CollectorConfig
from collectors.pipeline import Telemetry

__all__ = ["fill_demo"]


class _LRU(OrderedDict):
    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap

    def get(self, k, d=None):
        if k in self:
            self.move_to_end(k)
            return self[k]
        return d

    def __setitem__(self, k, v) -> None:
        super().__setitem__(k, v)
        if len(self) > self.cap:
            self.popitem(last=False)


def fill_demo(store_path: str, hours: float = 6.0, rps: float = 5.0, seed: int = 7, start: float = 1.7e9,
              progress=None) -> int:
    """Write ``hours`` of demo traffic; returns the number of requests."""
    rng = random.Random(seed)
    now = [start]
    cfg = CollectorConfig.load(env={}, store_path=store_path, replica="demo-0")
    tel = Telemetry(cfg, clock=lambda: now[0], background=False)
    layers = {name: InstrumentedCache(_LRU(cap), layer=name, telemetry=tel)
              for name, cap in (("prefix_kv", 400), ("embedding", 2000), ("response", 300))}
    tenants = ["acme", "globex", "initech"]
    for name, cache in layers.items():
        with tel.warmup("static_topk", layer=name, trigger="replica_start") as run:
            for i in range(100):
                key = f"{name}:tpl{i % 5}:{i}"
                cache[key] = 1
                run.warmed(key, nbytes=4096, gpu_s=0.01, ttl_s=3600)
    n = 0
    steps = int(hours * 60)
    for minute in range(steps):
        for _ in range(int(rps * 60)):
            now[0] = start + minute * 60 + rng.random() * 60
            t = rng.choice(tenants)
            with request_context(tenant=t, unit=f"s{rng.randrange(400)}", experiment="warmup-demo",
                                 variant=rng.choice("AB"), model="llama-3-8b",
                                 prompt_tokens=rng.choice([200, 900, 3000])):
                hits = 0
                for name, cache in layers.items():
                    i = min(int(rng.paretovariate(1.2)) * 3, 5000)
                    key = f"{name}:tpl{i % 5}:{i}"
                    if cache.get(key) is None:
                        cache[key] = 1
                    else:
                        hits += 1
                lat = 0.4 + 0.5 * (3 - hits) + rng.random() * 0.2
                tel.record_request(ttft_s=lat / 4, latency_s=lat, prompt_tokens=900, cached_tokens=300 * hits,
                                   gpu_s=0.1 * (3 - hits) + 0.05, sla_met=lat < 1.5,
                                   conversion=rng.random() < 0.1 / lat, value=3.0)
                n += 1
        tel.flush(now=start + (minute + 1) * 60)
        if progress:
            progress(minute + 1, steps)
    tel.close()
    return n
