"""The discrete-event engine: replicas, pools, the request path, warm-ups, faults.

Two pools of ``replicas`` replicas serve the same traffic: pool A runs
``strategy_a``, pool B ``strategy_b`` (and a third pool C ``strategy_c`` when
set: an A/B/n experiment); a session (the A/B unit) is routed to
its variant's pool by a stable hash, then to a replica by session. Each replica
is its own :class:`collectors.Telemetry` (replica label = its name) writing to
one embedded store, exactly as separate serving processes would.

Request path (every lookup goes through the collectors' wrappers):

1. ``weights`` — the model must be loaded on the replica; before that the
   request waits (cold start) and the lookup is a miss.
2. ``response`` — cacheable templates look the prompt up in the pool's response
   cache (in-process LRU with TTL, or Redis); a hit answers at once.
3. ``lora`` — the tenant's adapter in the replica's LRU of GPU slots.
4. ``embedding`` — RAG templates embed three chunks (cached per replica).
5. ``prefix_kv`` — the prompt's token blocks, walked in order: blocks until the
   first miss are reused (partial prefix hit), the rest are prefilled.

TTFT = weights wait + queueing (``slots`` concurrent sequences) + adapter load +
embedding + prefill of uncached tokens + overhead; latency adds decoding;
GPU-seconds count prefill, embedding and the request's share of decoding;
conversion probability falls exponentially with latency.

Time advances in ticks of ``tick_s``; the replicas' pipelines are flushed with
the virtual timestamp at each tick end, so frames have tick resolution.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import time
import zlib
from bisect import bisect
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from warmscope.collectors import InstrumentedCache, request_context
from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.pipeline import Telemetry, flush_together
from warmscope.collectors.store import EmbeddedStore

from .caches import LRU
from .config import SimConfig
from .faults import Fault
from .strategies import (
    Choice,
    Decayed,
    HeatTracker,
    KeyStats,
    choose,
    lora_chances,
    yesterday_log,
)
from .traffic import (
    CHUNKS_PER_QUERY,
    TEMPLATES,
    Arrivals,
    Template,
    Tenant,
    draw_arrivals,
    make_tenants,
    rate_at,
    tenant_weights,
)

if TYPE_CHECKING:
    from warmscope.collectors.warmup import WarmupRun

__all__ = ["Simulation", "Summary", "block_trace_file"]

TOKENISATION_VARIANTS = 50
MAX_CONTEXT = 8192  # a conversation longer than this starts over (context window)
INSERT_TAU_S = 600.0  # memory of the caches' store rates (Replica.residence)
PRE_START_S = (
    120.0  # replicas start this long (plus the weights' load time) before the simulated day
)


@dataclass
class Summary:
    requests: int = 0
    lookups: Counter[tuple[str, str, str]] = field(
        default_factory=Counter
    )  # (replica, layer, result) -> n
    warmups: int = 0
    units: dict[str, int] = field(default_factory=dict)  # variant -> distinct sessions
    wall_s: float = 0.0
    kv_missed: int = 0  # prefix-KV missed tokens (prompt - cached) of requests that walked it
    miss_classes: Counter[str] = field(
        default_factory=Counter
    )  # class -> those tokens (ground truth)

    @property
    def rps(self) -> float:
        return self.requests / self.wall_s if self.wall_s else 0.0


def write_run_info(
    store: EmbeddedStore, cfg: SimConfig, t0: float, truth: list[dict[str, object]]
) -> None:
    store.write_faults(truth)
    store.set_meta(
        "simulation",
        json.dumps(
            {
                "seed": cfg.seed,
                "hours": cfg.hours,
                "start": t0,
                "strategy_a": cfg.strategy_a,
                "strategy_b": cfg.strategy_b,
                "strategy_c": cfg.strategy_c,
                "experiment": cfg.experiment,
                "tick_s": cfg.tick_s,
            },
            sort_keys=True,
        ),
    )


class _RedisResponseCache:
    """Response cache on Redis (wrapped by InstrumentedCache like the LRU)."""

    def __init__(self, client: Any, ttl: float) -> None:
        self.r = client
        self.ttl = int(ttl)

    def get(self, key: str, default: Any = None) -> Any:
        v = self.r.get(key)
        return default if v is None else v

    def set(self, key: str, value: Any, ttl: float | None = None) -> None:
        self.r.set(key, value, ex=int(ttl or self.ttl))

    def valid_for(self, key: str) -> float:
        ms = self.r.pttl(key)  # -2: absent, -1: no expiry
        return 0.0 if ms == -2 else float("inf") if ms == -1 else ms / 1000.0


class Replica:
    def __init__(self, sim: Simulation, name: str, pool: Pool, start_rel: float) -> None:
        self.sim = sim
        self.name = name
        self.pool = pool
        cfg = sim.cfg
        self.tel = sim._telemetry(name)
        clock = sim.clock
        self.weights = InstrumentedCache(LRU(100, clock), "weights", telemetry=self.tel)
        self.lora = InstrumentedCache(LRU(cfg.lora_slots, clock), "lora", telemetry=self.tel)
        self.emb = InstrumentedCache(
            LRU(cfg.embedding_capacity, clock), "embedding", telemetry=self.tel
        )
        self.kv_lru = LRU(
            cfg.for_variant(pool.variant, "kv_capacity_tokens"), clock, weigh=lambda tokens: tokens
        )
        self.kv = InstrumentedCache(self.kv_lru, "prefix_kv", telemetry=self.tel)
        self.resp = pool.response_view(self)
        self.slots = [0.0] * cfg.slots
        self.weights_ready: dict[str, float] = {}
        # What the replica's own caches store per second (prefix-KV: tokens; embeddings: entries),
        # so the predictive strategy knows how long an entry nobody reads survives the LRU.
        self.inserted = {"prefix_kv": 0.0, "embedding": 0.0}
        self.insert_rate = {"prefix_kv": 0.0, "embedding": 0.0}
        self.start(start_rel, "replica_start")

    def start(
        self, t_rel: float, trigger: str, warm_until: float | None = None, gated: bool = True
    ) -> None:
        """(Re)start: caches dropped, weights load, then the pool's layered
        warm-up. A gated replica takes traffic only when ready (readiness
        probe: weights loaded and the start's warm-up finished); an ungated one
        (the warm-up-out-of-step trap) takes it at once and meets cold caches."""
        self._clear()
        ready = t_rel + self.sim.cfg.weights_load_s
        for model in self.sim.models:
            self.weights_ready[model] = ready
        self.ready_at = ready if gated else t_rel
        self.gated = gated
        self.sim.schedule(ready, self._weights_loaded)
        self.sim.schedule(
            ready, lambda: self.sim.warmup(self.pool, [self], trigger, finish_at=warm_until)
        )

    def residence(self, layer: str) -> float:
        """Seconds an entry nobody reads stays in this replica's ``layer`` cache (the pool's for
        responses): the capacity over what is stored per second (an LRU's characteristic time;
        an upper bound, as hits also move entries ahead), and at most the response TTL;
        ``inf`` before anything was stored."""
        if layer == "response":
            pool = self.pool
            cap, rate = pool.resp_lru.cap, pool.insert_rate
            ttl = pool.resp_ttl if pool.resp_ttl > 0 else math.inf
            return min(ttl, cap / rate if rate > 0 else math.inf)
        cap = self.kv_lru.cap if layer == "prefix_kv" else float(self.sim.cfg.embedding_capacity)
        rate = self.insert_rate.get(layer, 0.0)
        return cap / rate if rate > 0 else math.inf

    def valid_for(self, layer: str, key: str) -> float:
        """Seconds this replica's cache (the pool's for responses) keeps ``key`` valid: a warm-up
        that lands on caches in use need not warm what they hold (at a surge instance's cut-over
        they are emptied: :meth:`Pool.valid_for`)."""
        if layer == "response":
            return self.pool.valid_for(layer, key)
        return (self.kv_lru if layer == "prefix_kv" else self.emb.backend).valid_for(key)

    def _clear(self) -> None:
        for c in (self.weights, self.lora, self.emb, self.kv):
            c.backend.clear()

    def roll(self, t_rel: float) -> None:
        """Rolling restart with a surge instance: the new instance loads its
        weights and runs the pool's warm-up while the old one keeps serving;
        at cut-over (when the new one is ready) the replica's caches become
        the new instance's — what the warm-up put there, nothing else."""
        cutover = t_rel + self.sim.cfg.weights_load_s
        self.sim.schedule(
            cutover, lambda: self.sim.warmup(self.pool, [self], "replica_restart", cutover=True)
        )

    def cut_over(self) -> None:
        self._clear()
        self._weights_loaded()
        if self.sim.block_trace is not None:  # the replica's prefix cache starts empty
            self.sim.block_trace.restart(self.pool.variant, self.sim.now, self.name)

    def _weights_loaded(self) -> None:
        for model in self.sim.models:
            self.weights.set(f"weights:{model}", 1)


