"""Traffic: tenants, prompt templates, sessions, arrivals and cache keys.

Per-tenant prompt templates with variable fills, Zipf popularity of fills and
RAG chunks, a diurnal rate with bursts, and sessions (the A/B units) assigned
to variants by a stable hash. Arrivals are drawn per tick with numpy; each
request is then a small tuple the engine walks through the cache layers.

Cache keys (families under the default normaliser in brackets)::

    weights:<model>                         [weights:*]
    lora:adapter:<tenant>.v1                [lora:adapter:*]
    resp:<template>:<tenant>.<fill>         [resp:<template>:*]
    emb:<template>:chunk:<tenant>.<chunk>   [emb:<template>:chunk:*]
    kv:<template>:sys:<tenant>.<block>      [kv:<template>:sys:*]   shared system prompt
    kv:<template>:hist:<session>.<block>    [kv:<template>:hist:*]  session history
    kv:<template>:query:<request>.<block>   [kv:<template>:query:*] the new part
"""

from __future__ import annotations

import math
import zlib
from bisect import bisect
from dataclasses import dataclass

import numpy as np

from .config import SimConfig

__all__ = [
    "Template",
    "TEMPLATES",
    "Tenant",
    "make_tenants",
    "variant_of",
    "Arrivals",
    "draw_arrivals",
    "rate_at",
]

_NAMES = ["acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "wonka"]
MODELS = ["llama-3-8b", "qwen-2-7b", "mistral-7b", "gemma-2-9b"]


@dataclass(frozen=True)
class Template:
    name: str
    cluster: str
    sys_tokens: int
    cacheable: bool  # response cache applies
    rag: bool  # retrieves embedding chunks
    dialog: bool  # multi-turn: session history grows
    query_tokens: tuple[int, int]
    out_tokens: int


TEMPLATES = (
    Template("summarize", "docs", 1536, True, False, False, (200, 1200), 150),
    Template("extract", "docs", 1024, True, False, False, (100, 600), 80),
    Template("chat", "dialog", 768, False, False, True, (30, 300), 250),
    Template("codegen", "dialog", 2048, False, False, True, (50, 400), 300),
    Template("ragqa", "retrieval", 1024, True, True, False, (30, 150), 200),
    Template("search", "retrieval", 512, True, True, False, (10, 60), 60),
    Template("classify", "short", 512, True, False, False, (20, 200), 5),
    Template("translate", "short", 640, True, False, False, (50, 400), 200),
)
FILL_CATALOG = 4000  # distinct fills per tenant × template (Zipf over them)
CHUNK_CORPUS = 15000  # RAG chunks per tenant
CHUNKS_PER_QUERY = 3
FILL_ZIPF = 1.25  # fill rank = (Zipf(FILL_ZIPF) − 1) mod FILL_CATALOG
FILL_DRIFT_STEP = 977  # ranks the fills rotate by per content-drift period (:func:`drift`)


@dataclass
class Tenant:
    idx: int
    name: str
    model: str
    priority: int  # 1..10, used by the predictive strategy
    value: float  # value per conversion
    templates: list[int]  # indices into TEMPLATES
    cum: list[float]  # cumulative template weights


def _tenant_name(i: int) -> str:
    if i < len(_NAMES):
        return _NAMES[i]
    return "tenant" + chr(97 + i // 26) + chr(97 + i % 26)


def make_tenants(cfg: SimConfig, rng: np.random.Generator) -> list[Tenant]:
    out = []
    for i in range(cfg.tenants):
        k = int(rng.integers(3, 6))
        tpls = sorted(rng.choice(len(TEMPLATES), size=k, replace=False).tolist())
        w = rng.dirichlet(np.ones(k) * 1.5)
        out.append(
            Tenant(
                i,
                _tenant_name(i),
                MODELS[i % min(cfg.models, len(MODELS))],
                int(rng.integers(1, 11)),
                cfg.value_per_conversion * (1 + i / 10),
                tpls,
                np.cumsum(w).tolist(),
            )
        )
    return out


def tenant_weights(n: int) -> np.ndarray:
    w: np.ndarray = 1.0 / np.arange(1, n + 1) ** 0.8
    out: np.ndarray = w / w.sum()
    return out


def variant_of(experiment: str, session: int, arms: int = 2) -> str:
    """Stable assignment to one of ``arms`` variants (A, B, C, ...) by hash of
    the unit (not Python's salted hash); equal shares."""
    return "ABCDEFGH"[zlib.crc32(f"{experiment}:{session}".encode()) % arms]


def rate_at(cfg: SimConfig, t_rel: float, bursts: list[tuple[float, float]]) -> float:
    h = t_rel / 3600.0
    r = cfg.rps * (1 + cfg.diurnal_amplitude * math.sin(2 * math.pi * (h - 9) / 24))
    for b0, b1 in bursts:
        if b0 <= t_rel < b1:
            r *= cfg.burst_factor
    return max(r, 0.0)


@dataclass
class Arrivals:
    """One tick's requests as parallel arrays (index i = one request)."""

    t: np.ndarray
    tenant: np.ndarray
    u_tpl: np.ndarray
    u_session: np.ndarray
    u_pick: np.ndarray
    fill: np.ndarray
    chunks: np.ndarray  # (n, CHUNKS_PER_QUERY)
    query_tokens_u: np.ndarray
    out_mult: np.ndarray
    u_conv: np.ndarray
    user: np.ndarray


EVERGREEN = 20  # the most popular fills and chunks keep their rank under content drift


def drift(ranks: np.ndarray, catalog: int, cfg: SimConfig, at_rel: float, step: int) -> np.ndarray:
    """Trending content: every ``content_drift_h`` hours the popularity ranks
    beyond the evergreen head move to other items (a deterministic rotation,
    no random draws, so the same seed gives the same traffic otherwise)."""
    if cfg.content_drift_h <= 0:
        return ranks
    shift = (int(math.floor(at_rel / (cfg.content_drift_h * 3600))) * step) % catalog
    return np.where(ranks < EVERGREEN, ranks, (ranks + shift) % catalog)


def draw_arrivals(
    rng: np.random.Generator,
    cfg: SimConfig,
    t0_rel: float,
    dt: float,
    rate: float,
    tw: np.ndarray,
    drift_at: float | None = None,
) -> Arrivals:
    n = int(rng.poisson(rate * dt))
    t = np.sort(rng.random(n)) * dt + t0_rel
    at = t0_rel if drift_at is None else drift_at
    return Arrivals(
        t=t,
        tenant=rng.choice(len(tw), size=n, p=tw),
        u_tpl=rng.random(n),
        u_session=rng.random(n),
        u_pick=rng.random(n),
        fill=drift(
            (rng.zipf(FILL_ZIPF, n) - 1) % FILL_CATALOG, FILL_CATALOG, cfg, at, FILL_DRIFT_STEP
        ),
        chunks=drift(
            (rng.zipf(1.15, (n, CHUNKS_PER_QUERY)) - 1) % CHUNK_CORPUS, CHUNK_CORPUS, cfg, at, 3571
        ),
        query_tokens_u=rng.random(n),
        out_mult=rng.lognormal(0.0, 0.35, n),
        u_conv=rng.random(n),
        user=rng.integers(0, 100_000, n),
    )


def pick_template(tenant: Tenant, u: float) -> int:
    return tenant.templates[min(bisect(tenant.cum, u), len(tenant.templates) - 1)]
