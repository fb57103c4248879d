"""Does warm-up work on this traffic? Every warm-up strategy judged on a block trace, paired.

At each of ``restarts`` points spread over the trace an engine restarts with an empty prefix
cache. Each strategy chooses a warm set of at most ``K`` blocks from the trace *before* the
restart; the warm set is preloaded (as prompts that compute those blocks, one per chain, the most
valuable last so that they are freed last), and the next ``horizon`` seconds of the trace are
replayed through the exact vLLM pool (:mod:`.kernels`) from there. Every strategy meets the same
restarts and the same traffic: the comparison is paired.

Strategies (``STRATEGIES``):

* ``none`` — the empty cache;
* ``static_topk`` — the K blocks read most often in the hour before the restart;
* ``recency`` — the K blocks read most recently;
* ``heat`` — the source design's heat decay: reads weighted by ``e^(−λ·age)``, λ tied to the
  TTFT SLO as the seed defines it (:func:`warmscope.analysis.heat.slo_lambda`);
* ``predictive`` — warmscope's predictive strategy on blocks: each block's rate is the hour's,
  capped by what the last ten minutes confirm; the chance it is read within the horizon follows
  the Pareto/NBD "alive" model (demand that ends at rate ``death``), and a block is warmed only
  when that chance is at least ``min_chance`` and its chain's earlier blocks are warmed too
  (a block's chance is at most its predecessor's): its budget is what the forecast supports;
* ``oracle`` — the blocks actually read in the horizon after the restart (ranked by how often
  they are read there, or by how soon: the better of the two at each restart): the bound no
  strategy can pass; it includes content nobody had sent before the restart;
* ``oracle_seen`` — the same among blocks the trace showed before the restart: the bound for a
  strategy that learns from traffic.

A chosen block brings the blocks before it in its chain (a block is only ever hit after them);
the budget counts them all. Scores per restart and horizon: cached prompt tokens of the requests
arriving within ``h`` seconds (1, 5 and 15 minutes by default), the warm set's precision (the
share of warmed blocks some request hit within ``h``), the warm-up's own prefill (the blocks it
computed). Gains over ``none`` are paired differences per restart; intervals are t intervals
over the restarts (which can overlap in time: neighbouring restarts share traffic, so the
intervals are a lower bound on the uncertainty), the share of the oracle's gain a percentile
bootstrap over restarts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from warmscope.model.blocktrace import BlockTrace, TraceError

from ..heat import slo_lambda
from . import kernels

__all__ = [
    "STRATEGIES",
    "HORIZONS_S",
    "Evaluation",
    "Cell",
    "evaluate",
    "warm_set",
    "warm_order",
    "chains_of",
    "read_chance",
    "warmed_cached_tokens",
]

STRATEGIES = ("none", "static_topk", "recency", "heat", "predictive", "oracle_seen", "oracle")
ORACLES = ("oracle_seen", "oracle")
HORIZONS_S = (60.0, 300.0, 900.0)
HISTORY_S = 3600.0  # what static top-K counts over
RECENT_S = 600.0  # what confirms a rate (predictive)
MIN_HISTORY_S = 300.0  # a restart needs this much trace before it
MIN_RESTARTS = 30
DEFAULT_SLO_MS = 1000.0
DEATH_PER_S = 1.0 / 1800.0  # demand that ends: half-life of about 20 minutes
MIN_CHANCE = 0.6  # predictive: warm a block at this chance of a read (warm_min_prob_kv)
_T975 = {
    1: 12.71,
    2: 4.30,
    3: 3.18,
    4: 2.78,
    5: 2.57,
    6: 2.45,
    8: 2.31,
    10: 2.23,
    15: 2.13,
    20: 2.09,
    29: 2.05,
    40: 2.02,
    60: 2.00,
    120: 1.98,
}


def _t975(df: int) -> float:
    for k in sorted(_T975):
        if df <= k:
            return _T975[k]
    return 1.96


def read_chance(rate: np.ndarray, idle_s: np.ndarray, horizon_s: float, death: float) -> np.ndarray:
    """The chance of a read within ``horizon_s`` for a rate (per s) while demand lasts, demand
    that ends at ``death`` per second, ``idle_s`` since the last read (Pareto/NBD "alive"):
    alive = 1 / (1 + μ/(λ+μ)·(e^((λ+μ)d) − 1)), read = alive·λ/(λ+μ)·(1 − e^(−(λ+μ)h))."""
    s = rate + death
    c = np.where(s > 0, death / np.maximum(s, 1e-300), 0.0)
    stay = np.exp(-s * np.maximum(idle_s, 0.0))
    # no death (c = 0): always alive (stay / stay is 0 / 0 once stay underflows)
    alive = np.where(c > 0, stay / np.maximum(stay + c * (1.0 - stay), 1e-300), 1.0)
    out: np.ndarray = np.where(
        rate > 0, alive * rate / np.maximum(s, 1e-300) * -np.expm1(-s * horizon_s), 0.0
    )
    return out


# ------------------------------------------------------------------ the trace's shape
@dataclass
class _Flat:
    """The trace as flat arrays: per block reference its request, time, position and parent."""

    keys: np.ndarray
    req: np.ndarray
    t: np.ndarray
    pos: np.ndarray
    parent: np.ndarray  # the previous block's identity in the chain (0 at the root)


def _flat(trace: BlockTrace) -> _Flat:
    lens = np.diff(trace.offsets)
    req = np.repeat(np.arange(len(trace)), lens)
    pos = np.arange(trace.n_blocks) - np.repeat(trace.offsets[:-1], lens)
    # blocks an engine caches: the chain's real full blocks (a Mooncake chain's partial last
    # block is never cached)
    real = pos < np.repeat(np.minimum(trace.full, trace.prompt // trace.block_size), lens)
    keys = trace.h
    parent = np.zeros(len(keys), np.uint64)
    parent[1:] = keys[:-1]
    parent[pos == 0] = 0
    return _Flat(keys[real], req[real], trace.t[req[real]], pos[real], parent[real])


@dataclass
class _History:
    """The blocks seen in a range of references: each once, with its read count, last read,
    decayed count and chain parent."""

    uniq: np.ndarray
    count: np.ndarray
    last: np.ndarray
    first: np.ndarray
    times: np.ndarray  # reference times
    inv: np.ndarray  # reference -> its block in uniq
    parents: dict[int, int]


def _history(f: _Flat, lo: int, hi: int, keep: np.ndarray | None = None) -> _History:
    """The history of references [lo, hi) (``keep``: only those where it is true)."""
    k, t, par = f.keys[lo:hi], f.t[lo:hi], f.parent[lo:hi]
    if keep is not None:
        k, t, par = k[keep], t[keep], par[keep]
    uniq, inv = np.unique(k, return_inverse=True)
    last = np.full(len(uniq), -np.inf)
    np.maximum.at(last, inv, t)
    first = np.full(len(uniq), np.inf)
    np.minimum.at(first, inv, t)
    parents = dict(zip(k.tolist(), par.tolist(), strict=True))
    return _History(uniq, np.bincount(inv, minlength=len(uniq)), last, first, t, inv, parents)


def _scores(hist: _History, now: float, strategy: str, horizon: float, lam: float) -> np.ndarray:
    """Each block of ``hist`` scored by ``strategy`` for a restart at ``now``; higher is warmed
    first."""
    if strategy == "recency":
        return hist.last
    if strategy in ("static_topk", "oracle"):
        out: np.ndarray = hist.count + hist.last * 1e-12  # ties: the more recent
        return out
    if strategy == "oracle_first":  # the future's blocks, the soonest read first
        soon: np.ndarray = -hist.first
        return soon
    if strategy == "heat":
        w = np.exp(-lam * (now - hist.times))
        heat: np.ndarray = np.bincount(hist.inv, weights=w, minlength=len(hist.uniq))
        return heat
    if strategy == "predictive":
        t = hist.times
        span = max(now - float(t.min()), 1.0) if len(t) else 1.0
        hour = hist.count / span
        recent = t >= now - RECENT_S
        seen = np.bincount(hist.inv[recent], minlength=len(hist.uniq)) / min(RECENT_S, span)
        rate = np.where(span >= RECENT_S, np.minimum(hour, seen), hour)
        return read_chance(rate, now - hist.last, horizon, DEATH_PER_S)
    raise TraceError(f"warm-up strategy {strategy!r}: one of {', '.join(STRATEGIES)}")


def warm_order(
    hist: _History,
    now: float,
    strategy: str,
    k: int,
    horizon: float = 900.0,
    lam: float = 0.01,
    min_chance: float = MIN_CHANCE,
) -> tuple[list[int], dict[int, float]]:
    """The blocks a strategy warms, in the order it adds them, at most ``k``: blocks by score,
    each with the blocks before it in its chain, until the next one does not fit. The sets for
    smaller budgets are the order's prefixes. Returns (order, each block's value)."""
    if strategy == "none" or k <= 0 or not len(hist.uniq):
        return [], {}
    sc = _scores(hist, now, strategy, horizon, lam)
    value = dict(zip(hist.uniq.tolist(), sc.tolist(), strict=True))
    parents = hist.parents
    if strategy == "predictive":
        value = _chain_capped(value, parents)
        keep = {b for b, p in value.items() if p >= min_chance}
    else:
        keep = None
    order: list[int] = []
    chosen: set[int] = set()
    for i in np.argsort(-sc, kind="stable").tolist():
        b = int(hist.uniq[i])
        if keep is not None and b not in keep:
            continue
        if b in chosen:
            continue
        path: list[int] = []
        x = b
        while x and x not in chosen and len(path) <= len(parents):  # (a cycle: a bad trace)
            path.append(x)
            x = parents.get(x, 0)
        if len(order) + len(path) > k:
            break
        for y in reversed(path):  # root first
            chosen.add(y)
            order.append(y)
        if len(order) == k:
            break
    return order, value


def chains_of(
    order: list[int], parents: dict[int, int], value: dict[int, float]
) -> list[list[int]]:
    """A prefix-closed block set as chains (root first), one per block no other block of the set
    follows, the most valuable chain last (it is freed last, so evicted last)."""
    chosen = set(order)
    has_child = {parents.get(b, 0) for b in chosen}
    out = []
    for b in order:
        if b in has_child:
            continue
        path: list[int] = []
        x = b
        while x and len(path) <= len(chosen):
            path.append(x)
            x = parents.get(x, 0)
        out.append((value.get(b, 0.0), path[::-1]))
    out.sort(key=lambda c: c[0])
    return [c for _, c in out]


def warm_set(
    f: _Flat,
    lo: int,
    hi: int,
    now: float,
    strategy: str,
    k: int,
    horizon: float = 900.0,
    lam: float = 0.01,
    future: tuple[int, int] | None = None,
    min_chance: float = MIN_CHANCE,
) -> list[list[int]]:
    """The warm set of ``strategy`` for a restart at ``now`` as chains, from the history in
    references [lo, hi) (the oracle: from ``future``)."""
    if strategy == "oracle":
        assert future is not None
        hist = _history(f, *future)
    else:
        hist = _history(f, lo, hi)
    order, value = warm_order(hist, now, strategy, k, horizon, lam, min_chance)
    return chains_of(order, hist.parents, value)


def _chain_capped(sc: dict[int, float], parents: dict[int, int]) -> dict[int, float]:
    """A block's chance at most its predecessor's (it is read only after it)."""
    out: dict[int, float] = {}
    for b in sc:
        if b in out:
            continue
        stack: list[int] = []
        x = b
        while x and x not in out and len(stack) <= len(sc):
            stack.append(x)
            x = parents.get(x, 0)
        above = out[x] if x else 1.0
        for y in reversed(stack):
            above = min(above, sc.get(y, 0.0))
            out[y] = above
    return out


# ------------------------------------------------------------------ evaluation
@dataclass
class Cell:
    """One strategy at one budget and horizon, over every restart."""

    strategy: str
    k: int
    horizon_s: float
    gain_tokens: float  # mean cached tokens gained over none, per restart
    gain_ci: tuple[float, float]
    oracle_share: float  # mean gain / the oracle's mean gain (every block the horizon reads)
    oracle_share_ci: tuple[float, float]
    seen_share: float  # mean gain / the seen oracle's (blocks the trace showed before)
    seen_share_ci: tuple[float, float]
    hit_rate: float  # token hit rate of the requests within the horizon
    precision: float  # share of warmed blocks hit within the horizon
    warm_blocks: float  # mean blocks warmed (the warm-up's own prefill, in blocks)
    requests: float  # mean requests within the horizon per restart

    def row(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "k_blocks": self.k,
            "horizon_s": self.horizon_s,
            "gain_tokens_per_restart": self.gain_tokens,
            "gain_ci": list(self.gain_ci),
            "oracle_share": self.oracle_share,
            "oracle_share_ci": list(self.oracle_share_ci),
            "seen_oracle_share": self.seen_share,
            "seen_oracle_share_ci": list(self.seen_share_ci),
            "hit_rate": self.hit_rate,
            "precision": self.precision,
            "warm_blocks": self.warm_blocks,
            "requests_per_restart": self.requests,
        }


@dataclass
class Evaluation:
    trace_source: str
    block_size: int
    capacity: int
    restarts: np.ndarray  # times
    ks: tuple[int, ...]
    horizons: tuple[float, ...]
    cells: list[Cell] = field(default_factory=list)
    per_restart: dict[tuple[str, int, float], np.ndarray] = field(default_factory=dict)
    lam: float = 0.0
    slo_ms: float = DEFAULT_SLO_MS

    def cell(self, strategy: str, k: int, horizon: float) -> Cell:
        for c in self.cells:
            if c.strategy == strategy and c.k == k and c.horizon_s == horizon:
                return c
        raise KeyError((strategy, k, horizon))

    def best(self, horizon: float | None = None) -> Cell:
        """The strategy and budget with the largest gain at ``horizon`` (default the longest),
        the oracle left out."""
        h = horizon if horizon is not None else max(self.horizons)
        cands = [c for c in self.cells if c.horizon_s == h and c.strategy not in ("none", *ORACLES)]
        return max(cands, key=lambda c: c.gain_tokens)

    def settled_by(self) -> float | None:
        """The shortest horizon after which no strategy gains anything more at any budget (every
        cell's gain equal to the one at that horizon), when it is not the longest: by then a
        warmed cache and a cold one hold the same blocks (the cache turned over), so the later
        minutes add no difference. None when gains still move at the longest horizon."""
        hs = sorted(self.horizons)
        rows = self.table_rows()
        if not rows:
            return None
        for i, h in enumerate(hs[:-1]):
            if all(c.gain_tokens == cs[i].gain_tokens for _, _, cs in rows for c in cs[i:]):
                return h
        return None

    def settled_note(self, settled: float) -> str:
        """The sentence for :meth:`settled_by`'s horizon (the page and the CLI print it)."""
        longest = max(self.horizons)
        return (
            f"Every strategy saves the same within {settled / 60:g} min as within "
            f"{longest / 60:g} min: by {settled / 60:g} min after a restart the warmed cache and "
            f"the cold one hold the same blocks (a cache of {self.capacity:,} blocks turns over "
            "within minutes on this traffic), so the later minutes add no difference."
        )

    def table_rows(self) -> list[tuple[int, str, list[Cell]]]:
        """The evaluation as a table: per K, per strategy in STRATEGIES order (``none``, the
        baseline, left out), its cells in horizon order; what the CLI and the dashboard print."""
        hs = sorted(self.horizons)
        out = []
        for k in self.ks:
            for s in STRATEGIES[1:]:
                try:
                    out.append((k, s, [self.cell(s, k, h) for h in hs]))
                except KeyError:  # not evaluated
                    continue
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "trace": self.trace_source,
            "block_size": self.block_size,
            "capacity_blocks": self.capacity,
            "restarts": len(self.restarts),
            "k_blocks": list(self.ks),
            "horizons_s": list(self.horizons),
            "heat_lambda_per_s": self.lam,
            "ttft_slo_ms": self.slo_ms,
            "cells": [c.row() for c in self.cells],
        }