class Pool:
    def __init__(self, sim: Simulation, variant: str, strategy: str) -> None:
        self.sim = sim
        self.variant = variant
        self.strategy = strategy
        self.replicas: list[Replica] = []
        cfg = sim.cfg
        self.heat = HeatTracker(cfg.heat_lambda) if strategy == "predictive" else None
        self.resp_ttl = cfg.for_variant(variant, "response_ttl_s")
        self.resp_lru = LRU(
            cfg.for_variant(variant, "response_capacity"), sim.clock, ttl=self.resp_ttl
        )
        self.kv_hist: list[
            tuple[int, int]
        ] = []  # per tick (hits, lookups) of prefix_kv, for drop triggers
        # Ground truth of "stored before" for prefix-KV blocks (see Simulation._miss_classes): the
        # system-prompt and warmed blocks ever stored on a replica of the pool (bounded by
        # templates x tenants x blocks x variants, and by warm-up picks); conversation blocks
        # are counted per session.
        self.kv_seen: set[str] = set()
        self.last_drop_trigger = -1e18
        self._resp_backend: Any = self.resp_lru
        self.inserted = 0.0  # response entries stored (see Replica.residence)
        self.insert_rate = 0.0

    def valid_for(self, layer: str, key: str) -> float:
        """Seconds the pool's response cache keeps ``key`` valid (a warm-up runner's ``PTTL``); the
        replicas' own caches are asked nothing (a warm-up that lands at cut-over finds them
        empty)."""
        return float(self._resp_backend.valid_for(key)) if layer == "response" else 0.0

    def response_view(self, rep: Replica) -> Any:
        backend: Any = self.resp_lru
        if self.sim.redis_url:
            import redis

            db = "ABC".index(self.variant) + 1  # pools never share entries
            backend = _RedisResponseCache(
                redis.Redis.from_url(self.sim.redis_url, db=db), self.resp_ttl
            )
            self._resp_backend = backend
        return InstrumentedCache(backend, "response", telemetry=rep.tel)


