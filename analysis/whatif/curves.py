"""Miss-ratio curves: the token hit rate a prefix cache of each capacity would have had.

Three curves of the same trace:

* **LRU, exact, one pass** (:func:`lru_curve`): block LRU, the textbook reference: every block a
  request names (the Mooncake format's partial last block too) is a cacheable block; a block is a
  hit when it and every block before it in its request are resident. Stack distances in one pass
  (Mattson's algorithm with a Fenwick tree of counts) give the hit rate at *every* capacity. With
  several engines and a routing, each engine's own request stream gets its own distances and the
  capacity is per engine.
* **LRU, sampled** (:func:`lru_curve` with ``rate`` < 1): SHARDS-style spatial sampling — only
  blocks whose digest falls in a fixed ``rate`` of the hash space are tracked, their distances
  scaled by ``1 / rate`` — for traces whose distinct blocks do not fit in memory; its error against
  the exact curve is measured in tests/analysis/whatif/test_curves.py.
* **vLLM, exact replay** (:func:`vllm_curve`): :func:`.replay.replay` at chosen sizes — the
  engine's own policy (its last-token rule, output blocks, tail-first freeing), capacity in
  vLLM's ``num_gpu_blocks``.

A :class:`Curve` names its maximum (an infinite cache), the smallest capacity that reaches half
and 95 % of it, and its knee: the capacity where the curve, on a log-capacity axis scaled to
[0, 1] like the hit rate, is furthest above the chord from its first to its last point (the
Kneedle rule) — past it each doubling buys less.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from warmscope.model.blocktrace import BlockTrace, TraceError

from . import kernels
from .replay import replay

__all__ = ["Curve", "lru_curve", "vllm_curve", "block_tokens", "INF"]

INF = np.int64(1) << np.int64(62)


def block_tokens(trace: BlockTrace) -> np.ndarray:
    """Prompt tokens each block of the trace covers (the last one of a prompt can be partial;
    blocks past the prompt cover none)."""
    B = trace.block_size
    lens = np.diff(trace.offsets)
    pos = np.arange(trace.n_blocks) - np.repeat(trace.offsets[:-1], lens)
    prompt = np.repeat(trace.prompt, lens)
    out: np.ndarray = np.clip(prompt - pos * B, 0, B).astype(np.int64)
    return out


@dataclass
class Curve:
    """Token hit rate against capacity (blocks of ``block_size`` tokens; per engine)."""

    kind: str  # "lru", "lru_sampled" or "vllm"
    block_size: int
    capacity: np.ndarray  # blocks
    hit_rate: np.ndarray  # token hit rate at each capacity
    max_hit: float  # an infinite cache
    today: int | None = None  # the recorded capacity, blocks
    by_tenant: dict[str, np.ndarray] = field(default_factory=dict)
    rate: float = 1.0  # sampling rate (1: exact)
    _dist: np.ndarray | None = None  # sorted finite distances (exact LRU)
    _cum: np.ndarray | None = None  # cumulative tokens over _dist
    _tokens: float = 0.0  # prompt tokens in all

    def at(self, capacity: float) -> float:
        """The hit rate at ``capacity`` blocks (exact between the points of an LRU curve;
        log-linear between the replayed sizes of a vLLM curve)."""
        if self._dist is not None and self._cum is not None:
            k = int(np.searchsorted(self._dist, capacity, side="right"))
            return float(self._cum[k - 1]) / self._tokens if k > 0 else 0.0
        c = np.asarray(self.capacity, float)
        if capacity <= c[0]:
            return float(self.hit_rate[0]) if capacity == c[0] else float("nan")
        return float(np.interp(math.log(capacity), np.log(c), self.hit_rate))

    def capacity_for(self, fraction: float) -> float:
        """The smallest capacity (blocks) at which the hit rate reaches ``fraction`` of the
        maximum; NaN when no point of the curve does."""
        want = fraction * self.max_hit
        if self._dist is not None and self._cum is not None:
            k = int(np.searchsorted(self._cum, want * self._tokens - 1e-9, side="left"))
            return float(self._dist[k]) if k < len(self._dist) else float("nan")
        ok = np.flatnonzero(self.hit_rate >= want - 1e-12)
        return float(self.capacity[ok[0]]) if len(ok) else float("nan")

    @property
    def knee(self) -> float:
        c = np.asarray(self.capacity, float)
        y = np.asarray(self.hit_rate, float)
        good = c > 0
        c, y = c[good], y[good]
        if len(c) < 3 or y[-1] <= y[0]:
            return float("nan")
        x = (np.log(c) - math.log(c[0])) / (math.log(c[-1]) - math.log(c[0]))
        yn = (y - y[0]) / (y[-1] - y[0])
        return float(c[int(np.argmax(yn - x))])

    def tokens(self, blocks: float) -> float:
        return blocks * self.block_size

    def summary(self) -> dict[str, float | int | str | None]:
        return {
            "kind": self.kind,
            "block_size": self.block_size,
            "max_hit_rate": self.max_hit,
            "half_max_blocks": self.capacity_for(0.5),
            "p95_max_blocks": self.capacity_for(0.95),
            "knee_blocks": self.knee,
            "today_blocks": self.today,
            "today_hit_rate": self.at(self.today) if self.today else None,
            "sampling_rate": self.rate,
        }


def _grid(lo: float, hi: float, points: int) -> np.ndarray:
    lo = max(1.0, lo)
    hi = max(hi, lo * 2)
    g = np.unique(np.round(np.geomspace(lo, hi, points)).astype(np.int64))
    return g


def _sample_mask(keys: np.ndarray, rate: float) -> np.ndarray:
    """Blocks whose digest falls in the first ``rate`` of a hash of the 64-bit space."""
    if rate >= 1.0:
        return np.ones(len(keys), bool)
    x = keys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    threshold = np.uint64(int(rate * (1 << 32)))
    return (x >> np.uint64(32)) < threshold


def lru_curve(
    trace: BlockTrace,
    keys: np.ndarray | None = None,
    per_engine: bool | None = None,
    rate: float = 1.0,
    points: int = 64,
    today: int | None = None,
    tenants: bool = True,
) -> Curve:
    """The block-LRU curve of ``trace`` (see the module doc). ``per_engine``: distances within each
    recorded engine's stream (default: when the trace names more than one engine)."""
    if not len(trace):
        raise TraceError("the trace has no requests: no curve to draw")
    if not 0 < rate <= 1:
        raise TraceError(f"sampling rate {rate}: must be in (0, 1]")
    k = np.ascontiguousarray(trace.h if keys is None else keys, np.uint64)
    w = block_tokens(trace).astype(float)
    total = float(trace.prompt.sum())
    if total <= 0:
        raise TraceError("the trace's requests have no prompt tokens")
    offsets = trace.offsets
    if rate < 1:
        keep = _sample_mask(k, rate)
        k = k[keep]
        w = w[keep] / rate
        csum = np.concatenate([[0], np.cumsum(keep, dtype=np.int64)])
        offsets = csum[trace.offsets].astype(np.int64)
    split = per_engine if per_engine is not None else len(trace.engines) > 1
    d = np.empty(len(k), np.int64)
    if split:
        for e in np.unique(trace.engine):
            order = np.flatnonzero(trace.engine == e).astype(np.int64)
            de = kernels.lru_distances(k, offsets, order)
            sel = np.repeat(trace.engine == e, np.diff(offsets))
            d[sel] = de[sel]
    else:
        d = kernels.lru_distances(k, offsets, np.arange(len(trace), dtype=np.int64))
    finite = d < INF
    if rate < 1:
        d[finite] = np.ceil(d[finite] / rate).astype(np.int64)
    order = np.argsort(d[finite], kind="stable")
    dist = d[finite][order]
    wf = w[finite][order]
    if rate < 1 and len(wf):
        # SHARDS-adj: the sample's tokens fall short of (or exceed) the trace's by what its
        # heaviest blocks carry (a block every request shares is in or out of the sample whole);
        # that difference is booked at the smallest distance, where such blocks sit.
        wf[0] += float(block_tokens(trace).sum()) - float(w.sum())
    cum = np.cumsum(wf)
    max_hit = float(cum[-1]) / total if len(cum) else 0.0
    hi = float(dist[-1]) if len(dist) else 2.0
    grid = _grid(1, hi, points)
    idx = np.searchsorted(dist, grid, side="right")
    hit = np.where(idx > 0, cum[np.maximum(idx - 1, 0)], 0.0) / total
    by_tenant: dict[str, np.ndarray] = {}
    if tenants and len(trace.tenants) > 1:
        tb = np.repeat(trace.tenant, np.diff(offsets))
        for code, name in enumerate(trace.tenants):
            m = tb == code
            tt = float(trace.prompt[trace.tenant == code].sum())
            if not np.any(m) or tt <= 0:
                continue
            dm = d[m]
            wm = w[m]
            fm = dm < INF
            om = np.argsort(dm[fm], kind="stable")
            dd, cc = dm[fm][om], np.cumsum(wm[fm][om])
            ii = np.searchsorted(dd, grid, side="right")
            by_tenant[name or "(none)"] = np.where(ii > 0, cc[np.maximum(ii - 1, 0)], 0.0) / tt
    return Curve(
        "lru" if rate >= 1 else "lru_sampled",
        trace.block_size,
        grid,
        hit,
        max_hit,
        today,
        by_tenant,
        rate,
        dist,
        cum,
        total,
    )