def _restart_times(trace: BlockTrace, n: int, horizon: float) -> np.ndarray:
    t0, t1 = float(trace.t[0]), float(trace.t[-1])
    if t1 <= t0:
        raise TraceError(
            "the trace has no time span (its timestamps are all equal): warm-up cannot be "
            "judged without arrival times"
        )
    first, last = t0 + MIN_HISTORY_S, t1 - horizon
    if last <= first:
        raise TraceError(
            f"the trace spans {(t1 - t0) / 60:.1f} min: too short for {MIN_HISTORY_S / 60:.0f} "
            f"min of history before a restart and a {horizon / 60:.0f}-min horizon after it"
        )
    return np.linspace(first, last, n)


def evaluate(
    trace: BlockTrace,
    capacity: int,
    ks: Sequence[int],
    restarts: int = MIN_RESTARTS,
    horizons: Sequence[float] = HORIZONS_S,
    strategies: Sequence[str] = STRATEGIES,
    slo_ms: float = DEFAULT_SLO_MS,
    min_chance: float = MIN_CHANCE,
    progress: Callable[[int, int], None] | None = None,
    seed: int = 0,
) -> Evaluation:
    """The paired evaluation (see the module doc). ``capacity``: vLLM's num_gpu_blocks of the
    restarted engine; ``ks``: warm-set budgets in blocks (at most ``capacity − 1``)."""
    strategies = _checked(capacity, ks, restarts, strategies)
    times = _restart_times(trace, restarts, max(horizons))
    lam = slo_lambda(slo_ms)
    ev = Evaluation(
        trace.source,
        trace.block_size,
        capacity,
        times,
        tuple(ks),
        tuple(horizons),
        lam=lam,
        slo_ms=slo_ms,
    )
    got = _replays(trace, capacity, ks, times, horizons, strategies, lam, min_chance, progress)
    _summarise(ev, got, seed)
    return ev