class Simulation:
    def __init__(
        self,
        cfg: SimConfig,
        store: str | Path | EmbeddedStore,
        faults: list[Fault] | tuple[Fault, ...] = (),
        collector_config: CollectorConfig | None = None,
        redis_url: str | None = None,
        meter_provider: Any = None,
        progress: Callable[[int, int], None] | None = None,
        realtime: bool = False,
        speed: float = 1.0,
        variants: tuple[str, ...] | None = None,
        first_run_seq: int = 0,
        block_trace: str | Path | None = None,
    ) -> None:
        self.cfg = cfg
        # The prefix-KV block trace of each pool (its replicas as engines), written at the end
        # of run() to ``<block_trace stem>-<variant>.jsonl`` for the what-if replay.
        self.block_trace_path = block_trace
        self.block_trace: BlockTraceRecorder | None = (
            BlockTraceRecorder(cfg.block_tokens) if block_trace is not None else None
        )
        variants = variants or cfg.arms
        self.variants = variants  # a worker process may simulate one pool (see run_parallel)
        self.faults = list(faults)
        self.redis_url = redis_url
        self.progress = progress
        self.realtime = realtime
        self.speed = speed
        # Simulated data can be regenerated from the seed: no fsync.
        # (Or anything with the store's write(): a worker's queue to the one writer, see
        # run.simulate.)
        self.store = (
            EmbeddedStore(store, durable=False) if isinstance(store, (str, Path)) else store
        )
        # Hot keys and unit records every 15 virtual minutes: per-minute points,
        # fewer upserts (a session spans many ticks).
        self.ccfg = collector_config or CollectorConfig.load(
            env={}, key_secret="warmscope-sim", max_families=1024, side_flush_s=900
        )
        self.meter_provider = meter_provider
        self._own_provider = None
        if meter_provider is None and self.ccfg.exporter in ("otlp", "prometheus"):
            from warmscope.collectors.otel import build_provider

            # One provider (one scrape endpoint) for all simulated replicas.
            self.meter_provider, server = build_provider(self.ccfg)
            self._own_provider = (self.meter_provider, server)
        self.now = cfg.start
        self.t0 = cfg.start if not realtime else time.time()
        if realtime:
            self.now = self.t0
        self.clock = lambda: self.now
        self.rng = np.random.default_rng(cfg.seed)
        self.tenants = make_tenants(cfg, self.rng)
        self.by_name = {t.name: t for t in self.tenants}
        self.models = sorted({t.model for t in self.tenants})
        self._weights_key = {m: f"weights:{m}" for m in self.models}  # cache keys, built once
        self._lora_key = {t.name: f"lora:adapter:{t.name}.v1" for t in self.tenants}
        self.tw = tenant_weights(len(self.tenants))
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self._run_seq = first_run_seq  # warm-up run ids count on from here (two pools in one store)
        self.telemetries: list[Telemetry] = []
        self.summary = Summary()
        # (tenant, template) -> recent sessions, each [session id, conversation tokens, variant]
        self.sessions: dict[tuple[int, int], list[list[Any]]] = defaultdict(list)
        self._next_session = 0
        self._req_id = 0
        self._sess: list[Any] = [0, 0, "", 0]  # the session being served (see _arrivals)
        self._sys_blocks: dict[tuple[int, int, str], list[tuple[str, int, bool]]] = {}
        self._units: dict[str, set[int]] = {v: set() for v in variants}
        self.yesterday: KeyStats = yesterday_log(cfg, self.tenants)
        self.bursts = self._bursts()
        strategies = cfg.strategies
        self.pools = {v: Pool(self, v, strategies[v]) for v in variants}
        # Replicas start before the simulated day so that they are ready (weights loaded, start-up
        # warm-up done) when traffic begins: a load balancer sends nothing to a replica that is not.
        for pool in self.pools.values():
            for i in range(cfg.replicas):
                name = f"{pool.variant.lower()}-{i}"
                pool.replicas.append(Replica(self, name, pool, -PRE_START_S - cfg.weights_load_s))
        if cfg.peak_warmup_at_h >= 0:
            for pool in self.pools.values():
                self.schedule(
                    cfg.peak_warmup_at_h * 3600,
                    partial(self.warmup, pool, pool.replicas, "forecast_peak"),
                )
        if cfg.restart_every_h > 0:
            self._schedule_restarts()
        for f in self.faults:
            self._schedule_fault(f)

    # ------------------------------------------------------------ plumbing
    def _telemetry(self, replica: str) -> Telemetry:
        cfg = CollectorConfig._from_raw({**self.ccfg.as_dict(), "replica": replica})
        tel = Telemetry(
            cfg,
            clock=self.clock,
            store=self.store,
            meter_provider=self.meter_provider,
            background=False,
        )
        self.telemetries.append(tel)
        return tel

    def schedule(self, t_rel: float, fn: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t_rel, self._seq, fn))

    def _run_events(self, t_rel: float) -> None:
        ev = self._events
        while ev and ev[0][0] <= t_rel:
            at, _, fn = heapq.heappop(ev)
            saved = self.now
            self.now = self.t0 + at
            fn()
            self.now = max(saved, self.now)

    def _bursts(self) -> list[tuple[float, float]]:
        rng = np.random.default_rng(self.cfg.seed + 99)
        n = rng.poisson(self.cfg.bursts_per_day * self.cfg.hours / 24)
        starts = np.sort(rng.random(n)) * self.cfg.hours * 3600
        return [(float(s), float(s) + self.cfg.burst_minutes * 60) for s in starts]

    def _schedule_restarts(self) -> None:
        """Rolling restarts: replica i restarts every ``restart_every_h`` hours,
        offset by i/n of the period so a pool never restarts all at once;
        replica i of every pool restarts at the same moment (a fair A/B)."""
        period = self.cfg.restart_every_h * 3600
        n = self.cfg.replicas
        for pool in self.pools.values():
            for i, rep in enumerate(pool.replicas):
                t = period * (i + 1) / n
                while t < self.cfg.hours * 3600:
                    self.schedule(t, partial(rep.roll, t))
                    t += period

    def _route(self, pool: Pool, sid: int, tr: float) -> tuple[Replica, float]:
        """The session's replica if it is ready, else the next ready one in the
        pool (readiness gate); if none is, the one ready first and the wait."""
        reps = pool.replicas
        n = len(reps)
        home = sid % n
        for j in range(n):
            rep = reps[(home + j) % n]
            if rep.ready_at <= tr:
                return rep, 0.0
        rep = min(reps, key=lambda r: r.ready_at)
        return rep, rep.ready_at - tr

    def _schedule_fault(self, f: Fault) -> None:
        if f.trap == "warmup_out_of_step":
            for pool in self.pools.values():
                for rep in pool.replicas:
                    if f.matches(replica=rep.name):
                        self.schedule(
                            f.start,
                            partial(
                                rep.start, f.start, "replica_restart", warm_until=f.end, gated=False
                            ),
                        )
        elif f.trap == "warmup_timing":
            for pool in self.pools.values():
                reps = [r for r in pool.replicas if f.matches(replica=r.name)]
                if reps:
                    ttl = float(f.params.get("ttl_s", 300))
                    self.schedule(
                        f.start,
                        partial(
                            self.warmup,
                            pool,
                            reps,
                            "scheduled",
                            ttl=ttl,
                            layers=(f.scope["layer"],) if "layer" in f.scope else None,
                            strategy="static_topk" if pool.strategy == "none" else None,
                        ),
                    )

    def ground_truth(self) -> list[dict[str, object]]:
        return [f.ground_truth(self.t0, self.cfg.hours) for f in self.faults]

    # -------------------------------------------------------------- warm-up
    LAYER_ORDER = ("lora", "prefix_kv", "embedding", "response")  # after the weights, in this order

    def warmup(
        self,
        pool: Pool,
        replicas: list[Replica],
        trigger: str,
        finish_at: float | None = None,
        ttl: float | None = None,
        layers: tuple[str, ...] | None = None,
        strategy: str | None = None,
        cutover: bool = False,
    ) -> None:
        """Layered warm-up: weights are loaded (the replica's start), then LoRA
        adapters, prefix-KV blocks, embeddings and responses, one layer after
        the other, each its own run. A replica (re)start's warm-up holds the
        readiness gate until its last layer is done. ``cutover``: a surge
        instance warms in the background; every layer lands when the last one
        is done, on caches emptied at that moment (:meth:`Replica.roll`)."""
        strategy = strategy or pool.strategy
        t_rel = self.now - self.t0
        cfg = self.cfg
        lora = self._lora_picks(strategy, pool) if strategy != "none" else []
        shared: list[Choice] | None = None
        for rep in replicas:
            if strategy == "none":
                picks: list[Choice] = []
            elif strategy == "predictive":  # a forecast per replica (its own sessions' history)
                picks = lora + choose(
                    strategy,
                    cfg,
                    t_rel,
                    self.yesterday,
                    pool.heat,
                    self.by_name,
                    replica=rep.name,
                    valid_for=pool.valid_for if cutover else rep.valid_for,
                    residence=rep.residence,
                )
            else:
                if shared is None:
                    shared = lora + choose(
                        strategy, cfg, t_rel, self.yesterday, pool.heat, self.by_name
                    )
                picks = shared
            if layers:
                picks = [p for p in picks if p[0] in layers]
            if not picks:
                if cutover:
                    rep.cut_over()
                continue
            by_layer = {ly: [p for p in picks if p[0] == ly] for ly in self.LAYER_ORDER}
            by_layer = {ly: ps for ly, ps in by_layer.items() if ps}
            durations = {
                ly: len(ps) * (cfg.lora_load_s if ly == "lora" else cfg.warm_s_per_key)
                for ly, ps in by_layer.items()
            }
            total = sum(durations.values())
            # A forced finish (warm-up out of step) stretches the layers to end there.
            stretch = (
                max((finish_at - t_rel) / total, 1.0)
                if finish_at is not None and total > 0
                else 1.0
            )
            t = t_rel
            if cutover:
                self.schedule(
                    t_rel + total, rep.cut_over
                )  # before any layer lands (events keep their order)
            for layer, ps in by_layer.items():
                end = t + durations[layer] * stretch
                self.schedule(
                    t,
                    partial(
                        self._start_layer,
                        rep,
                        layer,
                        ps,
                        t_rel + total if cutover else end,
                        trigger,
                        strategy,
                        ttl,
                    ),
                )
                t = end
            # A (re)start's warm-up holds the readiness gate; a rolling restart's surge instance
            # warms in the background while the old instance keeps serving (it takes over at
            # cut-over).
            if (
                trigger in ("replica_start", "replica_restart")
                and getattr(rep, "gated", True)
                and not cutover
            ):
                rep.ready_at = max(rep.ready_at, t)

    def _lora_picks(self, strategy: str, pool: Pool) -> list[Choice]:
        """The adapters of the tenants most likely to be served next, up to the
        replica's LoRA slots: predictive, the tenants whose adapter is likely to be
        read before the LRU evicts it (at least ``warm_min_prob`` under the tenants'
        recent request shares, :func:`strategies.lora_chances`), most likely first;
        other strategies (and predictive before any traffic), yesterday's requests."""
        score: dict[str, float] = defaultdict(float)
        if strategy == "predictive" and pool.heat is not None and pool.heat.tenant_recent:
            chance = lora_chances(self.cfg, pool.heat.tenant_recent)
            score.update({t: p for t, p in chance.items() if p >= self.cfg.warm_min_prob})
        else:
            for key, c in self.yesterday.counts["prefix_kv"].items():
                score[self.yesterday.meta[key][0]] += c
        top = sorted(score, key=lambda t: (-score[t], t))[: self.cfg.lora_slots]
        if strategy == "predictive":
            top.reverse()  # the likeliest adapter written last: the LRU evicts it last
        return [("lora", f"lora:adapter:{t}.v1", t, 0, 0.2 * self.cfg.lora_load_s) for t in top]

    def _start_layer(
        self,
        rep: Replica,
        layer: str,
        picks: list[Choice],
        end: float,
        trigger: str,
        strategy: str,
        ttl: float | None,
    ) -> None:
        self._run_seq += 1
        # run ids carry the pool: each pool's worker process numbers its own runs
        run = rep.tel.warmup(
            strategy,
            layer=layer,
            trigger=trigger,
            run_id=f"run-{self.cfg.seed}-{rep.pool.variant.lower()}{self._run_seq:05d}",
        )
        run.__enter__()
        self.summary.warmups += 1
        self.schedule(end, lambda: self._finish_warmup(rep, {layer: run}, picks, ttl))

    def _finish_warmup(
        self, rep: Replica, runs: dict[str, WarmupRun], picks: list[Choice], ttl: float | None
    ) -> None:
        for layer, key, tenant, _tpl, gpu_s in picks:
            if layer == "lora":
                rep.lora.set(key, 1)
                nbytes = 64 * 1024 * 1024  # a LoRA adapter, order of magnitude
            elif layer == "prefix_kv":
                rep.kv.set(key, self.cfg.block_tokens)
                rep.pool.kv_seen.add(key)
                nbytes = (
                    self.cfg.block_tokens * 128 * 1024
                )  # KV bytes per token, order of magnitude
            elif layer == "embedding":
                rep.emb.set(key, 1)
                nbytes = 4096
            else:
                rep.resp.set(key, b"r", ttl=ttl)
                nbytes = 2048
            runs[layer].warmed(
                key,
                nbytes=nbytes,
                gpu_s=gpu_s,
                tenant=tenant,
                ttl_s=ttl or (rep.pool.resp_ttl if layer == "response" else None),
            )
        for run in runs.values():
            run.__exit__(None, None, None)

    # -------------------------------------------------------------- running
    def run(self, finish: bool = True) -> Summary:
        """Simulate; with ``finish`` also write ground truth and run metadata."""
        cfg = self.cfg
        wall0 = time.perf_counter()
        ticks = int(math.ceil(cfg.hours * 3600 / cfg.tick_s))
        for tick in range(ticks):
            t_rel = tick * cfg.tick_s
            dt = min(cfg.tick_s, cfg.hours * 3600 - t_rel)
            rate = rate_at(cfg, t_rel + dt / 2, self.bursts)
            # One conversion per tick: per-request reads of Python lists, not numpy scalars
            # (the same float64 values, so the same arithmetic).
            a = _as_lists(draw_arrivals(self.rng, cfg, t_rel, dt, rate, self.tw))
            active = [
                f
                for f in self.faults
                if f.start < t_rel + dt
                and f.end > t_rel
                and f.trap not in ("warmup_out_of_step", "warmup_timing")
            ]
            kv_before = self._kv_counts()
            self._arrivals(a, active)
            self._run_events(t_rel + dt)
            self.now = self.t0 + t_rel + dt
            self._tick_end(kv_before)
            for pool in self.pools.values():
                for rep in pool.replicas:
                    rep.tel.record_gpu_memory(rep.kv_lru.used / rep.kv_lru.cap)
            flush_together(self.telemetries, now=self.now)
            if self.progress:
                self.progress(tick + 1, ticks)
            if self.realtime:
                wait = (t_rel + dt) / self.speed - (time.perf_counter() - wall0)
                if wait > 0:
                    time.sleep(wait)
        for tel in self.telemetries:
            tel.close()
        if self.block_trace is not None and self.block_trace_path is not None:
            self.block_trace.write(self.block_trace_path)
        if self._own_provider is not None:
            from warmscope.collectors.otel import stop_server

            provider, server = self._own_provider
            provider.shutdown()
            if server is not None:
                stop_server(server)
        if finish:
            self.finish()
        self.summary.wall_s = time.perf_counter() - wall0
        self.summary.units = {v: len(s) for v, s in self._units.items() if v in self.pools}
        return self.summary

    def finish(self) -> None:
        write_run_info(self.store, self.cfg, self.t0, self.ground_truth())

    def _kv_counts(self) -> dict[str, tuple[int, int]]:
        out = {}
        for v, pool in self.pools.items():
            h = m = 0
            for rep in pool.replicas:
                h += self.summary.lookups[(rep.name, "prefix_kv", "hit")]
                m += self.summary.lookups[(rep.name, "prefix_kv", "miss")]
            out[v] = (h, m)
        return out

    def _tick_end(self, before: dict[str, tuple[int, int]]) -> None:
        """Hit-rate-drop trigger: a tick far below the last half hour warms the pool."""
        after = self._kv_counts()
        t_rel = self.now - self.t0
        for v, pool in self.pools.items():
            h = after[v][0] - before[v][0]
            n = h + after[v][1] - before[v][1]
            hist = pool.kv_hist
            hist.append((h, n))
            window = hist[-31:-1]
            base_n = sum(x[1] for x in window)
            if n >= 100 and base_n >= 1000 and t_rel - pool.last_drop_trigger > 3600:
                base = sum(x[0] for x in window) / base_n
                if h / n < 0.6 * base:
                    pool.last_drop_trigger = t_rel
                    self.warmup(pool, pool.replicas, "hit_rate_drop")
            if pool.heat is not None:
                self._insert_rates(pool)
                pool.heat.cluster_recent = Decayed(
                    {k: c * 0.95 for k, c in pool.heat.cluster_recent.items()}
                )
                pool.heat.tenant_recent = Decayed(
                    {k: c * 0.95 for k, c in pool.heat.tenant_recent.items()}
                )

    def _insert_rates(self, pool: Pool) -> None:
        """Each cache's store rate, an average over about the last ``INSERT_TAU_S`` seconds."""
        dt = self.cfg.tick_s
        a = -math.expm1(-dt / INSERT_TAU_S)
        pool.insert_rate += a * (pool.inserted / dt - pool.insert_rate)
        pool.inserted = 0.0
        for rep in pool.replicas:
            for layer, n in rep.inserted.items():
                rep.insert_rate[layer] += a * (n / dt - rep.insert_rate[layer])
                rep.inserted[layer] = 0.0

    # ------------------------------------------------------- one request
    def _arrivals(self, a: Arrivals, faults: Any) -> None:
        """A tick's arrivals, in order. Every worker draws all traffic and keeps every session's
        bookkeeping (which sessions exist, their variant: the same in every process); only the
        requests of sessions of a pool this process simulates are served (:meth:`_serve`). The
        bookkeeping is written out here, in one loop, because most arrivals are another pool's
        (two in three with three pools): they cost only this. Continue one of the recent sessions
        of the (tenant, template) or start a new one; a conversation's length advances only where
        its pool is served (no other worker reads it)."""
        events, pools, tenants, sessions = self._events, self.pools, self.tenants, self.sessions
        arms, t0 = len(self.cfg.arms), self.t0
        # traffic.variant_of, written out: the CRC-32 of "<experiment>:" carried on over the id
        crc_base = zlib.crc32(f"{self.cfg.experiment}:".encode())
        a_t, a_tenant, a_u_tpl = a.t, a.tenant, a.u_tpl
        a_u_session, a_u_pick = a.u_session, a.u_pick
        req_id = self._req_id
        for i in range(len(a_t)):
            tr = a_t[i]
            req_id += 1  # counts every arrival (a request's id in its prompt's query blocks)
            if events and events[0][0] <= tr:
                self.now = t0 + tr
                self._run_events(tr)
            ten = tenants[a_tenant[i]]
            # traffic.pick_template, written out (it runs for every arrival of every pool)
            tpl_idx = ten.templates[min(bisect(ten.cum, a_u_tpl[i]), len(ten.templates) - 1)]
            tpl = TEMPLATES[tpl_idx]
            sess_list = sessions[(ten.idx, tpl_idx)]
            if sess_list and a_u_session[i] < (0.7 if tpl.dialog else 0.3):
                sess = sess_list[int(a_u_pick[i] * len(sess_list))]
            else:
                sid = self._next_session
                # the variant, hashed once; the last slot counts the conversation's blocks stored
                # (ground truth)
                sess = [sid, 0, "ABCDEFGH"[zlib.crc32(str(sid).encode(), crc_base) % arms], 0]
                self._next_session = sid + 1
                sess_list.append(sess)
                if len(sess_list) > 200:
                    sess_list.pop(0)
            if sess[2] in pools:
                self.now = t0 + tr
                self._req_id = req_id
                self._serve(a, i, tr, faults, ten, tpl, tpl_idx, sess)
        self._req_id = req_id

    def _serve(
        self,
        a: Arrivals,
        i: int,
        tr: float,
        faults: Any,
        ten: Tenant,
        tpl: Template,
        tpl_idx: int,
        sess: list[Any],
    ) -> None:
        """One request of session ``sess`` (:meth:`_arrivals`): its tokens, then the caches in
        serving order — weights, response, LoRA, embeddings, the prefix-KV walk — then the record.
        ``faults``: those active at some time of the tick."""
        cfg = self.cfg
        self._sess = sess
        sid, variant = sess[0], sess[2]
        lo, hi = tpl.query_tokens
        q = lo + int(a.query_tokens_u[i] * (hi - lo))
        conv = sess[1] if tpl.dialog else 0
        prompt = tpl.sys_tokens + conv + q
        out_tokens = max(1, int(tpl.out_tokens * a.out_mult[i]))
        if tpl.dialog:
            sess[1] = conv + q + out_tokens if conv + q + out_tokens < MAX_CONTEXT else 0
        pool = self.pools[variant]
        self._units[variant].add(sid)
        rep, gate_wait = self._route(pool, sid, tr)
        fx: Any = ()
        bypass: tuple[str, ...] = ()
        if faults:
            fx = [
                f
                for f in faults
                if f.active(tr)
                and f.matches(tenant=ten.name, replica=rep.name, template=tpl.name, model=ten.model)
            ]
            bypass = tuple(f.scope.get("layer", "*") for f in fx if f.trap == "bypass")
        if pool.heat is not None:
            pool.heat.cluster_recent[tpl.cluster] += 1
            pool.heat.tenant_recent[ten.name] += 1
        with request_context(
            tenant=ten.name,
            unit=str(sid),
            experiment=cfg.experiment,
            variant=variant,
            model=ten.model,
            prompt_tokens=prompt,
            telemetry=rep.tel,
        ):
            wait = self._weights(rep, ten, tr, gate_wait)
            rkey = None
            if tpl.cacheable:
                rkey, served = self._response(rep, pool, ten, tpl, tpl_idx, a, i, tr, fx, bypass)
                if served:  # answered from the response cache
                    lat = cfg.base_ttft_s + wait + 0.02
                    self._record(
                        rep, ten, wait + cfg.base_ttft_s, lat, prompt, prompt, 0.0, a.u_conv[i]
                    )
                    return
            lora_s = self._lora(rep, ten)
            emb_s = (
                self._embeddings(rep, pool, ten, tpl, tpl_idx, a.chunks[i].tolist(), tr, bypass)
                if tpl.rag
                else 0.0
            )
            cached = self._prefix(
                rep,
                pool,
                ten,
                tpl,
                tpl_idx,
                sid,
                conv,
                q,
                prompt,
                tr,
                fx,
                _bypassed(bypass, "prefix_kv"),
            )
            self._finish_request(
                rep, ten, tr, wait, lora_s, emb_s, prompt, cached, out_tokens, a.u_conv[i]
            )
            if rkey is not None:
                rep.resp.set(rkey, b"r")
                pool.inserted += 1

    def _weights(self, rep: Replica, ten: Tenant, tr: float, gate_wait: float) -> float:
        """The model's weights; returns the wait before serving (the load balancer's gate
        until a replica is ready, or the weights still loading)."""
        look = self.summary.lookups
        if rep.weights.get(self._weights_key[ten.model]) is None:
            look[(rep.name, "weights", "miss")] += 1
            return max(rep.weights_ready.get(ten.model, tr) - tr, gate_wait)
        look[(rep.name, "weights", "hit")] += 1
        return gate_wait

    def _response(
        self,
        rep: Replica,
        pool: Pool,
        ten: Tenant,
        tpl: Template,
        tpl_idx: int,
        a: Any,
        i: int,
        tr: float,
        fx: Any,
        bypass: tuple[str, ...],
    ) -> tuple[str | None, bool]:
        """The response cache; returns (key to fill after serving or None, served from cache)."""
        look = self.summary.lookups
        rkey = self._response_key(ten.name, tpl, a.fill[i], a.user[i], tr, fx)
        if _bypassed(bypass, "response"):
            rep.resp.bypass(rkey)
            look[(rep.name, "response", "bypass")] += 1
            return None, False
        hit = rep.resp.get(rkey) is not None
        look[(rep.name, "response", "hit" if hit else "miss")] += 1
        if pool.heat is not None:
            pool.heat.touch("response", rkey, ten.name, tpl_idx, tr)
        return rkey, hit

    def _lora(self, rep: Replica, ten: Tenant) -> float:
        """The tenant's LoRA adapter; returns its load time (0 on a hit)."""
        look = self.summary.lookups
        lkey = self._lora_key[ten.name]
        if rep.lora.get(lkey) is not None:
            look[(rep.name, "lora", "hit")] += 1
            return 0.0
        look[(rep.name, "lora", "miss")] += 1
        rep.lora.set(lkey, 1)
        rep.lora.record_load(self.cfg.lora_load_s)
        return self.cfg.lora_load_s

    def _embeddings(
        self,
        rep: Replica,
        pool: Pool,
        ten: Tenant,
        tpl: Template,
        tpl_idx: int,
        chunks: Any,
        tr: float,
        bypass: tuple[str, ...],
    ) -> float:
        """The retrieved chunks' embeddings; returns the time spent embedding misses."""
        cfg = self.cfg
        look = self.summary.lookups
        skip = _bypassed(bypass, "embedding")
        emb_s = 0.0
        for c in chunks[:CHUNKS_PER_QUERY]:
            ekey = f"emb:{tpl.name}:chunk:{ten.name}.{c}"
            if skip:
                rep.emb.bypass(ekey)
                look[(rep.name, "embedding", "bypass")] += 1
                emb_s += cfg.embed_s
            elif rep.emb.get(ekey) is None:
                look[(rep.name, "embedding", "miss")] += 1
                rep.emb.set(ekey, 1)
                rep.inserted["embedding"] += 1
                emb_s += cfg.embed_s
                rep.emb.record_load(cfg.embed_s)
            else:
                look[(rep.name, "embedding", "hit")] += 1
            if pool.heat is not None:
                pool.heat.touch("embedding", ekey, ten.name, tpl_idx, tr, rep.name)
        return emb_s

    def _finish_request(
        self,
        rep: Replica,
        ten: Tenant,
        tr: float,
        wait: float,
        lora_s: float,
        emb_s: float,
        prompt: int,
        cached: int,
        out_tokens: int,
        u_conv: float,
    ) -> None:
        """Prefill the uncached tokens and decode on the replica's earliest free slot; record it."""
        cfg = self.cfg
        prefill = (prompt - cached) * cfg.prefill_s_per_token
        work = lora_s + emb_s + prefill + cfg.base_ttft_s
        decode = out_tokens * cfg.decode_s_per_token
        start = max(tr + wait, rep.slots[0])
        heapq.heapreplace(rep.slots, start + work + decode)
        ttft = (start - tr) + work
        gpu = prefill + emb_s + 0.2 * lora_s + decode / cfg.slots
        self._record(rep, ten, ttft, ttft + decode, prompt, cached, gpu, u_conv)

    def _record(
        self,
        rep: Replica,
        ten: Tenant,
        ttft: float,
        lat: float,
        prompt: int,
        cached: int,
        gpu: float,
        u: float,
    ) -> None:
        cfg = self.cfg
        converted = u < cfg.conv_base * math.exp(-lat / cfg.conv_tau_s)
        rep.tel.record_request(
            ttft_s=ttft,
            latency_s=lat,
            prompt_tokens=prompt,
            cached_tokens=cached,
            gpu_s=gpu,
            sla_met=ttft <= cfg.slo_ttft_s,
            conversion=converted,
            value=ten.value,
        )
        self.summary.requests += 1

    def _response_key(
        self, tenant: str, tpl: Template, fill: int, user: int, tr: float, fx: Any
    ) -> str:
        key = f"resp:{tpl.name}:{tenant}.{fill}"
        for f in fx:
            if f.trap == "tenant_isolation":
                key = f"resp:{tpl.name}:{fill}"  # the tenant scope is lost
            elif f.trap == "key_explosion":
                key = f"resp:{tpl.name}:{tenant}.{fill}:u{user}:m{int(tr // 60)}"
            elif f.trap == "dynamic_tokenisation":
                key += f"~{self._req_id % TOKENISATION_VARIANTS}"
        return key

    def _prefix(
        self,
        rep: Replica,
        pool: Pool,
        ten: Tenant,
        tpl: Template,
        tpl_idx: int,
        sid: int,
        conv: int,
        q: int,
        prompt: int,
        tr: float,
        fx: Any,
        bypass: bool,
    ) -> int:
        """Walk the prompt's blocks; return the number of tokens reused."""
        B = self.cfg.block_tokens
        look = self.summary.lookups
        rname = rep.name
        kv = rep.kv
        min_len = 0
        variant = ""
        for f in fx:
            if f.trap == "kv_fixed_len" and f.scope.get("layer", "prefix_kv") == "prefix_kv":
                min_len = int(f.params.get("min_tokens", 2048))
            elif f.trap == "dynamic_tokenisation":
                variant = f"~{self._req_id % TOKENISATION_VARIANTS}"
        sys_key = (tpl_idx, ten.idx, variant)
        sys_blocks = self._sys_blocks.get(sys_key)
        if (
            sys_blocks is None
        ):  # the system prompt's blocks: the same keys for every request of the pair
            sys_blocks = self._sys_blocks[sys_key] = [
                (f"kv:{tpl.name}:sys:{ten.name}.{b}{variant}", min(B, tpl.sys_tokens - b * B), True)
                for b in range(math.ceil(tpl.sys_tokens / B))
            ]
        blocks: list[tuple[str, int, bool]] = list(sys_blocks)  # key, tokens, reusable
        n_sys = len(sys_blocks)
        if tpl.dialog:
            total = conv + q
            full = conv // B
            for b in range(math.ceil(total / B)):
                blocks.append((f"kv:{tpl.name}:hist:{sid}.{b}", min(B, total - b * B), b < full))
        else:
            for b in range(math.ceil(q / B)):
                blocks.append((f"kv:{tpl.name}:query:{self._req_id}.{b}", min(B, q - b * B), False))
        cached = 0
        chain = True
        heat = pool.heat
        missed: list[int] = []  # indices of the missed blocks, stored after the walk
        for j, (key, tokens, reusable) in enumerate(blocks):
            if heat is not None and (
                j < n_sys or reusable
            ):  # system prompts and conversation history
                heat.touch("prefix_kv", key, ten.name, tpl_idx, tr, rname)
            if bypass:
                kv.bypass(key)
                look[(rname, "prefix_kv", "bypass")] += 1
                continue
            if chain and reusable and prompt >= min_len:
                if kv.get(key) is not None:
                    look[(rname, "prefix_kv", "hit")] += 1
                    cached += tokens
                    continue
            else:
                kv.record(key, hit=False)
            look[(rname, "prefix_kv", "miss")] += 1
            chain = False
            missed.append(j)
        if self.block_trace is not None:
            self.block_trace.add(pool.variant, self.now, rname, ten.name, blocks)
        if bypass:  # a skipped cache is not a miss: no classes
            return cached
        # Why each block missed, judged against the caches the request met (before its own writes).
        classes = self._miss_classes(
            rep, pool, ten, tpl, variant, blocks, n_sys, missed, prompt < min_len
        )
        groups: dict[int, dict[str, int]] = {}  # 0: system-prompt blocks, 1: query, conversation
        for (g, cls), n in classes.items():
            groups.setdefault(g, {})[cls] = n
        if prompt >= min_len:
            for j in missed:
                key = blocks[j][0]
                kv.set(key, blocks[j][1])
                rep.inserted["prefix_kv"] += blocks[j][1]
                if j < n_sys:
                    pool.kv_seen.add(key)
            if tpl.dialog:  # every conversation block of this prompt is now stored (hit or written)
                sess = self._sess
                sess[3] = max(sess[3], len(blocks) - n_sys)
        self.summary.kv_missed += prompt - cached
        fam = kv._b.families.family
        for g, cl in groups.items():  # each with its blocks' key family, as their lookups
            self.summary.miss_classes.update(cl)
            first_key = blocks[0 if g == 0 else n_sys][0]
            rep.tel.record_misses(tenant=ten.name, engine=rname, family=fam(first_key), classes=cl)
        return cached

    def _miss_classes(
        self,
        rep: Replica,
        pool: Pool,
        ten: Tenant,
        tpl: Template,
        variant: str,
        blocks: list[tuple[str, int, bool]],
        n_sys: int,
        missed: list[int],
        refused: bool,
    ) -> dict[tuple[int, str], int]:
        """Ground truth: the missed blocks' tokens by (group, why each missed): they add up to
        prompt - cached. Group 0 holds the system-prompt blocks, 1 the rest (query, conversation).

        In this order, for each missed block: ``partial`` — the prompt's last block when it
        holds fewer than ``block_tokens`` tokens, or every block of a prompt the cache refuses
        (the ``kv_fixed_len`` trap); ``cold`` — new content (the query, a conversation's newest
        tokens); a block held by this replica (only after the chain broke at an earlier block)
        takes the class of that first missed block; ``elsewhere`` — held by another replica of
        the pool; ``evicted`` — stored on a replica of the pool before and held by none now;
        ``isolated`` — a system-prompt block held only under another tenant's scope;
        ``drifted`` — a system-prompt block whose key the ``dynamic_tokenisation`` trap changed
        while the unchanged key was stored before; ``cold`` otherwise."""
        out: dict[tuple[int, str], int] = {}
        if not missed:
            return out
        if refused:
            for j in missed:
                k = (0 if j < n_sys else 1, "partial")
                out[k] = out.get(k, 0) + blocks[j][1]
            return out
        B = self.cfg.block_tokens
        last = len(blocks) - 1
        here = rep.kv_lru
        others = [r.kv_lru for r in pool.replicas if r is not rep]
        seen = pool.kv_seen
        first: str | None = None
        for j in missed:
            key, tokens, reusable = blocks[j]
            if j == last and tokens < B:
                cls = "partial"
            elif not reusable:
                cls = "cold"
            elif here.peek(key):
                cls = first or "cold"
            elif any(o.peek(key) for o in others):
                cls = "elsewhere"
            elif key in seen or (n_sys <= j < n_sys + self._sess[3]):
                cls = "evicted"
            elif j < n_sys and self._isolated(pool, ten, tpl, variant, j):
                cls = "isolated"
            elif j < n_sys and variant and f"kv:{tpl.name}:sys:{ten.name}.{j}" in seen:
                cls = "drifted"
            else:
                cls = "cold"
            if first is None:
                first = cls
            k = (0 if j < n_sys else 1, cls)
            out[k] = out.get(k, 0) + tokens
        return out

    def _isolated(self, pool: Pool, ten: Tenant, tpl: Template, variant: str, b: int) -> bool:
        """Whether system-prompt block ``b`` is held on a replica of the pool under another
        tenant."""
        reps = [r.kv_lru for r in pool.replicas]
        for o in self.tenants:
            if o is not ten:
                key = f"kv:{tpl.name}:sys:{o.name}.{b}{variant}"
                if any(r.peek(key) for r in reps):
                    return True
        return False


