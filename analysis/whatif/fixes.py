"""What each fix buys, replayed from one recording.

For a pool (the engines of a block trace, as they were routed), the recording is replayed as it
was (the baseline: it reproduces what the engines reported) and once per fix:

* **capacity ×1.5, ×2, ×4** — more KV blocks per engine (``evicted`` misses);
* **prefix-aware routing** — each request to the engine holding most of its leading blocks
  (load as the tie-break) instead of the recorded routing (``elsewhere`` misses);
* **the salt dropped** for a named pair of tenants — their blocks identified by content, so
  their common prefixes are shared (``isolated`` misses; the isolation risk is stated beside
  it);
* **drift fixed** — the template's drifting blocks (a timestamp) as if they were stable
  (``drifted`` misses);
* **warm-up at each restart** — the blocks a warm-up strategy would preload after each engine
  restart the recording holds (``cold`` and ``evicted`` misses right after a restart).

Per fix: cached tokens gained (= prefill tokens saved) with a 95 % interval over the trace's
time blocks (the gain of each of ``BLOCKS`` consecutive slices of requests; a t interval over
them), the hit rate it reaches, which miss classes the tokens it gains had in the baseline
(the recording's judgement of each block where it has one, else the replay's: ``elsewhere``
when another engine held it, ``cold`` at a block's first reference, ``evicted`` otherwise),
and — when the trace says what a missed token costs (its requests' TTFT against their missed
tokens, :func:`warmscope.analysis.value.fit_token_latency`, or a given cost) — the GPU-seconds
and TTFT saved, each with an interval that carries both the gain's and the cost's uncertainty.
A fix can also lose tokens (another routing splits what one engine shared): losses are counted
by class too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np
from warmscope.model.blocktrace import BLOCK_CLASSES, UNJUDGED, BlockTrace, TraceError

from ..value import TokenLatency, fit_token_latency
from .replay import Replay, effective_keys, first_references, replay

__all__ = ["Fix", "FixTable", "fixes", "isolation_pair", "BLOCKS", "CAPACITY_STEPS"]

BLOCKS = 20  # time slices the gain's interval is taken over
CAPACITY_STEPS = (1.5, 2.0, 4.0)
_T975 = {  # Student t, 97.5 % quantile, by degrees of freedom
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    12: 2.179,
    15: 2.131,
    19: 2.093,
    20: 2.086,
    30: 2.042,
}


def _t975(df: int) -> float:
    if df <= 0:
        return math.nan
    keys = sorted(_T975)
    for k in keys:
        if df <= k:
            return _T975[k]
    return 1.96


@dataclass
class Fix:
    """One row of the table."""

    name: str
    what: str
    removes: str  # the miss classes it is aimed at
    hit_rate: float
    gained_tokens: int
    gained_ci: tuple[float, float]
    by_class: dict[str, int]  # tokens gained, by their class in the baseline
    lost_by_class: dict[str, int]
    requests_changed: int
    gpu_s: float = math.nan
    gpu_s_ci: tuple[float, float] = (math.nan, math.nan)
    ttft_s_per_request: float = math.nan
    ttft_ci: tuple[float, float] = (math.nan, math.nan)
    note: str = ""
    available: bool = True

    def row(self) -> dict[str, Any]:
        return {
            "fix": self.name,
            "what": self.what,
            "aimed_at": self.removes,
            "available": self.available,
            "hit_rate": self.hit_rate,
            "cached_tokens_gained": self.gained_tokens,
            "cached_tokens_gained_ci": list(self.gained_ci),
            "prefill_tokens_saved": self.gained_tokens,
            "gpu_s_saved": self.gpu_s,
            "gpu_s_saved_ci": list(self.gpu_s_ci),
            "ttft_saved_s_per_request": self.ttft_s_per_request,
            "ttft_saved_ci": list(self.ttft_ci),
            "gained_by_class": self.by_class,
            "lost_by_class": self.lost_by_class,
            "requests_changed": self.requests_changed,
            "note": self.note,
        }


@dataclass
class FixTable:
    trace: BlockTrace
    capacity: tuple[int, ...]
    baseline: Replay
    baseline_hit_rate: float
    recorded_hit_rate: float  # what the engines reported (NaN when the trace has no cached tokens)
    agreement: float  # share of requests whose replayed cached tokens equal the recorded ones
    cost: TokenLatency | None
    cost_note: str
    fixes: list[Fix] = field(default_factory=list)
    baseline_missed: dict[str, int] = field(default_factory=dict)

    def rows(self) -> list[dict[str, Any]]:
        return [f.row() for f in self.fixes]

    def as_dict(self) -> dict[str, Any]:
        c = self.cost
        return {
            "engine_capacities": list(self.capacity),
            "block_size": self.trace.block_size,
            "requests": len(self.trace),
            "baseline_hit_rate": self.baseline_hit_rate,
            "recorded_hit_rate": self.recorded_hit_rate,
            "replay_agreement": self.agreement,
            "baseline_missed_by_class": self.baseline_missed,
            "cost_per_missed_token_s": None if c is None else c.per_token_s,
            "cost_per_missed_token_ci": None if c is None else [c.ci_low, c.ci_high],
            "cost_note": self.cost_note,
            "fixes": self.rows(),
        }


def _classes_of(trace: BlockTrace, base: Replay, keys: np.ndarray) -> np.ndarray:
    """Per block, its class in the baseline (index into BLOCK_CLASSES; 0 hit, 255 none)."""
    out = np.full(trace.n_blocks, UNJUDGED, np.uint8)
    lens = np.diff(trace.offsets)
    pos = np.arange(trace.n_blocks) - np.repeat(trace.offsets[:-1], lens)
    hit = pos < np.repeat(base.hits, lens)
    out[hit] = 0
    rec = trace.cls
    judged_rec = (rec != UNJUDGED) & (rec != 0) & ~hit
    out[judged_rec] = rec[judged_rec]
    mine = ~hit & ~judged_rec & (base.kinds > 0)
    firsts = first_references(keys)
    els, cold, ev = (
        BLOCK_CLASSES.index("elsewhere"),
        BLOCK_CLASSES.index("cold"),
        BLOCK_CLASSES.index("evicted"),
    )
    out[mine & (base.kinds == 1)] = els
    nowhere = mine & (base.kinds == 2)
    out[nowhere & firsts] = cold
    out[nowhere & ~firsts] = ev
    return out


def _by_class(trace: BlockTrace, cls: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> dict[str, int]:
    """Tokens of blocks [lo, hi) per request, by class (0 hit ... 5 cold; 255 unknown)."""
    out: dict[str, int] = {}
    B = trace.block_size
    for i in np.flatnonzero(hi > lo):
        base = int(trace.offsets[i])
        for j in range(int(lo[i]), int(hi[i])):
            c = int(cls[base + j])
            name = BLOCK_CLASSES[c] if c < len(BLOCK_CLASSES) else "unknown"
            out[name] = out.get(name, 0) + B
    return out


def _interval(diff: np.ndarray, blocks: int) -> tuple[float, float]:
    """95 % t interval of the total of ``diff`` (per request, in order) over ``blocks``
    consecutive slices."""
    n = len(diff)
    k = min(blocks, n)
    if k < 2:
        return (math.nan, math.nan)
    parts = np.array([p.sum() for p in np.array_split(diff.astype(float), k)])
    total = float(parts.sum())
    half = _t975(k - 1) * float(parts.std(ddof=1)) * math.sqrt(k)
    return (total - half, total + half)


def _priced(
    fix: Fix, gained: float, ci: tuple[float, float], cost: TokenLatency | None, n: int
) -> None:
    if cost is None or n == 0:
        return
    b = cost.per_token_s
    fix.gpu_s = gained * b
    # relative errors of the gain and of the cost per token, combined
    rg = (ci[1] - ci[0]) / 2 / abs(gained) if gained else 0.0
    rb = (cost.ci_high - cost.ci_low) / 2 / abs(b) if b else 0.0
    half = abs(fix.gpu_s) * math.sqrt(rg**2 + rb**2)
    if gained == 0:
        half = max(abs(ci[0]), abs(ci[1])) * abs(b)
    fix.gpu_s_ci = (fix.gpu_s - half, fix.gpu_s + half)
    fix.ttft_s_per_request = fix.gpu_s / n
    fix.ttft_ci = (fix.gpu_s_ci[0] / n, fix.gpu_s_ci[1] / n)


def isolation_pair(trace: BlockTrace) -> tuple[str, str] | None:
    """The two tenants, at least one of them salted, whose requests share the most prompt
    blocks by content (what dropping their salt would share); None when no two do."""
    if len(trace.tenants) < 3:
        return None
    lens = np.diff(trace.offsets)
    ten = np.repeat(trace.tenant, lens)
    salted = np.repeat(trace.salt > 0, lens)
    sets: dict[int, set[int]] = {}
    any_salt: dict[int, bool] = {}
    for k in np.unique(ten):
        m = ten == k
        sets[int(k)] = set(trace.c[m].tolist())
        any_salt[int(k)] = bool(salted[m].any())
    best, pair = 0, None
    for a, b in combinations(sorted(sets), 2):
        if not (any_salt[a] or any_salt[b]) or not trace.tenants[a] or not trace.tenants[b]:
            continue
        shared = len(sets[a] & sets[b])
        if shared > best:
            best, pair = shared, (trace.tenants[a], trace.tenants[b])
    return pair


def fixes(
    trace: BlockTrace,
    capacity: int | Sequence[int],
    engines: int | None = None,
    concurrent: bool = False,
    unsalt: Iterable[str] | None = None,
    warm: Any = None,
    cost: TokenLatency | None = None,
    steps: Sequence[float] = CAPACITY_STEPS,
) -> FixTable:
    """The table of fixes for ``trace`` replayed at ``capacity`` blocks per engine (vLLM's
    ``num_gpu_blocks``). ``unsalt``: the tenants whose salt the row drops (default: the
    :func:`isolation_pair`). ``warm``: a callable ``(trace) -> (trace with warm-up requests,
    warm mask, description)`` for the warm-up row (the advisor's plan), or None. ``cost``: what
    a missed token costs (default: fitted from the trace's TTFT when it has enough)."""
    if not len(trace):
        raise TraceError("the trace has no requests: nothing to replay")
    n_eng = engines if engines is not None else max(1, len(trace.engines))
    caps = [int(capacity)] * n_eng if isinstance(capacity, (int, np.integer)) else list(capacity)
    fx = _Fixes(trace, caps, n_eng, concurrent, cost)
    fx.capacity(steps)
    fx.routing()
    fx.salt(tuple(unsalt) if unsalt else isolation_pair(trace))
    fx.drift()
    fx.warm_up(warm)
    return fx.table


def _token_cost(
    trace: BlockTrace, base: Replay, cost: TokenLatency | None
) -> tuple[TokenLatency | None, str]:
    """What a missed token costs (given, or fitted over the trace's TTFT against the replay's
    missed tokens) and the sentence that says so, or why it is not priced."""
    if cost is None:
        fit = fit_token_latency((trace.prompt - base.cached).astype(float), trace.ttft)
        if isinstance(fit, str):
            return None, (
                "fixes are not priced in seconds of TTFT (the trace cannot say what a missed "
                f"token costs: {fit})"
            )
        cost = fit
    return cost, (
        f"a missed token costs {cost.per_token_s * 1e3:.4f} ms of prefill "
        f"(95 % CI {cost.ci_low * 1e3:.4f} to {cost.ci_high * 1e3:.4f} ms), fitted over "
        f"{cost.requests:,.0f} requests' TTFT against their missed tokens"
    )


class _Fixes:
    """The baseline replay of a trace and one row per fix, each replayed with one thing changed
    (capacity, routing, a salt, drift, a warm-up) and compared request by request."""

    def __init__(
        self,
        trace: BlockTrace,
        caps: list[int],
        n_eng: int,
        concurrent: bool,
        cost: TokenLatency | None,
    ) -> None:
        self.trace, self.caps, self.n_eng, self.concurrent = trace, caps, n_eng, concurrent
        self.base = base = self.replay(caps)
        self.n = int(base.scored.sum())
        rec = trace.cached >= 0
        recorded = (
            float(trace.cached[rec].sum()) / float(trace.prompt[rec].sum())
            if rec.any()
            else math.nan
        )
        agreement = float(np.mean(base.cached[rec] == trace.cached[rec])) if rec.any() else math.nan
        self.cls = _classes_of(trace, base, trace.h)
        lens = np.diff(trace.offsets)
        judged_hi = np.minimum(
            np.minimum((trace.prompt - 1) // trace.block_size, np.minimum(trace.full, lens)), lens
        )
        missed = _by_class(trace, self.cls, base.hits, np.maximum(base.hits, judged_hi))
        self.cost, cost_note = _token_cost(trace, base, cost)
        self.table = FixTable(
            trace,
            tuple(caps),
            base,
            base.token_hit_rate(),
            recorded,
            agreement,
            self.cost,
            cost_note,
            baseline_missed=missed,
        )

    def replay(self, caps: list[int], keys: Any = None, **kw: Any) -> Replay:
        return replay(
            self.trace,
            caps,
            engines=self.n_eng,
            concurrent=self.concurrent,
            keys=self.trace.h if keys is None else keys,
            **kw,
        )

    def add(self, name: str, what: str, removes: str, r: Replay, note: str = "") -> Fix:
        """A fix's row: the tokens it gains over the baseline (CI by blocks of requests), by the
        class the baseline missed them as, and what it loses."""
        base, trace = self.base, self.trace
        d = (r.cached - base.cached)[base.scored]
        gained = int(d.sum())
        ci = _interval(d, BLOCKS)
        gain_hi = np.maximum(r.hits, base.hits)
        lose_lo = np.minimum(r.hits, base.hits)
        f = Fix(
            name,
            what,
            removes,
            r.token_hit_rate(),
            gained,
            ci,
            _by_class(trace, self.cls, base.hits, gain_hi),
            _by_class(trace, self.cls, lose_lo, base.hits),
            int(np.sum(d != 0)),
            note=note,
        )
        _priced(f, gained, ci, self.cost, self.n)
        self.table.fixes.append(f)
        return f

    def capacity(self, steps: Sequence[float]) -> None:
        caps = self.caps
        for k in steps:
            bigger = [max(2, int(round(c * k))) for c in caps]
            self.add(
                f"capacity ×{k:g} ({bigger[0]:,} blocks)",
                f"{bigger[0]:,} blocks per engine instead of {caps[0]:,}",
                "evicted",
                self.replay(bigger),
            )

    def routing(self) -> None:
        if self.n_eng > 1:
            self.add(
                "prefix-aware routing",
                "each request to the engine holding most of its leading "
                "blocks (load breaks ties), instead of the recorded routing",
                "elsewhere",
                self.replay(self.caps, policy="prefix_aware"),
            )
        else:
            self.table.fixes.append(
                _unavailable(
                    "prefix-aware routing", "elsewhere", "one engine: nothing to route between"
                )
            )

    def salt(self, pair: tuple[str, ...] | None) -> None:
        if not pair:
            self.table.fixes.append(
                _unavailable(
                    "salt dropped", "isolated", "no two tenants share content under a salt"
                )
            )
            return
        self.add(
            f"salt dropped: {' + '.join(pair)}",
            f"{' and '.join(pair)} share their cached "
            "prefixes (their blocks identified by content)",
            "isolated",
            self.replay(self.caps, keys=effective_keys(self.trace, unsalt=pair)),
            note=f"isolation risk: with no salt between them, {' and '.join(pair)} can learn "
            "from each other's time to first token whether the other sent a prompt with the "
            "same prefix; drop it only inside one trust domain",
        )

    def drift(self) -> None:
        trace = self.trace
        if np.any(trace.s != trace.h):
            self.add(
                "drift fixed",
                "the template's drifting blocks (a timestamp) held stable",
                "drifted",
                self.replay(self.caps, keys=effective_keys(trace, stable=True)),
            )
        else:
            self.table.fixes.append(
                _unavailable("drift fixed", "drifted", "no drifting template seen")
            )

    def warm_up(self, warm: Any) -> None:
        """The warm-up row: the trace with the plan's warm-up requests at each restart, replayed,
        scored on the trace's own requests only."""
        trace = self.trace
        if warm is None or not trace.restarts:
            why = "the recording holds no engine restart" if not trace.restarts else "no plan given"
            self.table.fixes.append(_unavailable("warm-up at each restart", "cold, evicted", why))
            return
        wtrace, wmask, what = warm(trace)
        r = replay(wtrace, self.caps, engines=self.n_eng, concurrent=self.concurrent, warm=wmask)
        scored = r.scored
        mapped = Replay(
            trace,
            r.capacity,
            r.policy,
            r.engine[scored],
            r.hits[scored],
            r.fit[scored],
            np.zeros(trace.n_blocks, np.uint8),
            r.peak,
            np.ones(len(trace), bool),
        )
        self.add("warm-up at each restart", what, "cold, evicted", mapped)


def _unavailable(name: str, removes: str, why: str) -> Fix:
    return Fix(
        name, why, removes, math.nan, 0, (math.nan, math.nan), {}, {}, 0, note=why, available=False
    )