def _checked(
    capacity: int, ks: Sequence[int], restarts: int, strategies: Sequence[str]
) -> Sequence[str]:
    """The strategies to evaluate ("none", the baseline, always among them), or the
    :class:`TraceError` that says which input cannot be used."""
    if restarts < MIN_RESTARTS:
        raise TraceError(
            f"{restarts} restart points: at least {MIN_RESTARTS} are needed for an interval "
            "worth reading"
        )
    usable = capacity - 1
    for k in ks:
        if k > usable:
            raise TraceError(
                f"K = {k:,} blocks is more than the cache holds ({usable:,} usable blocks of "
                f"{capacity:,}): a warm set cannot be larger than the cache"
            )
        if k < 1:
            raise TraceError(f"K = {k}: a warm set of at least one block")
    for s in strategies:
        if s not in STRATEGIES:
            raise TraceError(f"warm-up strategy {s!r}: one of {', '.join(STRATEGIES)}")
    return strategies if "none" in strategies else ("none", *strategies)


Scores = dict[tuple[str, int, float], list[tuple[float, float, float, float, float]]]


def _replays(
    trace: BlockTrace,
    capacity: int,
    ks: Sequence[int],
    times: np.ndarray,
    horizons: Sequence[float],
    strategies: Sequence[str],
    lam: float,
    min_chance: float,
    progress: Callable[[int, int], None] | None,
) -> Scores:
    """Per (strategy, k, horizon): per restart cached tokens, prompt tokens, precision, blocks
    warmed and their cost: each restart's window replayed from an empty cache preloaded with
    the strategy's warm set, chosen from the hour before."""
    H = max(horizons)
    f = _flat(trace)
    got: Scores = {}
    total = len(times) * len(strategies) * len(ks)
    done = 0
    kmax = max(ks)
    for now in times:
        lo = int(np.searchsorted(f.t, now - HISTORY_S, side="left"))
        hi = int(np.searchsorted(f.t, now, side="left"))
        first = int(np.searchsorted(trace.t, now, side="left"))
        last = int(np.searchsorted(trace.t, now + H, side="right"))
        window = np.arange(first, last)
        past = _history(f, lo, hi)
        for s in strategies:
            if s in ORACLES:
                if s == ORACLES[0] or ORACLES[0] not in strategies:
                    oracles = [x for x in ORACLES if x in strategies]
                    _oracle(trace, f, now, hi, window, ks, horizons, capacity, got, oracles)
                done += len(ks)
                if progress is not None:
                    progress(done, total)
                continue
            order, value = warm_order(past, now, s, kmax, H, lam, min_chance)
            for k in ks:
                chains = chains_of(order[:k], past.parents, value)
                hits, warmed = _replay_window(trace, window, chains, capacity)
                for h in horizons:
                    got.setdefault((s, k, h), []).append(
                        _score(trace, window, hits, warmed, now + h)
                    )
                done += 1
                if progress is not None:
                    progress(done, total)
    return got