def _as_lists(a: Arrivals) -> Arrivals:
    """The tick's arrivals with every array as a Python list (``tolist`` keeps the values), but
    the retrieved chunks (a row per request): only a pool's own RAG requests read theirs, a row
    at a time (``a.chunks[i].tolist()``)."""
    return Arrivals(**{k: v if k == "chunks" else v.tolist() for k, v in vars(a).items()})


def _bypassed(bypass: tuple[str, ...], layer: str) -> bool:
    """Whether an active bypass fault covers ``layer`` (``*``: every layer)."""
    return bool(bypass) and ("*" in bypass or layer in bypass)


def block_trace_file(path: str | Path, pool: str) -> Path:
    """The file ``--block-trace PATH`` writes pool ``pool``'s trace to: PATH's name with ``-POOL``
    before its suffix (``trace.jsonl`` → ``trace-A.jsonl``; ``.jsonl`` when it has none)."""
    p = Path(path)
    return p.with_name(f"{p.stem}-{pool}{p.suffix or '.jsonl'}")


class BlockTraceRecorder:
    """Each pool's prefix-KV requests as a block trace: a request's blocks (the simulator's
    block keys, chained into digests), its replica, tenant and time, and the replicas'
    restarts (their caches emptied)."""

    def __init__(self, block_tokens: int) -> None:
        from warmscope.model.blocktrace import TraceBuilder

        self._builder = TraceBuilder
        self.block_tokens = block_tokens
        self.pools: dict[str, Any] = {}
        self._ids: dict[str, int] = {}  # block key -> digest (keys repeat: system prompts)

    def _pool(self, variant: str) -> Any:
        b = self.pools.get(variant)
        if b is None:
            b = self.pools[variant] = self._builder(self.block_tokens, f"simulated pool {variant}")
        return b

    def add(
        self, variant: str, t: float, replica: str, tenant: str, blocks: list[tuple[str, int, bool]]
    ) -> None:
        from warmscope.model.blocktrace import MASK63, chain_ids

        known = self._ids
        if len(known) > 1_000_000:
            known.clear()
        ids = []
        for k, _, _ in blocks:
            d = known.get(k)
            if d is None:
                d = known[k] = (
                    int.from_bytes(hashlib.blake2b(k.encode(), digest_size=8).digest(), "little")
                    & MASK63
                )
            ids.append(d)
        n = len(ids)
        self._pool(variant).add(
            t, n * self.block_tokens, 1, chain_ids(ids), engine=replica, tenant=tenant
        )

    def restart(self, variant: str, t: float, replica: str) -> None:
        self._pool(variant).restart(t, replica)

    def write(self, path: str | Path) -> list[Path]:
        from warmscope.sources.trace_file import write_trace

        out = []
        p = Path(path)
        for variant, b in sorted(self.pools.items()):
            if not len(b):
                continue
            target = block_trace_file(p, variant)
            write_trace(b.build(), target)
            out.append(target)
        return out
