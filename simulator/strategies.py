"""Warm-up strategies: which keys to warm, per layer, within a key budget.

* ``none`` — no warm-up.
* ``static_topk`` — the ``warm_keys`` most requested keys of each layer in the
  previous day's log (a sample of yesterday's traffic, drawn with another seed).
* ``semantic`` — incremental semantic: templates are clustered by task
  (docs, dialog, retrieval, short); the budget is split evenly across the
  clusters seen and the top keys of each cluster are warmed, so no task type
  starts cold.
* ``predictive`` — a demand forecast per key, warming what it says will be
  read before the cache drops it. Each key's request rate comes from
  yesterday's log and the pool's own decayed request count (an hour's
  memory): once the pool has watched for ``MIN_OBSERVED_S``, yesterday's rate
  counts only as far as today's traffic confirms it (min of the two: content
  that stopped trending is not warmed on yesterday's word); keys yesterday
  never saw (a conversation's history, new content) get today's count shrunk
  by ``PRIOR_WEIGHT_S`` seconds of nothing. The chance of a read
  (:func:`read_chance`) allows for demand that ends (sessions close, content
  moves on; a key idle for long compared with its rate has probably stopped),
  over a horizon of ``warm_horizon_s`` or the cache's residence time when
  shorter (how long an unread entry survives the replica's LRU, measured from
  what the cache stores per second, or the response TTL), less how long the
  entry already cached stays valid. A key is warmed only at a chance of at
  least ``warm_min_prob`` (prefix-KV blocks: ``warm_min_prob_kv``), so the
  budget per layer is what the forecast supports (``warm_keys`` caps it);
  prefix blocks are chained (a block is read only after its predecessors and
  a conversation's history only after its system prompt). Keys are ranked by
  that chance (responses: times the time to first token a miss costs, the
  tenant's likely LoRA adapter load included — Che's approximation of the
  adapter LRU under the tenants' recent request shares) — ties by the heat
  score of the source document, ``heat × similarity × exp(−λ·Δt) ×
  priority/10`` (heat: the decayed count; Δt: time since the last request;
  similarity: the template cluster's share of recent traffic relative to the
  busiest; priority: the tenant's 1–10; λ fixed or SLO-aware,
  ``SimConfig.heat_lambda``). LoRA adapters: the tenants whose adapter is read
  before the LRU evicts it with at least ``warm_min_prob`` (Che), the likeliest
  written last. The forecast is per replica for the replica's own caches: a
  conversation's history blocks are read only on the replica its session is
  routed to, a system prompt on every replica. Heat comes from the pool's own
  traffic — system-prompt blocks and the reusable history blocks of active
  conversations, which a replacement instance can restore (a KV offload tier)
  and yesterday's log cannot know; with no traffic yet (replica start)
  yesterday's log, priority-weighted, is the warm set.

Each choice is ``(layer, key, tenant, template, gpu_s)``; ``gpu_s`` is what
warming that key costs in the cost model.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from .config import SimConfig
from .traffic import (
    CHUNKS_PER_QUERY,
    TEMPLATES,
    Tenant,
    draw_arrivals,
    pick_template,
    tenant_weights,
)

__all__ = [
    "KeyStats",
    "yesterday_log",
    "choose",
    "HeatTracker",
    "warm_cost",
    "read_chance",
    "lora_chances",
]

WARM_LAYERS = ("prefix_kv", "embedding", "response")
PER_REPLICA = (
    "prefix_kv",
    "embedding",
)  # each replica's own cache (the response cache is the pool's)
PRIOR_WEIGHT_S = (
    3600.0  # yesterday's rate counts as this many seconds of the pool's own observation
)
MIN_OBSERVED_S = 600.0  # today's traffic caps yesterday's rate once the pool has watched this long
YESTERDAY_REQUESTS = 40_000  # requests in yesterday's log
Choice = tuple[str, str, str, int, float]


class Decayed(dict[str, float]):
    """Decaying request counts by key: as a ``Counter``, a key never counted reads 0 (and is not
    added by the read), but the counts are floats (they decay)."""

    def __missing__(self, key: str) -> float:
        return 0.0


class KeyStats:
    """Per-layer request counts with each key's tenant and template."""

    def __init__(self) -> None:
        self.counts: dict[str, Counter[str]] = {layer: Counter() for layer in WARM_LAYERS}
        self.meta: dict[str, tuple[str, int]] = {}
        self.span_s = 0.0  # seconds of (all pools') traffic the counts cover
        # choose()'s rankings of yesterday's keys, which do not change once the log is read:
        # (strategy, layer, tenant scope, keys) -> the warm set's keys
        self.ranked: dict[tuple[str, str, str | None, int], list[str]] = {}

    def add(self, layer: str, key: str, tenant: str, tpl: int, n: int = 1) -> None:
        self.counts[layer][key] += n
        self.meta[key] = (tenant, tpl)
        if self.ranked:  # a ranking taken before this request is out of date
            self.ranked.clear()