def _summarise(ev: Evaluation, got: Scores, seed: int) -> None:
    """One cell per (strategy, k, horizon): the paired gain over "none" with its t interval,
    the oracles' shares (bootstrap intervals) and the warm sets' precision and size."""
    rng = np.random.default_rng(seed)
    for (s, k, h), rows in got.items():
        a = np.array(rows)
        base = np.array(got[("none", k, h)])
        d = a[:, 0] - base[:, 0]
        ev.per_restart[(s, k, h)] = d
        n = len(d)
        half = _t975(n - 1) * float(d.std(ddof=1)) / math.sqrt(n) if n > 1 else math.nan
        share, share_ci = _share(d, got, "oracle", k, h, base, rng)
        seen, seen_ci = _share(d, got, "oracle_seen", k, h, base, rng)
        nwarm = a[:, 3]
        ev.cells.append(
            Cell(
                s,
                k,
                h,
                float(d.mean()),
                (float(d.mean()) - half, float(d.mean()) + half),
                share,
                share_ci,
                seen,
                seen_ci,
                float(a[:, 0].sum() / max(a[:, 1].sum(), 1.0)),
                float(np.nansum(a[:, 2] * nwarm) / nwarm.sum()) if nwarm.sum() else math.nan,
                float(nwarm.mean()),
                float(a[:, 4].mean()),
            )
        )


