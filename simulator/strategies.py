"""Warm-up strategies: which keys to warm, per layer, within a key budget.

* ``none`` — no warm-up.
* ``static_topk`` — the ``warm_keys`` most requested keys of each layer in the
  previous day's log (a sample of yesterday's traffic, drawn with another seed).
* ``semantic`` — incremental semantic: templates are clustered by task
  (docs, dialog, retrieval, short); the budget is split evenly across the
  clusters seen and the top keys of each cluster are warmed, so no task type
  starts cold.
* ``predictive`` — heat decay (seed formula): ``score = heat × similarity ×
  exp(−λ·Δt) × priority/10`` where heat is the key's decayed request count,
  Δt the time since it was last requested, similarity its template cluster's
  share of recent traffic relative to the busiest cluster, and priority the
  tenant's 1–10 priority.
  λ is fixed or SLO-aware (see ``SimConfig.heat_lambda``). Heat comes from the
  pool's own observed traffic — system-prompt blocks and the reusable history
  blocks of active conversations, which a replacement instance can restore
  (a KV offload tier) and yesterday's log cannot know; with no traffic yet
  (replica start) yesterday's log seeds it.

Each choice is ``(layer, key, tenant, template, gpu_s)``; ``gpu_s`` is what
warming that key costs in the cost model.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable

import numpy as np

from .config import SimConfig
from .traffic import CHUNKS_PER_QUERY, TEMPLATES, Tenant, draw_arrivals, pick_template, tenant_weights

__all__ = ["KeyStats", "yesterday_log", "choose", "HeatTracker", "warm_cost"]

WARM_LAYERS = ("prefix_kv", "embedding", "response")
Choice = tuple[str, str, str, int, float]


class KeyStats:
    """Per-layer request counts with each key's tenant and template."""

    def __init__(self) -> None:
        self.counts: dict[str, Counter] = {layer: Counter() for layer in WARM_LAYERS}
        self.meta: dict[str, tuple[str, int]] = {}

    def add(self, layer: str, key: str, tenant: str, tpl: int, n: float = 1.0) -> None:
        self.counts[layer][key] += n
        self.meta[key] = (tenant, tpl)


def request_keys(tenant: Tenant, tpl_idx: int, fill: int, chunks: Iterable[int], block_tokens: int):
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


def yesterday_log(cfg: SimConfig, tenants: list[Tenant], n: int = 40_000) -> KeyStats:
    rng = np.random.default_rng(cfg.seed + 10_007)
    # Yesterday's popular content: under content drift, a period before today's first.
    a = draw_arrivals(rng, cfg, 0.0, n / max(cfg.rps, 1e-9), cfg.rps, tenant_weights(len(tenants)),
                      drift_at=-cfg.content_drift_h * 3600)
    ks = KeyStats()
    for i in range(len(a.t)):
        ten = tenants[int(a.tenant[i])]
        tpl = pick_template(ten, float(a.u_tpl[i]))
        for layer, key in request_keys(ten, tpl, int(a.fill[i]), a.chunks[i][:CHUNKS_PER_QUERY], cfg.block_tokens):
            ks.add(layer, key, ten.name, tpl)
    return ks


def warm_cost(cfg: SimConfig, layer: str, tpl_idx: int) -> float:
    tpl = TEMPLATES[tpl_idx]
    if layer == "prefix_kv":
        return cfg.block_tokens * cfg.prefill_s_per_token
    if layer == "embedding":
        return cfg.embed_s
    q = sum(tpl.query_tokens) / 2
    return (tpl.sys_tokens + q) * cfg.prefill_s_per_token + tpl.out_tokens * cfg.decode_s_per_token / cfg.slots


COUNT_TAU_S = 3600.0  # memory of the request count (heat); recency is the score's exp(−λ·Δt)


class HeatTracker:
    """Request counts per key with an hour's memory: heat ← heat·exp(−Δt/τ) + 1
    on each request (τ = ``COUNT_TAU_S``). The score's recency factor
    exp(−λ·Δt) uses the strategy's λ (SLO-aware by default)."""

    def __init__(self, lam: float, limit: int = 60_000, count_tau_s: float = COUNT_TAU_S) -> None:
        self.lam = lam
        self.decay = 1.0 / count_tau_s
        self.limit = limit
        self.heat: dict[str, list] = {}  # key -> [heat, last_t, layer, tenant, tpl]
        self.cluster_recent: Counter = Counter()

    def touch(self, layer: str, key: str, tenant: str, tpl: int, t: float) -> None:
        e = self.heat.get(key)
        if e is None:
            if len(self.heat) >= self.limit:
                self._prune(t)
            self.heat[key] = [1.0, t, layer, tenant, tpl]
        else:
            e[0] = e[0] * math.exp(-self.decay * (t - e[1])) + 1.0
            e[1] = t

    def _prune(self, t: float) -> None:
        items = sorted(self.heat.items(), key=lambda kv: kv[1][0] * math.exp(-self.decay * (t - kv[1][1])))
        for k, _ in items[: len(items) // 2]:
            del self.heat[k]


def _top(cands: dict[str, float], k: int) -> list[str]:
    return [key for key, _ in sorted(cands.items(), key=lambda kv: (-kv[1], kv[0]))[:k]]


def choose(strategy: str, cfg: SimConfig, now_rel: float, yesterday: KeyStats, heat: HeatTracker | None,
           tenants_by_name: dict[str, Tenant], tenant_scope: str | None = None) -> list[Choice]:
    if strategy == "none":
        return []
    out: list[Choice] = []
    for layer in WARM_LAYERS:
        if strategy == "predictive" and heat is not None and heat.heat:
            cands = _predictive_scores(cfg, layer, now_rel, heat, tenants_by_name)
            meta = {k: (e[3], e[4]) for k, e in heat.heat.items()}
        else:
            cands = dict(yesterday.counts[layer])
            meta = yesterday.meta
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
        for k in keys:
            tenant, tpl = meta[k]
            out.append((layer, k, tenant, tpl, warm_cost(cfg, layer, tpl)))
    return out


def _predictive_scores(cfg: SimConfig, layer: str, now: float, heat: HeatTracker,
                       tenants_by_name: dict[str, Tenant]) -> dict[str, float]:
    recent = heat.cluster_recent
    top = max(recent.values()) if recent else 0
    out = {}
    for k, (h, last, lay, tenant, tpl) in heat.heat.items():
        if lay != layer:
            continue
        sim = recent.get(TEMPLATES[tpl].cluster, 0) / top if top else 1.0
        out[k] = h * sim * math.exp(-heat.lam * max(now - last, 0.0)) * tenants_by_name[tenant].priority / 10
    return out