def request_keys(
    tenant: Tenant, tpl_idx: int, fill: int, chunks: Iterable[int], block_tokens: int
) -> Iterator[tuple[str, str]]:
    """The warmable keys one request touches: (layer, key) pairs."""
    tpl = TEMPLATES[tpl_idx]
    n = tenant.name
    if tpl.cacheable:
        yield "response", f"resp:{tpl.name}:{n}.{fill}"
    if tpl.rag:
        for c in chunks:
            yield "embedding", f"emb:{tpl.name}:chunk:{n}.{c}"
    for b in range(math.ceil(tpl.sys_tokens / block_tokens)):
        yield "prefix_kv", f"kv:{tpl.name}:sys:{n}.{b}"


def yesterday_log(cfg: SimConfig, tenants: list[Tenant], n: int = YESTERDAY_REQUESTS) -> KeyStats:
    rng = np.random.default_rng(cfg.seed + 10_007)
    # Yesterday's popular content: under content drift, a period before today's first.
    a = draw_arrivals(
        rng,
        cfg,
        0.0,
        n / max(cfg.rps, 1e-9),
        cfg.rps,
        tenant_weights(len(tenants)),
        drift_at=-cfg.content_drift_h * 3600,
    )
    ks = KeyStats()
    ks.span_s = n / max(cfg.rps, 1e-9)
    # Python lists, read an element at a time (the same values as the arrays' scalars)
    tenant, u_tpl, fill, chunks = (
        a.tenant.tolist(),
        a.u_tpl.tolist(),
        a.fill.tolist(),
        a.chunks.tolist(),
    )
    for i in range(len(a.t)):
        ten = tenants[tenant[i]]
        tpl = pick_template(ten, u_tpl[i])
        for layer, key in request_keys(
            ten, tpl, fill[i], chunks[i][:CHUNKS_PER_QUERY], cfg.block_tokens
        ):
            ks.add(layer, key, ten.name, tpl)
    return ks


def warm_cost(cfg: SimConfig, layer: str, tpl_idx: int) -> float:
    tpl = TEMPLATES[tpl_idx]
    if layer == "prefix_kv":
        return cfg.block_tokens * cfg.prefill_s_per_token
    if layer == "embedding":
        return cfg.embed_s
    q = sum(tpl.query_tokens) / 2
    return (
        tpl.sys_tokens + q
    ) * cfg.prefill_s_per_token + tpl.out_tokens * cfg.decode_s_per_token / cfg.slots


COUNT_TAU_S = 3600.0  # memory of the request count (heat); recency is the score's exp(−λ·Δt)