def vllm_curve(
    trace: BlockTrace,
    sizes: np.ndarray | list[int] | None = None,
    keys: np.ndarray | None = None,
    policy: str = "recorded",
    engines: int | None = None,
    concurrent: bool = False,
    today: int | None = None,
    points: int = 16,
    progress: object | None = None,
) -> Curve:
    """The vLLM policy's curve: an exact replay at each of ``sizes`` (``num_gpu_blocks`` per
    engine; default ``points`` sizes from the smallest cache that fits the longest request to
    one that never evicts)."""
    if not len(trace):
        raise TraceError("the trace has no requests: no curve to draw")
    B = trace.block_size
    need = (trace.prompt + np.maximum(trace.output - 1, 0) + B - 1) // B
    smallest = int(need.max()) + 1
    if sizes is None:
        never_evicts = int(need.sum()) + 1  # every block any request ever held
        sizes = _grid(smallest, max(never_evicts, smallest * 2), points)
    sizes = np.array(sorted(int(s) for s in sizes), np.int64)
    hit = np.empty(len(sizes))
    tenants: dict[str, list[float]] = {}
    for j, s in enumerate(sizes):
        r = replay(
            trace,
            int(s),
            engines=engines,
            policy=policy,
            keys=keys,
            concurrent=concurrent,
            classify=False,
        )
        hit[j] = r.token_hit_rate()
        for name, v in r.per_tenant().items():
            tenants.setdefault(name, []).append(v)
        if callable(progress):
            progress(j + 1, len(sizes))
    return Curve(
        "vllm",
        B,
        sizes,
        hit,
        float(hit.max()) if len(hit) else 0.0,
        today,
        {k: np.array(v) for k, v in tenants.items()} if len(trace.tenants) > 1 else {},
    )