def _share(
    d: np.ndarray,
    got: dict[tuple[str, int, float], list[tuple[float, float, float, float, float]]],
    oracle: str,
    k: int,
    h: float,
    base: np.ndarray,
    rng: np.random.Generator,
) -> tuple[float, tuple[float, float]]:
    """The mean gain ``d`` as a share of an oracle's, with a percentile bootstrap interval over
    the restarts (the pairs resampled together)."""
    if (oracle, k, h) not in got:
        return math.nan, (math.nan, math.nan)
    o = np.array(got[(oracle, k, h)])[:, 0] - base[:, 0]
    if o.mean() <= 0:
        return math.nan, (math.nan, math.nan)
    n = len(d)
    idx = rng.integers(0, n, size=(2000, n))
    om = o[idx].mean(axis=1)
    boots = d[idx].mean(axis=1) / np.where(om > 0, om, np.nan)
    ci = (float(np.nanpercentile(boots, 2.5)), float(np.nanpercentile(boots, 97.5)))
    return float(d.mean() / o.mean()), ci


def _score(
    trace: BlockTrace, window: np.ndarray, hits: np.ndarray, warmed: set[int], until: float
) -> tuple[float, float, float, float, float]:
    """(cached tokens, prompt tokens, precision, blocks warmed, requests) of the window's
    requests up to ``until``."""
    m = trace.t[window] <= until
    cached = float((hits[m] * trace.block_size).sum())
    prompt = float(trace.prompt[window][m].sum())
    prec = _precision(trace, window[m], hits[m], warmed)
    return cached, prompt, prec, float(len(warmed)), float(m.sum())


def _oracle(
    trace: BlockTrace,
    f: _Flat,
    now: float,
    hi: int,
    window: np.ndarray,
    ks: Sequence[int],
    horizons: Sequence[float],
    capacity: int,
    got: dict[tuple[str, int, float], list[tuple[float, float, float, float, float]]],
    strategies: Sequence[str] = ORACLES,
) -> None:
    """The clairvoyant references: for each horizon, the blocks read within it — ranked by how
    often they are read there, or by how soon (the better of the two for this restart).
    ``oracle``: every such block, new content included (the bound no strategy can pass);
    ``oracle_seen``: only blocks the trace showed before the restart (the bound for a strategy
    that learns from traffic)."""
    seen = np.unique(f.keys[:hi])
    for h in horizons:
        end = int(np.searchsorted(f.t, now + h, side="right"))
        found: dict[str, dict[int, tuple[float, float, float, float, float]]] = {}
        # the seen oracle first: the full one may take its sets too (they are clairvoyant)
        for name, keep in (("oracle_seen", np.isin(f.keys[hi:end], seen)), ("oracle", None)):
            fut = _history(f, hi, end, keep)
            best = dict(found.get("oracle_seen", {}))
            for how in ("oracle", "oracle_first"):
                order, value = warm_order(fut, now, how, max(ks), h)
                for k in ks:
                    chains = chains_of(order[:k], fut.parents, value)
                    hits, warmed = _replay_window(trace, window, chains, capacity)
                    sc = _score(trace, window, hits, warmed, now + h)
                    if k not in best or sc[0] > best[k][0]:
                        best[k] = sc
            found[name] = best
        for name in strategies:
            for k in ks:
                got.setdefault((name, k, h), []).append(found[name][k])


def _replay_window(
    trace: BlockTrace, window: np.ndarray, chains: list[list[int]], capacity: int
) -> tuple[np.ndarray, set[int]]:
    """The window's requests on an empty engine preloaded with ``chains``; returns each
    request's hit blocks and the warmed blocks."""
    B = trace.block_size
    nw = len(chains)
    lens = np.diff(trace.offsets)[window]
    keys = [np.array(c, np.uint64) for c in chains]
    keys += [trace.h[trace.offsets[i] : trace.offsets[i + 1]] for i in window]
    all_lens = np.array([len(c) for c in chains] + lens.tolist(), np.int64)
    offsets = np.zeros(len(all_lens) + 1, np.int64)
    np.cumsum(all_lens, out=offsets[1:])
    flat = np.concatenate(keys) if keys else np.zeros(0, np.uint64)
    n = len(all_lens)
    prompt = np.concatenate([all_lens[:nw] * B, trace.prompt[window]]).astype(np.int64)
    output = np.concatenate([np.ones(nw, np.int64), trace.output[window]]).astype(np.int64)
    real = np.concatenate([all_lens[:nw], trace.full[window]]).astype(np.int64)
    warm = np.zeros(n, np.uint8)
    warm[:nw] = 1
    events = np.empty((2 * n, 2), np.int64)
    events[0::2, 0] = 1
    events[1::2, 0] = 0
    events[0::2, 1] = np.arange(n)
    events[1::2, 1] = np.arange(n)
    _, hits, fit, _, _ = kernels.replay_pool(
        np.ascontiguousarray(flat),
        offsets,
        real,
        prompt,
        output,
        np.zeros(n, np.int64),
        np.zeros(n, np.int64),
        warm,
        events,
        np.array([capacity], np.int64),
        B,
        0,
        0,
        False,
    )
    warmed = set(flat[: offsets[nw]].tolist()) if nw else set()
    return hits[nw:] * fit[nw:], warmed


def warmed_cached_tokens(
    trace: BlockTrace, chains: Sequence[Sequence[int]], capacity: int
) -> np.ndarray:
    """Cached prompt tokens of every request of ``trace`` on one engine of ``capacity`` blocks
    that starts empty just before the first request and is preloaded with ``chains`` (block-hash
    chains, in the order the warm-up sends them): the evaluation's replay of one restart, for a
    warm set chosen elsewhere (e.g. the prefixes a warm-up run wrote)."""
    if capacity < 2:
        raise TraceError(f"capacity {capacity}: an engine holds at least two blocks")
    hits, _ = _replay_window(
        trace, np.arange(len(trace)), [[int(b) for b in c] for c in chains], capacity
    )
    return (hits * trace.block_size).astype(np.int64)