class HeatTracker:
    """Request counts per key with an hour's memory: heat ← heat·exp(−Δt/τ) + 1
    on each request (τ = ``COUNT_TAU_S``), and the replica that served the key
    (``"*"`` once several have). The score's recency factor exp(−λ·Δt) uses
    the strategy's λ (SLO-aware by default)."""

    def __init__(self, lam: float, limit: int = 60_000, count_tau_s: float = COUNT_TAU_S) -> None:
        self.lam = lam
        self.tau = count_tau_s
        self.decay = 1.0 / count_tau_s
        self.limit = limit
        self.heat: dict[str, list[Any]] = {}  # key -> [heat, last_t, layer, tenant, tpl, replica]
        self.cluster_recent = Decayed()
        self.tenant_recent = Decayed()  # requests per tenant, decayed like cluster_recent
        self.since: float | None = None  # the first request seen

    def touch(
        self, layer: str, key: str, tenant: str, tpl: int, t: float, replica: str = "*"
    ) -> None:
        if self.since is None:
            self.since = t
        e = self.heat.get(key)
        if e is None:
            if len(self.heat) >= self.limit:
                self._prune(t)
            self.heat[key] = [1.0, t, layer, tenant, tpl, replica]
        else:
            e[0] = e[0] * math.exp(-self.decay * (t - e[1])) + 1.0
            e[1] = t
            if e[5] != replica:
                e[5] = "*"

    def observed_s(self, now: float) -> float:
        """The count a steady rate of one request per second leaves by ``now``:
        τ·(1 − exp(−T/τ)) after T seconds of traffic (a rate is heat / this)."""
        span = max(now - (self.since if self.since is not None else now), 1.0)
        return self.tau * -math.expm1(-span / self.tau)

    def _prune(self, t: float) -> None:
        items = sorted(
            self.heat.items(), key=lambda kv: kv[1][0] * math.exp(-self.decay * (t - kv[1][1]))
        )
        for k, _ in items[: len(items) // 2]:
            del self.heat[k]


def _top(cands: dict[str, float], k: int) -> list[str]:
    return [key for key, _ in sorted(cands.items(), key=lambda kv: (-kv[1], kv[0]))[:k]]


def choose(
    strategy: str,
    cfg: SimConfig,
    now_rel: float,
    yesterday: KeyStats,
    heat: HeatTracker | None,
    tenants_by_name: dict[str, Tenant],
    tenant_scope: str | None = None,
    replica: str | None = None,
    valid_for: Callable[[str, str], float] | None = None,
    residence: Callable[[str], float] | None = None,
) -> list[Choice]:
    """The warm set. ``replica``: the replica being warmed (predictive: its own caches' forecast);
    ``valid_for(layer, key)``: seconds the cache's current entry stays valid (0: absent);
    ``residence(layer)``: seconds an entry nobody reads survives in that cache (predictive)."""
    if strategy == "none":
        return []
    out: list[Choice] = []
    # predictive with a history: the forecast, on the heat scores of every layer (one pass over
    # the pool's keys)
    seen = heat if strategy == "predictive" and heat is not None and heat.heat else None
    scores = _predictive_scores(cfg, now_rel, seen, tenants_by_name) if seen is not None else {}
    for layer in WARM_LAYERS:
        if seen is not None:
            keys = _forecast(
                cfg,
                layer,
                now_rel,
                yesterday,
                seen,
                tenants_by_name,
                replica,
                valid_for,
                tenant_scope,
                residence,
                seed=scores.get(layer, {}),
            )
            for k in keys:
                tenant, tpl = seen.heat[k][3:5] if k in seen.heat else yesterday.meta[k]
                out.append((layer, k, tenant, tpl, warm_cost(cfg, layer, tpl)))
            continue
        meta = yesterday.meta
        memo = (strategy, layer, tenant_scope, cfg.warm_keys)
        ranked = yesterday.ranked.get(memo)
        if ranked is not None:
            for k in ranked:
                tenant, tpl = meta[k]
                out.append((layer, k, tenant, tpl, warm_cost(cfg, layer, tpl)))
            continue
        cands: dict[str, float] = dict(yesterday.counts[layer])
        if strategy == "predictive":  # no history yet: priority-weighted yesterday
            cands = {k: v * tenants_by_name[meta[k][0]].priority / 10 for k, v in cands.items()}
        if tenant_scope is not None:
            cands = {k: v for k, v in cands.items() if meta[k][0] == tenant_scope}
        if strategy == "semantic":
            by_cluster: dict[str, dict[str, float]] = defaultdict(dict)
            for k, v in cands.items():
                by_cluster[TEMPLATES[meta[k][1]].cluster][k] = v
            share = max(cfg.warm_keys // max(len(by_cluster), 1), 1)
            keys = [k for c in sorted(by_cluster) for k in _top(by_cluster[c], share)]
        else:
            keys = _top(cands, cfg.warm_keys)
        yesterday.ranked[memo] = keys
        for k in keys:
            tenant, tpl = meta[k]
            out.append((layer, k, tenant, tpl, warm_cost(cfg, layer, tpl)))
    return out


def _rate(prior: float, seen: float, obs: float) -> float:
    """A key's request rate (per s, one pool) from yesterday's rate ``prior`` and today's decayed
    count ``seen`` over ``obs`` observed seconds (:meth:`HeatTracker.observed_s`). Once the pool
    has watched for ``MIN_OBSERVED_S``, a key in yesterday's log keeps yesterday's rate only as
    far as today's traffic confirms it, min(prior, seen / obs): popularity that moved on
    (trending content) is not warmed on yesterday's word, and a burst today is not taken for
    a lasting rate. Before that, and for keys yesterday never saw (a conversation's history,
    new content), yesterday's rate weighs as ``PRIOR_WEIGHT_S`` seconds of observation:
    (prior·w + seen) / (w + obs)."""
    if prior > 0 and obs >= MIN_OBSERVED_S:
        return min(prior, seen / obs)
    return (prior * PRIOR_WEIGHT_S + seen) / (PRIOR_WEIGHT_S + obs)


def read_chance(rate: float, idle_s: float, horizon_s: float, death: float) -> float:
    """The chance a key is requested within ``horizon_s``, for a request rate ``rate`` (per s)
    while its demand lasts, demand that ends at ``death`` per second (sessions end, content
    stops trending) and ``idle_s`` seconds since its last request (the Pareto/NBD "alive"
    model with fixed rates):

    alive = 1 / (1 + μ/(λ+μ)·(e^((λ+μ)·d) − 1)), read = alive · λ/(λ+μ) · (1 − e^(−(λ+μ)·h)).

    A key idle for long compared with its rate has probably stopped being asked for; a
    stationary rate (μ = 0) gives 1 − e^(−λ·h)."""
    if rate <= 0 or horizon_s <= 0:
        return 0.0
    s = rate + death
    c = death / s
    stay = math.exp(-s * max(idle_s, 0.0))  # e^(−(λ+μ)d), kept finite for long idle times
    # no death (c = 0): always alive (stay / stay, which is 0 / 0 once stay underflows)
    alive = 1.0 if c == 0 else stay / (stay + c * (1.0 - stay))
    return alive * rate / s * -math.expm1(-s * horizon_s)


def _forecast(
    cfg: SimConfig,
    layer: str,
    now: float,
    yesterday: KeyStats,
    heat: HeatTracker,
    tenants_by_name: dict[str, Tenant],
    replica: str | None,
    valid_for: Callable[[str, str], float] | None,
    tenant_scope: str | None,
    residence: Callable[[str], float] | None = None,
    seed: dict[str, float] | None = None,
) -> list[str]:
    """Predictive keys of one layer: the chance each is read before the cache drops it
    (:func:`read_chance` over the horizon: ``warm_horizon_s``, or the cache's residence time
    when shorter — how long an entry nobody reads survives the LRU, or its TTL), at least
    ``warm_min_prob``, highest first (ties: the heat score), at most ``warm_keys``: the budget
    is what the forecast supports, not a fixed count. A prefix block is read only when the
    blocks before it are cached, so a block's chance is at most its predecessor's.
    ``seed``: the layer's heat scores (:func:`_predictive_scores`) when already at hand."""
    prior = yesterday.counts[layer]
    per_s = (
        1.0 / (yesterday.span_s * len(cfg.arms)) if yesterday.span_s else 0.0
    )  # one pool's share
    obs = heat.observed_s(now)
    if seed is None:
        seed = _predictive_scores(cfg, now, heat, tenants_by_name).get(layer, {})
    own = layer in PER_REPLICA
    horizon = min(cfg.warm_horizon_s, residence(layer) if residence is not None else math.inf)
    since = heat.since if heat.since is not None else now
    floor = cfg.warm_min_prob_kv if layer == "prefix_kv" else cfg.warm_min_prob
    # 1 - e^-x <= x, so a key's chance is at most rate × horizon; half the floor leaves room for
    # rounding: a key skipped on it could not have reached the floor
    cutoff = 0.5 * floor
    adapter_miss = _adapter_miss(cfg, heat.tenant_recent) if layer == "response" else {}
    chance: dict[str, float] = {}
    saved: dict[str, float] = {}  # response: expected seconds of time to first token saved
    # Once the pool has watched for MIN_OBSERVED_S, a key today's traffic never read has rate
    # min(prior, 0) = 0 (:func:`_rate`): only the keys in the heat (all of them are in ``seed``)
    # can reach the floor, and yesterday's other keys (most of its log) need no look.
    keys = seed.keys() if obs >= MIN_OBSERVED_S else set(prior) | set(seed)
    for k in keys:
        e = heat.heat.get(k)
        if (
            tenant_scope is not None
            and (e[3] if e is not None else yesterday.meta[k][0]) != tenant_scope
        ):
            continue
        seen = e[0] * math.exp(-heat.decay * max(now - e[1], 0.0)) if e is not None else 0.0
        rate = _rate(prior.get(k, 0.0) * per_s, seen, obs)
        if own:  # a replica reads its share: a session's history where it is served, none elsewhere
            where = e[5] if e is not None else "*"
            rate *= (
                1.0 / cfg.replicas if where == "*" or replica is None else float(where == replica)
            )
        if rate * horizon < cutoff:  # read_chance <= rate * horizon: below the floor (most keys)
            continue
        left = valid_for(layer, k) if valid_for is not None else 0.0
        idle = now - (e[1] if e is not None else since)  # never seen here: idle since the start
        p = read_chance(rate, idle, horizon - left, heat.decay)
        if p >= floor and p > 0:
            chance[k] = p
            if (
                layer == "response"
            ):  # the time to first token a hit saves, the tenant's likely adapter load included
                tenant, tpl = (e[3], e[4]) if e is not None else yesterday.meta[k]
                saved[k] = p * _response_miss_ttft(cfg, tpl, adapter_miss.get(tenant, 1.0))
    if layer == "prefix_kv":
        _chain(chance, lambda k: _meta(k, heat, yesterday), cfg.block_tokens)
    rank = saved or chance
    return sorted(chance, key=lambda k: (-rank[k], -seed.get(k, 0.0), k))[: cfg.warm_keys]


def _chain(
    chance: dict[str, float], pair: Callable[[str], tuple[str, int]], block_tokens: int
) -> None:
    """Prefix blocks are reused in order: block b of a prompt (``<prefix>.<b>``) is read only
    when block b − 1 is cached, and a conversation's history only after its template's system
    prompt (``pair(key)``: the key's tenant and template). So a block's chance is at most its
    predecessor's, and a block whose predecessor is not warmed is dropped (it would miss)."""
    by_prefix: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for k in chance:
        head, _, b = k.rpartition(".")
        if b.isdigit():
            by_prefix[head].append((int(b), k))
    sys_cap: dict[tuple[str, int], float] = {}  # (tenant, template) -> its system prompt's chance
    for head in sorted(by_prefix, key=lambda h: ":sys:" not in h):  # system prompts first
        blocks = sorted(by_prefix[head])
        first = blocks[0][1]
        cap = 1.0 if ":sys:" in head else sys_cap.get(pair(first), 0.0)
        for i, (n, k) in enumerate(blocks):
            if n != i or cap <= 0:  # a gap: this block and the rest of the prompt miss
                for _, rest in blocks[i:]:
                    del chance[rest]
                break
            cap = chance[k] = min(chance[k], cap)
        if ":sys:" in head and first in chance:
            tenant, tpl = pair(first)
            if len(blocks) == math.ceil(TEMPLATES[tpl].sys_tokens / block_tokens):
                sys_cap[(tenant, tpl)] = cap


def _meta(key: str, heat: HeatTracker, yesterday: KeyStats) -> tuple[str, int]:
    """A key's tenant and template, from the pool's traffic or yesterday's log."""
    e = heat.heat.get(key)
    return (e[3], e[4]) if e is not None else yesterday.meta[key]


def _response_miss_ttft(cfg: SimConfig, tpl_idx: int, adapter_miss: float) -> float:
    """Seconds to the first token a response-cache miss costs beyond a hit, in the cost model: the
    adapter load (with the chance it is not resident), the chunks' embeddings, the query's prefill
    (the system prompt's blocks are usually cached) and the fixed overhead."""
    tpl = TEMPLATES[tpl_idx]
    emb = CHUNKS_PER_QUERY * cfg.embed_s if tpl.rag else 0.0
    return (
        adapter_miss * cfg.lora_load_s
        + emb
        + sum(tpl.query_tokens) / 2 * cfg.prefill_s_per_token
        + cfg.base_ttft_s
    )


def _adapter_miss(cfg: SimConfig, tenant_requests: Mapping[str, float]) -> dict[str, float]:
    """Each tenant's chance that its LoRA adapter is not resident, for an LRU of ``lora_slots``
    under the tenants' recent request shares (Che's approximation: the characteristic time T
    solves Σ 1 − exp(−qᵢ·T) = slots; a tenant misses with exp(−qᵢ·T))."""
    total = sum(tenant_requests.values())
    if not total or len(tenant_requests) <= cfg.lora_slots:
        return {t: 0.0 for t in tenant_requests}
    q = {t: n / total for t, n in tenant_requests.items()}
    lo, hi = 0.0, 1.0
    while sum(-math.expm1(-x * hi) for x in q.values()) < cfg.lora_slots:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (
            (mid, hi)
            if sum(-math.expm1(-x * mid) for x in q.values()) < cfg.lora_slots
            else (lo, mid)
        )
    return {t: math.exp(-x * hi) for t, x in q.items()}


def lora_chances(cfg: SimConfig, tenant_requests: Mapping[str, float]) -> dict[str, float]:
    """Each tenant's chance that its adapter, warmed now, is read before the LoRA LRU evicts it:
    1 − its miss chance under Che's approximation (:func:`_adapter_miss`)."""
    return {t: 1.0 - m for t, m in _adapter_miss(cfg, tenant_requests).items()}


def _predictive_scores(
    cfg: SimConfig, now: float, heat: HeatTracker, tenants_by_name: dict[str, Tenant]
) -> dict[str, dict[str, float]]:
    """Each layer's keys by heat score: decayed heat × the template cluster's recent share of
    the top cluster's × the tenant's priority / 10."""
    recent = heat.cluster_recent
    top = max(recent.values()) if recent else 0
    out: dict[str, dict[str, float]] = {}
    for k, (h, last, lay, tenant, tpl, _rep) in heat.heat.items():
        sim = recent.get(TEMPLATES[tpl].cluster, 0) / top if top else 1.0
        layer_out = out.get(lay)
        if layer_out is None:
            layer_out = out[lay] = {}
        layer_out[k] = (
            h
            * sim
            * math.exp(-heat.lam * max(now - last, 0.0))
            * tenants_by_name[tenant].priority
            / 10
        )
    return out
