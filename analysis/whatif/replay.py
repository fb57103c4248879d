"""Replay a block trace through vLLM's prefix cache: per request, where it runs and how many
of its prompt tokens are cached.

:func:`replay` runs :func:`.kernels.replay_pool` over a :class:`~warmscope.model.blocktrace.
BlockTrace`. Requests reach the engines in arrival order; with ``concurrent=True`` a request
holds its blocks from its arrival to its recorded end (``t_end``), as in-flight requests hold
theirs in the engine, otherwise each request ends before the next arrives (a trace without end
times is replayed that way). Where the replay can differ from an engine is documented in
docs/whatif.md ("Where the replay differs") and measured by tests/engine/test_whatif_engine.py.

Which identity each block has decides what the replay answers:

* ``h`` (default): the blocks as the engine cached them;
* ``unsalt={"acme", "bolt"}``: those tenants' blocks by their content (what dropping their
  cache salt would share; requests without a salt are identified by content too, which changes
  nothing for them — their hash and content chains are one-to-one);
* ``stable=True``: the drift-stable chain (a template's drifting blocks replaced by one
  placeholder per salt and position).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from warmscope.model.blocktrace import BLOCK_CLASSES, UNJUDGED, BlockTrace, TraceError

from . import kernels

__all__ = ["Replay", "replay", "effective_keys", "events", "POLICIES", "MAX_BLOCKS"]

POLICIES = tuple(kernels.POLICIES)
# Blocks one replay may hold in memory (about 80 bytes each across the pool's arrays).
MAX_BLOCKS = 50_000_000


@dataclass
class Replay:
    """One replay's outcome, per request (arrays aligned with the trace)."""

    trace: BlockTrace
    capacity: tuple[int, ...]  # num_gpu_blocks per engine
    policy: str
    engine: np.ndarray  # the engine each request ran on
    hits: np.ndarray  # hit blocks
    fit: np.ndarray  # 1 when the request fitted its engine's cache
    kinds: np.ndarray  # per block: 0 hit/not judged, 1 resident elsewhere, 2 resident nowhere
    peak: np.ndarray  # peak blocks held per engine
    scored: np.ndarray  # requests that count (warm-up requests do not)

    @property
    def cached(self) -> np.ndarray:
        """Cached prompt tokens per request (what the engine reports as ``cached_tokens``)."""
        return self.hits * self.trace.block_size

    def token_hit_rate(self, mask: np.ndarray | None = None) -> float:
        m = self.scored if mask is None else (self.scored & mask)
        p = float(self.trace.prompt[m].sum())
        return float(self.cached[m].sum()) / p if p > 0 else float("nan")

    def per_tenant(self) -> dict[str, float]:
        out = {}
        for k, name in enumerate(self.trace.tenants):
            m = self.trace.tenant == k
            if np.any(m & self.scored):
                out[name or "(none)"] = self.token_hit_rate(m)
        return out

    def missed_classes(self) -> dict[str, int]:
        """Missed prompt tokens the engine could have hit, by the recording's class where it
        judged the block, else by the replay's (elsewhere when another engine held it, cold at
        a block's first reference in the trace, evicted otherwise)."""
        return classify_misses(self)


def effective_keys(
    trace: BlockTrace, unsalt: Iterable[str] = (), stable: bool = False
) -> np.ndarray:
    """The block identities a replay uses (see the module doc)."""
    keys = (trace.s if stable else trace.h).copy()
    drop = set(unsalt)
    if drop:
        unknown = drop - set(trace.tenants)
        if unknown:
            raise TraceError(
                f"tenant(s) {', '.join(sorted(unknown))} are not in the trace "
                f"(it has {', '.join(t for t in trace.tenants if t) or 'no tenants'})"
            )
        codes = [k for k, name in enumerate(trace.tenants) if name in drop]
        req = np.isin(trace.tenant, codes) | (trace.salt == 0)
        per_block = np.repeat(req, np.diff(trace.offsets))
        keys[per_block] = trace.c[per_block]
    return keys