def _precision(trace: BlockTrace, reqs: np.ndarray, hits: np.ndarray, warmed: set[int]) -> float:
    if not warmed:
        return math.nan
    read: set[int] = set()
    for i, hcount in zip(reqs.tolist(), hits.tolist(), strict=True):
        if hcount:
            lo = int(trace.offsets[i])
            read.update(trace.h[lo : lo + hcount].tolist())
    return len(read & warmed) / len(warmed)


# ------------------------------------------------------------------ the advice
OBJECTIVES = {
    "ttft": "prefill tokens the requests after a restart skip (their time to first token); the "
    "warm-up's own prefill runs before the replica takes traffic",
    "net_gpu": "prefill tokens saved minus the warm-up's own prefill (GPU time)",
}


@dataclass
class Recommendation:
    objective: str
    strategy: str
    k: int
    horizon_s: float
    gain_tokens: float  # per restart, within the horizon
    gain_ci: tuple[float, float]
    warm_tokens: float  # the warm-up's own prefill, per restart
    net_tokens: float
    net_ci: tuple[float, float]
    oracle_share: float
    oracle_share_ci: tuple[float, float]
    seen_share: float
    seen_share_ci: tuple[float, float]
    requests: float  # requests within the horizon per restart
    per_token_s: float = math.nan  # what a missed token costs (NaN: not priced)
    restarts_per_hour: float = math.nan
    widened: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def ttft_saved_s_per_request(self) -> float:
        return self.gain_tokens / max(self.requests, 1.0) * self.per_token_s

    @property
    def lead_s(self) -> float:
        """The warm-up's duration: its prefill at the measured cost per token."""
        return self.warm_tokens * self.per_token_s

    def as_dict(self) -> dict[str, Any]:
        return {
            "objective": self.objective,
            "objective_means": OBJECTIVES[self.objective],
            "strategy": self.strategy,
            "k_blocks": self.k,
            "horizon_s": self.horizon_s,
            "prefill_tokens_saved_per_restart": self.gain_tokens,
            "prefill_tokens_saved_ci": list(self.gain_ci),
            "warm_up_prefill_tokens_per_restart": self.warm_tokens,
            "net_tokens_per_restart": self.net_tokens,
            "net_tokens_ci": list(self.net_ci),
            "share_of_the_oracle": self.oracle_share,
            "share_of_the_oracle_ci": list(self.oracle_share_ci),
            "share_of_the_seen_oracle": self.seen_share,
            "share_of_the_seen_oracle_ci": list(self.seen_share_ci),
            "ttft_saved_s_per_request": None
            if math.isnan(self.per_token_s)
            else self.ttft_saved_s_per_request,
            "lead_s": None if math.isnan(self.per_token_s) else self.lead_s,
            "restarts_per_hour": None
            if math.isnan(self.restarts_per_hour)
            else self.restarts_per_hour,
            "search": self.widened,
            "notes": self.notes,
        }


def _net(ev: Evaluation, s: str, k: int, h: float) -> tuple[float, tuple[float, float], float]:
    d = ev.per_restart[(s, k, h)]
    c = ev.cell(s, k, h)
    net = d - c.warm_blocks * ev.block_size
    n = len(net)
    half = _t975(n - 1) * float(net.std(ddof=1)) / math.sqrt(n) if n > 1 else math.nan
    m = float(net.mean())
    return m, (m - half, m + half), c.warm_blocks * ev.block_size


def _paired(
    ev: Evaluation, objective: str, h: float, a: Cell, b: Cell
) -> tuple[float, float, float]:
    """``a`` minus ``b`` on ``objective`` over the same restarts: (mean, 95 % CI low, high)."""
    diff = ev.per_restart[(a.strategy, a.k, h)] - ev.per_restart[(b.strategy, b.k, h)]
    if objective == "net_gpu":
        diff = diff - (a.warm_blocks - b.warm_blocks) * ev.block_size
    n = len(diff)
    half = _t975(n - 1) * float(diff.std(ddof=1)) / math.sqrt(n) if n > 1 else math.nan
    m = float(diff.mean())
    return m, m - half, m + half


# The strategies from the simplest to the most elaborate (what each must keep and tune): the hour's
# read counts, the last reads, decayed counts, a fitted model with its threshold. When a simpler
# one cannot be told apart from the best and warms no more, it is the one recommended.
SIMPLEST_FIRST = ("static_topk", "recency", "heat", "predictive")


def _passed_over(simpler: Cell, chosen: Cell, score: float, floor: float) -> str:
    """Why ``simpler``, tied with ``chosen`` within the noise, is not recommended instead:
    ``score`` is its score on the objective, ``floor`` no warm-up's."""
    if score <= floor:
        return (
            f"it does not beat no warm-up on this objective ({score:+,.1f} tokens per restart "
            f"against {floor:+,.1f})"
        )
    times = (
        f"{simpler.warm_blocks / chosen.warm_blocks:.1f} times the blocks"
        if chosen.warm_blocks > 0
        else "more blocks"
    )
    return (
        f"its warm-up computes {times} ({simpler.warm_blocks:,.0f} against "
        f"{chosen.warm_blocks:,.0f})"
    )


def recommend(
    ev: Evaluation,
    objective: str = "ttft",
    horizon: float | None = None,
    per_token_s: float = math.nan,
    restarts_per_hour: float = math.nan,
    names: Mapping[str, str] | None = None,
) -> Recommendation:
    """The strategy and warm-set size that maximise ``objective`` (:data:`OBJECTIVES`) at
    ``horizon`` (default the longest), from a paired evaluation. ``none`` wins when warming does
    not pay on that objective: the recommendation then says so. A simpler strategy
    (:data:`SIMPLEST_FIRST`) whose paired difference from the best includes zero, and whose
    warm-up computes no more blocks, is recommended instead of it: the same gain within the noise,
    for less to keep and tune. ``names``: how the notes name the strategies (default: as
    :data:`STRATEGIES` spells them)."""
    if objective not in OBJECTIVES:
        raise TraceError(f"objective {objective!r}: one of {', '.join(OBJECTIVES)}")
    h = horizon if horizon is not None else max(ev.horizons)

    def nm(strategy: str) -> str:
        return names.get(strategy, strategy) if names else strategy

    def score(c: Cell) -> float:
        return c.gain_tokens if objective == "ttft" else _net(ev, c.strategy, c.k, h)[0]

    # each strategy's best warm-set size (the smallest of equal ones)
    tops: dict[str, Cell] = {}
    for c in ev.cells:
        if c.horizon_s != h or c.strategy in ORACLES:
            continue
        top = tops.get(c.strategy)
        if top is None or score(c) > score(top) + 1e-9:
            tops[c.strategy] = c
    assert tops
    best = max(tops.values(), key=score)  # the first strategy listed of equal ones
    chosen, tie = best, None
    floor = score(tops["none"]) if "none" in tops else -math.inf
    if best.strategy in SIMPLEST_FIRST:
        for name in SIMPLEST_FIRST[: SIMPLEST_FIRST.index(best.strategy)]:
            simpler = tops.get(name)
            # a tie that still beats no warm-up and warms no more than the best
            if (
                simpler is not None
                and score(simpler) > floor
                and simpler.warm_blocks <= best.warm_blocks + 1e-9
            ):
                m, lo, hi = _paired(ev, objective, h, best, simpler)
                if lo <= 0 <= hi:
                    chosen, tie = simpler, (m, lo, hi)
                    break
    s, k = chosen.strategy, chosen.k
    c = ev.cell(s, k, h)
    net, net_ci, warm = _net(ev, s, k, h)
    r = Recommendation(
        objective,
        s,
        k,
        h,
        c.gain_tokens,
        c.gain_ci,
        warm,
        net,
        net_ci,
        c.oracle_share,
        c.oracle_share_ci,
        c.seen_share,
        c.seen_share_ci,
        c.requests,
        per_token_s,
        restarts_per_hour,
    )
    others = [x for x in ev.cells if x.horizon_s == h and x.strategy not in ("none", *ORACLES)]
    if tie is not None:
        m, lo, hi = tie
        r.notes.append(
            f"{nm(best.strategy)} (K = {best.k:,}) scores {m:+,.0f} tokens per restart more, "
            f"within the noise (paired 95 % CI {lo:+,.0f} to {hi:+,.0f}): the simpler {nm(s)} is "
            "recommended."
        )
    elif s != "none":
        rivals = [x for x in tops.values() if x.strategy not in (s, "none")]
        if rivals:
            second = max(rivals, key=score)
            m, lo, hi = _paired(ev, objective, h, c, second)
            if lo <= 0 <= hi:
                same = (
                    f"{nm(second.strategy)} (K = {second.k:,}) does as well on these restarts: "
                    f"the paired difference is {m:+,.0f} tokens (95 % CI {lo:+,.0f} to "
                    f"{hi:+,.0f})"
                )
                if SIMPLEST_FIRST.index(second.strategy) < SIMPLEST_FIRST.index(s):
                    # a simpler tie is passed over only for not beating no warm-up, or for
                    # computing more blocks in its warm-up: the note gives the reason that held
                    why = _passed_over(second, c, score(second), floor)
                    r.notes.append(f"{same}, and it is simpler, but {why}.")
                else:
                    r.notes.append(f"{same}, and {nm(s)} is the simpler of the two.")
            else:
                r.notes.append(
                    f"Ahead of the next best, {nm(second.strategy)} (K = {second.k:,}), by "
                    f"{m:+,.0f} tokens per restart (95 % CI {lo:+,.0f} to {hi:+,.0f})."
                )
    if s == "none":
        top = max(others, key=lambda x: _net(ev, x.strategy, x.k, h)[0])
        r.notes.append(
            "No warm-up: on this objective every strategy costs more than it saves "
            f"(the best, {nm(top.strategy)}, loses prefill in net)."
        )
    else:
        smaller = [x for x in others if x.strategy == s and x.k < k]
        if smaller and min(x.precision for x in smaller) > c.precision:
            p = max(smaller, key=lambda x: x.precision)
            r.notes.append(
                f"A smaller warm set is read more often (precision {p.precision:.0%} at K = "
                f"{p.k:,} against {c.precision:.0%}), but K = {k:,} saves more tokens in all, "
                "which is the objective."
            )
        if objective == "ttft" and net < 0:
            r.notes.append(
                f"It costs more prefill than it saves ({warm:,.0f} tokens warmed for "
                f"{c.gain_tokens:,.0f} saved per restart): worth it for the requests' time to "
                "first token, not for GPU time (objective net_gpu)."
            )
    return r