def events(trace: BlockTrace, concurrent: bool, warm: np.ndarray | None = None) -> np.ndarray:
    """The replay's event order: (kind, index) rows; kind 0 a request's end, 1 its arrival,
    2 an engine restart. By time; at equal times ends come first, then restarts, then
    arrivals in trace order. A request without a later end (``concurrent`` off, no ``t_end``,
    a warm-up request) ends right after its own arrival."""
    n = len(trace)
    idx = np.arange(n, dtype=np.int64)
    end = trace.t.copy()
    if concurrent:
        end = np.where(np.isnan(trace.t_end), trace.t, np.maximum(trace.t_end, trace.t))
        if warm is not None:
            end = np.where(warm.astype(bool), trace.t, end)
    later = end > trace.t
    times = np.concatenate([trace.t, end])
    rank = np.concatenate([np.full(n, 2), np.where(later, 0, 2)])
    seq = np.concatenate([idx.astype(float), np.where(later, idx, idx + 0.5)])
    kind = np.concatenate([np.ones(n, np.int64), np.zeros(n, np.int64)])
    who = np.concatenate([idx, idx])
    if trace.restarts:
        rt = np.array([t for t, _ in trace.restarts], float)
        times = np.concatenate([times, rt])
        rank = np.concatenate([rank, np.ones(len(rt))])
        seq = np.concatenate([seq, np.arange(len(rt), dtype=float)])
        kind = np.concatenate([kind, np.full(len(rt), 2, np.int64)])
        who = np.concatenate([who, np.array([e for _, e in trace.restarts], np.int64)])
    o = np.lexsort((seq, rank, times))
    return np.ascontiguousarray(np.column_stack([kind[o], who[o]]))


def replay(
    trace: BlockTrace,
    capacity: int | Sequence[int],
    engines: int | None = None,
    policy: str = "recorded",
    concurrent: bool = False,
    seed: int = 0,
    keys: np.ndarray | None = None,
    classify: bool = True,
    warm: np.ndarray | None = None,
) -> Replay:
    """Replay ``trace`` on ``engines`` engines of ``capacity`` blocks each (vLLM's
    ``num_gpu_blocks``: one is the null block) routed by ``policy`` (:data:`POLICIES`)."""
    if policy not in kernels.POLICIES:
        raise TraceError(f"routing policy {policy!r}: choose one of {', '.join(POLICIES)}")
    n_eng = engines if engines is not None else max(1, len(trace.engines))
    caps = [int(capacity)] * n_eng if isinstance(capacity, (int, np.integer)) else list(capacity)
    if len(caps) != n_eng:
        raise TraceError(f"{len(caps)} capacities for {n_eng} engines")
    for c in caps:
        if c < 2:
            raise TraceError(
                f"capacity {c} blocks: an engine needs at least 2 (one is vLLM's null block)"
            )
    if sum(caps) > MAX_BLOCKS:
        raise TraceError(
            f"capacity {sum(caps):,} blocks in all is more than one replay holds in memory "
            f"({MAX_BLOCKS:,}); use the LRU curve with sampling for larger caches"
        )
    k = trace.h if keys is None else keys
    w = np.zeros(len(trace), np.uint8) if warm is None else warm.astype(np.uint8)
    eng, hits, fit, kinds, peak = kernels.replay_pool(
        np.ascontiguousarray(k, np.uint64),
        trace.offsets,
        trace.full.astype(np.int64),
        trace.prompt.astype(np.int64),
        trace.output.astype(np.int64),
        trace.tenant.astype(np.int64),
        trace.engine.astype(np.int64),
        w,
        events(trace, concurrent, w),
        np.array(caps, np.int64),
        int(trace.block_size),
        kernels.POLICIES[policy],
        int(seed),
        bool(classify),
    )
    return Replay(trace, tuple(caps), policy, eng, hits, fit, kinds, peak, w == 0)


def first_references(keys: np.ndarray) -> np.ndarray:
    """True at each block reference that is the first of its identity in the trace."""
    _, first = np.unique(keys, return_index=True)
    out = np.zeros(len(keys), bool)
    out[first] = True
    return out


def classify_misses(r: Replay, keys: np.ndarray | None = None) -> dict[str, int]:
    t = r.trace
    k = t.h if keys is None else keys
    out = dict.fromkeys(BLOCK_CLASSES[1:], 0)
    firsts = first_references(k)
    judged = np.flatnonzero(r.kinds > 0)
    B = t.block_size
    rec = t.cls[judged]
    for name_i, name in enumerate(BLOCK_CLASSES):
        if name_i == 0:
            continue
        out[name] += int(np.sum(rec == name_i)) * B
    mine = judged[(rec == UNJUDGED) | (rec == 0)]
    kinds = r.kinds[mine]
    out["elsewhere"] += int(np.sum(kinds == 1)) * B
    nowhere = mine[kinds == 2]
    cold = firsts[nowhere]
    out["cold"] += int(cold.sum()) * B
    out["evicted"] += int((~cold).sum()) * B
    return out