def default_ks(capacity: int) -> list[int]:
    """Warm-set sizes to try: a geometric grid up to the cache's usable blocks."""
    usable = capacity - 1
    return sorted({max(1, usable // 64), max(1, usable // 16), max(1, usable // 4), usable})


def advise(
    trace: BlockTrace,
    capacity: int,
    ks: Sequence[int] | None = None,
    restarts: int = MIN_RESTARTS,
    objective: str = "ttft",
    slo_ms: float = DEFAULT_SLO_MS,
    per_token_s: float = math.nan,
    progress: Callable[[int, int], None] | None = None,
    names: Mapping[str, str] | None = None,
) -> tuple[Evaluation, Recommendation]:
    """Evaluate, recommend; a recommendation at the smallest size tried is searched again once
    with smaller sizes (at the largest, the cache's capacity, nothing larger fits). ``names``:
    as :func:`recommend` takes them."""
    grid = sorted(set(ks)) if ks else default_ks(capacity)
    ev = evaluate(trace, capacity, grid, restarts, slo_ms=slo_ms, progress=progress)
    span_h = max(trace.span_s / 3600.0, 1e-9)
    per_hour = len(trace.restarts) / span_h if trace.restarts else math.nan
    rec = recommend(ev, objective, per_token_s=per_token_s, restarts_per_hour=per_hour, names=names)
    usable = capacity - 1
    if rec.strategy != "none" and rec.k == grid[0] and grid[0] > 1:
        wider = sorted({max(1, grid[0] // 16), max(1, grid[0] // 4), *grid})
        ev = evaluate(trace, capacity, wider, restarts, slo_ms=slo_ms, progress=progress)
        rec = recommend(
            ev, objective, per_token_s=per_token_s, restarts_per_hour=per_hour, names=names
        )
        rec.widened = (
            f"the best size was the smallest tried ({grid[0]:,}); searched again down to "
            f"{wider[0]:,}" + ("; still the smallest" if rec.k == wider[0] else "")
        )
    elif rec.strategy != "none" and rec.k == grid[-1]:
        rec.widened = f"the best size is the largest tried, {grid[-1]:,} blocks" + (
            ": the cache's capacity, no larger warm set fits"
            if grid[-1] >= usable
            else "; a larger one might save more"
        )
    return ev, rec


def reuse_profile(trace: BlockTrace) -> dict[str, float]:
    """The trace's reuse structure, which decides what a warm-up can buy: how long after its
    previous read a block is read again (the shares within 1, 5, 15 and 60 minutes, of every
    read that is not a block's first), how concentrated the reads are (the share the 1 % and
    the 10 % most read blocks take), and the share of reads that are a block's first."""
    f = _flat(trace)
    if not len(f.keys):
        return {}
    order = np.lexsort((f.t, f.keys))
    k, t = f.keys[order], f.t[order]
    same = np.r_[False, k[1:] == k[:-1]]
    gaps = (t[1:] - t[:-1])[same[1:]]
    _, counts = np.unique(f.keys, return_counts=True)
    counts = np.sort(counts)[::-1]
    total = float(counts.sum())
    n = len(counts)
    out = {
        "block_reads": total,
        "distinct_blocks": float(n),
        "first_reads": float(n) / total,
        "top_1pct_share": float(counts[: max(1, n // 100)].sum()) / total,
        "top_10pct_share": float(counts[: max(1, n // 10)].sum()) / total,
    }
    for label, s in (("1min", 60.0), ("5min", 300.0), ("15min", 900.0), ("60min", 3600.0)):
        out[f"reread_within_{label}"] = float(np.mean(gaps <= s)) if len(gaps) else math.nan
    return out


def warm_plan(
    strategy: str = "heat", k: int | None = None, slo_ms: float = DEFAULT_SLO_MS
) -> Callable[[BlockTrace], tuple[BlockTrace, np.ndarray, str]]:
    """A warm-up plan for :func:`.fixes.fixes`: at each restart the trace records, ``strategy``
    chooses up to ``k`` blocks (default: half the blocks a request of the trace holds at most,
    times 16) from the restarted engine's hour before, and warm-up requests that compute them
    are inserted at the restart, routed to that engine. Returns (the trace with them, the mask
    of warm-up requests, a sentence saying what was warmed)."""

    def plan(trace: BlockTrace) -> tuple[BlockTrace, np.ndarray, str]:
        from warmscope.model.blocktrace import TraceBuilder

        f = _flat(trace)
        lam = slo_lambda(slo_ms)
        budget = k if k is not None else int(16 * np.diff(trace.offsets).max())
        inserts: list[tuple[float, int, list[list[int]]]] = []
        for t, e in sorted(trace.restarts):
            lo = int(np.searchsorted(f.t, t - HISTORY_S, side="left"))
            hi = int(np.searchsorted(f.t, t, side="left"))
            on_e = trace.engine[f.req[lo:hi]] == e
            hist = _history(f, lo, hi, on_e)
            order, value = warm_order(hist, t, strategy, budget, 900.0, lam)
            inserts.append((t, e, chains_of(order, hist.parents, value)))
        B = trace.block_size
        tb = TraceBuilder(B, trace.source)
        tb.declare("engine", trace.engines)  # the codes as in the trace
        tb.declare("tenant", trace.tenants)
        warm: list[bool] = []
        j = 0
        for i in range(len(trace)):
            while j < len(inserts) and inserts[j][0] <= trace.t[i]:
                t, e, chains = inserts[j]
                for c in chains:
                    tb.add(t, len(c) * B, 1, c, engine=trace.engines[e])
                    warm.append(True)
                j += 1
            lo, hi = int(trace.offsets[i]), int(trace.offsets[i + 1])
            tb.add(
                float(trace.t[i]),
                int(trace.prompt[i]),
                int(trace.output[i]),
                trace.h[lo:hi].tolist(),
                t_end=float(trace.t_end[i]),
                engine=trace.engines[trace.engine[i]] if trace.engine[i] >= 0 else None,
                tenant=trace.tenants[trace.tenant[i]] or None,
                full=int(trace.full[i]),
            )
            warm.append(False)
        out = tb.build()
        n_blocks = sum(len(c) for _, _, cs in inserts for c in cs)
        what = (
            f"{strategy} warm sets of up to {budget:,} blocks at each of the "
            f"{len(inserts)} restarts ({n_blocks / max(len(inserts), 1):,.0f} blocks on average)"
        )
        return out, np.array(warm, bool), what

    return plan
