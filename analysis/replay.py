"""What-if replay: the recorded family-level request stream through a cache
model, for candidate warm-up parameters.

The store keeps requests per key family and flush bucket, not per key. The
replay therefore gives each family a Zipf popularity law over its keys
(``catalog`` keys, exponent ``s``) and plays the recorded per-bucket family
rates through an analytic cache model per cache instance (the response cache
is shared by a pool's replicas; embedding caches are per replica):

* response (TTL from insertion, LRU capacity): a key requested at rate ``r``
  hits with probability ``rT / (1 + rT)`` with ``T = min(TTL, T_C)``;
* embedding (LRU): ``1 − exp(−r·T_C)`` (Che's approximation);
* ``T_C``, the characteristic time, solves ``Σ occupancy(r_i, T_C) = capacity``
  per bucket; a cache that started empty ``u`` seconds ago uses ``min(T, u)``.

Warm-ups happen at each replica start (after the weights load) and at the
pre-peak trigger ``peak − lead``. A warm-up writes the ``warm_keys`` keys with
the highest heat per layer; heat is a decayed count, so the ranking sees about
``rate / λ`` requests per key: the replay draws those counts (Poisson, fixed
seed), ranks, and credits each warmed key that was not cached yet with one
extra hit if it is read before it goes stale
(``1 − exp(−∫ r(t) dt)`` over its life). Staleness — a key warmed too early
is worth less:

* **expiry** — a response entry lives its TTL;
* **eviction** — an LRU evicts an unread entry once its idle age passes the
  characteristic time ``T_C`` of the bucket it is in (a busy peak flushes
  entries warmed hours before it; reads racing that bucket's new entries get
  ``T_C`` of it), so the life ends at the first such bucket;
* **moving popularity** — ``ρ(Δ)`` (:func:`persistence`, measured from the
  recorded hot keys) is the share of a warm set's value left ``Δ`` after it
  was chosen: a warmed key is read at its own rate with weight ``ρ`` and at a
  random key's rate otherwise, and the heat (history weighted by ``e^{−λa}``)
  ranks on popularity that has since moved with weight
  ``1/λ − ∫ e^{−λa} ρ(a) da`` — so a small λ ranks on stale history.

Cost and value: a warmed key costs the GPU-seconds the recorded warm-ups spent
per key of that layer (and their bytes); an extra hit saves what a miss costs,
taken as the same GPU-seconds (a warm-up does the miss's work ahead of time).
``net_gpu_s`` = GPU-s saved against the recorded parameters − the extra
warm-up GPU-s (the objective the advisor maximises; × a price gives money) and
``roi = (GPU-s the warm-ups' hits saved − warm-up GPU-s) / warm-up GPU-s``.

Calibration: with the parameters the recorded run used (read from its warm-up
runs and warmed keys), the Zipf exponent of each layer is set by bisection so
that the replayed hit rate equals the recorded one. Validation
(``tests/analysis/test_advisor_proof.py``): calibrated on one pool, the replay
predicts the other pool's simulated hit rate under that pool's TTL within
``TOLERANCE``; ``tests/analysis/test_advisor_staleness.py`` checks the
staleness terms on synthetic traffic.

The prefix-KV layer is not replayed here: beside the response and embedding
layers its system-prompt blocks hit after their first request whatever the
warm-up does. A recording of that layer alone (an engine behind the gateway)
has its own model, ``advisor.advise_prefix``: there a warm-up turns each
prefix's first read on a fresh engine into a hit.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
from warmscope.model.records import start_layers

from .heat import slo_lambda

__all__ = [
    "Params",
    "Model",
    "Outcome",
    "calibrate",
    "replay",
    "curves",
    "recorded_params",
    "persistence",
    "TOLERANCE",
    "LAYERS",
    "SLO_LAMBDA",
    "restarts",
    "gate_wait",
    "fidelity",
    "Fidelity",
    "FIDELITY_TOL",
    "FIDELITY_SHARE",
    "FIDELITY_MIN_REQUESTS",
]

LAYERS = ("response", "embedding")
TOLERANCE = 0.03  # replayed vs simulated hit rate, absolute
# the SLO-aware rate per second for a 1 s TTFT SLO, as the simulator uses it
SLO_LAMBDA = slo_lambda(1000.0)
BUCKET_S = 900.0
SPAN_CAP_S = 4 * 3600.0  # the longest a warmed entry is followed for its first read
STABLE = (np.array([0.0, 1.0]), np.array([1.0, 1.0]))  # ρ ≡ 1: popularity that never moves
HEAD = 256  # ranks kept individually; the tail is binned
SUB = 6  # points per bucket at which a young cache's age is taken


@dataclass(frozen=True)
class Params:
    """Candidate warm-up parameters (what ``[simulator]`` / a warm-up runner can set)."""

    warm_keys: int = 400  # keys per layer a warm-up writes
    response_ttl_s: float = 3600.0
    lambda_per_s: float = SLO_LAMBDA  # heat decay rate
    lead_s: float = 6.5 * 3600  # pre-peak trigger: this long before the forecast peak

    def as_dict(self) -> dict[Any, Any]:
        return asdict(self)


@dataclass
class Model:
    """The cache model fitted to a recorded run."""

    rates: dict[str, pd.DataFrame]  # layer -> (bucket × (instance, family)) requests/s
    instances: dict[str, list[str]]
    s: dict[str, float]
    catalog: dict[str, int]
    capacity: dict[str, float]
    cost_per_key: dict[str, float]  # GPU-s
    bytes_per_key: dict[str, float]
    recorded_hit_rate: dict[str, float]
    starts: dict[str, list[float]]  # instance -> start times (Unix s)
    peak_at: float  # a time of day (s) of the forecast peak
    weights_load_s: float
    t0: float
    t1: float
    base: Params
    base_hits: dict[str, float] = field(default_factory=dict)
    # layer -> lags (s), ρ
    persist: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    persist_note: dict[str, str] = field(default_factory=dict)
    # (layer, instance, s) -> T_C per bucket
    _tc: dict[Any, np.ndarray] = field(default_factory=dict, repr=False)
    # instances whose recorded traffic had warm-ups (None: all); the others are replayed without any
    warmed: frozenset[str] | None = None
    # known fault windows (start, end) of the recording: not replayed, so not scored by
    # :func:`fidelity`
    faults: list[tuple[float, float]] = field(default_factory=list)
    # layer -> recorded hits and requests per bucket (index: bucket start), for :func:`fidelity`
    recorded: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)
    # gated starts: replica -> times its (re)start's warm-up held the readiness gate (replica_start
    # runs); a layer's warm-up seconds per key; replica -> requests/s (see :func:`gate_wait`)
    gated: dict[str, list[float]] = field(default_factory=dict)
    sec_per_key: dict[str, float] = field(default_factory=dict)
    req_rate: dict[str, float] = field(default_factory=dict)

    def covered(self, layer: str) -> np.ndarray:
        """Seconds of each bucket the recording covers (the first and last are partial)."""
        idx = self.rates[layer].index.to_numpy(float)
        out: np.ndarray = np.clip(
            np.minimum(idx + BUCKET_S, self.t1) - np.maximum(idx, self.t0), 60.0, BUCKET_S
        )
        return out

    def char_times(self, layer: str, inst: str, s: float) -> np.ndarray:
        """T_C per bucket of one cache instance (it depends on the traffic and the Zipf exponent
        only)."""
        key = (layer, inst, s)
        if key not in self._tc:
            prob, w = _zipf(s, self.catalog[layer])
            sub = self.rates[layer][inst].to_numpy(float)
            r = (sub[:, :, None] * prob[None, None, :]).reshape(len(sub), -1)
            self._tc[key] = _char_time(
                layer,
                r,
                np.tile(w, sub.shape[1]),  # type: ignore[misc]  # 2-D
                self.capacity[layer],
            )
        return self._tc[key]


@dataclass
class Outcome:
    params: Params
    hit_rate: dict[str, float]
    extra_hits: float
    warm_gpu_s: float
    warm_bytes: float
    gpu_s_saved: float  # vs the recorded parameters (steady state and warm-ups)
    net_gpu_s: float  # gpu_s_saved minus the extra warm-up GPU-s: the objective
    # the warm-ups' own compute ROI: (GPU-s their hits saved − their GPU-s) / their GPU-s
    roi: float
    trigger_at: float  # time of day (s) of the pre-peak warm-up
    # layer -> replayed hits (steady state + warm-ups)
    hits: dict[str, float] = field(default_factory=dict)
    layer_warm_gpu_s: dict[str, float] = field(default_factory=dict)  # layer -> warm-up GPU-s

    def as_dict(self) -> dict[Any, Any]:
        d = asdict(self)
        d["params"] = self.params.as_dict()
        return d


def _zipf(s: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-key probability and multiplicity: ranks 1..HEAD alone, then log-spaced bins."""
    head = np.arange(1, min(HEAD, n) + 1, dtype=float)
    edges = (
        np.unique(np.geomspace(HEAD + 1, n + 1, 48).astype(int)) if n > HEAD else np.array([], int)
    )
    mids = (
        np.sqrt(edges[:-1] * np.maximum(edges[1:] - 1, edges[:-1]))
        if len(edges) > 1
        else np.array([])
    )
    w = (
        np.concatenate([np.ones(len(head)), np.diff(edges)])
        if len(edges) > 1
        else np.ones(len(head))
    )
    ranks = np.concatenate([head, mids])
    p = ranks**-s
    z = np.sum(w * p)
    return p / z, w


def _hit(layer: str, r: np.ndarray, T: np.ndarray) -> np.ndarray:
    x = r * T
    # numpy ufunc results on arrays are typed Any
    return x / (1 + x) if layer == "response" else -np.expm1(-x)  # type: ignore[no-any-return]


def _char_time(layer: str, r: np.ndarray, w: np.ndarray, cap: float) -> np.ndarray:
    """T_C per bucket (rows of r: buckets × keys) solving Σ w·occ(r, T) = cap (bisection in log
    T)."""
    lo, hi = np.full(r.shape[0], 1.0), np.full(r.shape[0], 1e7)
    full = (w * _hit(layer, r, hi[:, None])).sum(1) <= cap
    for _ in range(26):
        mid = np.sqrt(lo * hi)
        occ = (w * _hit(layer, r, mid[:, None])).sum(1)
        big = occ > cap
        hi = np.where(big, mid, hi)
        lo = np.where(big, lo, mid)
    return np.where(full, np.inf, np.sqrt(lo * hi))


def persistence(
    hot_keys: pd.DataFrame | None, layer: str, top: int = 200, max_lag: int = 6
) -> tuple[np.ndarray, np.ndarray, str]:
    """How long a warm set stays right: ``ρ(Δ)``, the share of the requests a warm set chosen from
    one hot-key window would catch ``Δ`` later, relative to a warm set chosen then.

    For every tenant and window ``w`` of the layer's hot keys (Space-Saving counts), the ``top``
    keys of ``w`` are compared with window ``w + k``: ``ρ(k·W) = Σ count_{w+k}(keys of w's top) / Σ
    count_{w+k}(keys of (w+k)'s top)``, pooled over tenants and windows, for k = 1 … ``max_lag``;
    ``ρ(0) = 1``. Returns lags (s), ρ and a description; no hot keys: ρ ≡ 1 (popularity taken as
    stable) and the description says so."""
    none = np.array([0.0, 1.0]), np.array([1.0, 1.0])
    if hot_keys is None or len(hot_keys) == 0:
        return *none, "no hot keys recorded: popularity taken as stable"
    hk = hot_keys[hot_keys["layer"] == layer]
    wins = np.unique(hk["window"].to_numpy(float)) if len(hk) else np.array([])
    if len(wins) < 2:
        return *none, f"fewer than two hot-key windows of {layer}: popularity taken as stable"
    W = float(np.min(np.diff(wins)))
    c = (
        hk.assign(n=hk["hits"].astype(float) + hk["misses"].astype(float))
        .groupby(["tenant", "window", "key_hash"])["n"]
        .sum()
    )
    counts: dict[tuple[Any, ...], pd.Series] = {
        k: g.droplevel([0, 1])  # type: ignore[misc]  # 2-level keys
        for k, g in c.groupby(level=[0, 1])
    }
    tops = {k: set(v.nlargest(top).index) for k, v in counts.items()}
    lags, rho = [0.0], [1.0]
    for k in range(1, max_lag + 1):
        num = den = 0.0
        for (tenant, w), keys in tops.items():
            later = counts.get((tenant, w + k * W))
            if later is None:
                continue
            num += float(later[later.index.isin(keys)].sum())
            den += float(later[later.index.isin(tops[(tenant, w + k * W)])].sum())
        if den <= 0:
            break
        lags.append(k * W)
        rho.append(min(num / den, 1.0))
    if len(lags) < 2:
        return *none, f"no two {layer} hot-key windows {W:g} s apart: popularity taken as stable"
    return (
        np.array(lags),
        np.array(rho),
        (
            f"{layer} hot keys, top {top} per tenant and {W / 60:g}-min window: "
            + ", ".join(
                f"ρ({lag / 3600:g} h) = {r:.2f}" for lag, r in zip(lags[1:4], rho[1:4], strict=True)
            )
        ),
    )


def _persist_integrals(
    lags: np.ndarray, rho: np.ndarray, lam: float, L: np.ndarray
) -> tuple[float, np.ndarray]:
    """``A = ∫_0^∞ e^{−λa} ρ(a) da`` (the heat's weight on still-valid history) and ``G(L) = ∫_0^L
    ρ`` (ρ linear between lags, flat beyond the last)."""
    grid = np.linspace(0.0, lags[-1], 241)
    r = np.interp(grid, lags, rho)
    A = (
        float(np.trapezoid(np.exp(-lam * grid) * r, grid))
        + rho[-1] * math.exp(-lam * lags[-1]) / lam
    )
    cum = np.concatenate([[0.0], np.cumsum((r[1:] + r[:-1]) / 2 * np.diff(grid))])
    Lc = np.minimum(L, lags[-1])
    G = np.interp(Lc, grid, cum) + rho[-1] * np.maximum(L - lags[-1], 0.0)
    return A, G


def recorded_params(frames: dict[Any, Any], default: Params = Params()) -> Params:
    """The parameters a recorded run used, read from its warm-up runs and warmed keys."""
    runs = frames.get("warmup_runs", pd.DataFrame())
    wk = frames.get("warmed_keys", pd.DataFrame())
    k, ttl = default.warm_keys, default.response_ttl_s
    if len(runs):
        k = int(runs["keys"].max())  # the per-layer budget: the largest run
    if len(wk) and "response" in set(wk["layer"]):
        t = wk.loc[wk["layer"] == "response", "ttl_s"].dropna()
        if len(t):
            ttl = float(t.median())
    return replace(default, warm_keys=k, response_ttl_s=ttl)


RESTART_GAP_S = 600.0  # restart signals closer than this are one restart


def restarts(
    runs: pd.DataFrame | None, gauges: pd.DataFrame | None, t0: float
) -> dict[str, list[float]]:
    """When each replica began serving from an emptied cache: ``t0`` and its restarts, per replica.

    Two signals, merged (within ``RESTART_GAP_S`` they are one restart):

    * warm-up runs triggered by ``replica_start`` / ``replica_restart`` — one restart per cluster of
      such runs (a warm-up opens one run per layer), at the cluster's last end (the readiness gate
      opens, or the surge instance takes over, when its warm-up ends);
    * the ``warmscope.gpu.memory.usage_ratio`` gauge falling from above 0.3 to below 0.02 — the KV
      cache emptied, which is a restart whether or not the replica warms up (a pool without warm-up
      records no runs).
    Restarts before ``t0`` count as ``t0``."""
    out: dict[str, list[float]] = {}
    if runs is not None and len(runs):
        rr = runs[runs["trigger"].isin(["replica_start", "replica_restart"])]
        for rep, g in rr.groupby("replica"):
            g = g.sort_values("started")
            end = g["ended"].fillna(g["started"]).to_numpy(float)
            st = g["started"].to_numpy(float)
            cluster = np.concatenate([[0], np.cumsum(np.diff(st) > RESTART_GAP_S)])
            out.setdefault(str(rep), []).extend(
                float(end[cluster == c].max()) for c in np.unique(cluster)
            )
    if gauges is not None and len(gauges):
        gm = gauges[gauges["metric"] == "warmscope.gpu.memory.usage_ratio"]
        for rep, g in gm.groupby("replica"):
            g = g.sort_values("ts")
            v = g["value"].to_numpy(float)
            ts = g["ts"].to_numpy(float)
            prev = pd.Series(v).shift(1).rolling(3, min_periods=1).max().to_numpy(float)
            drops = ts[(v < 0.02) & (prev > 0.3)]
            have = out.setdefault(str(rep), [])
            have.extend(
                float(t) for t in drops if not any(abs(t - h) < RESTART_GAP_S for h in have)
            )
    res = {}
    for rep, ts_list in out.items():
        merged: list[float] = [t0]
        for t in sorted(max(t, t0) for t in ts_list):
            if t - merged[-1] >= RESTART_GAP_S:
                merged.append(t)
        res[rep] = merged
    return res


def _rates(lookups: pd.DataFrame, layer: str, step: float) -> pd.DataFrame:
    lk = lookups[(lookups["layer"] == layer) & lookups["result"].isin(["hit", "miss"])]
    inst = (
        lk["variant"].astype(str)
        if layer == "response"
        else lk["variant"].astype(str) + "/" + lk["replica"]
    )
    b = (lk["ts"].to_numpy(float) // step) * step
    g = (
        pd.DataFrame(
            {
                "b": b,
                "i": inst.to_numpy(),
                "f": lk["family"].astype(str).to_numpy(),
                "c": lk["count"].to_numpy(float),
            }
        )
        .groupby(["b", "i", "f"])["c"]
        .sum()
    )
    wide = g.unstack(["i", "f"], fill_value=0.0)  # type: ignore[arg-type]  # pandas accepts a float
    full = np.arange(wide.index.min(), wide.index.max() + step / 2, step)
    return wide.reindex(full, fill_value=0.0).div(_covered(lookups, full, step), axis=0)


def _covered(lookups: pd.DataFrame, index: np.ndarray, step: float) -> np.ndarray:
    """Seconds of each bucket the recording covers: the first and last buckets are partial (a point
    stamped ``ts`` covers the flush interval before it, taken as 60 s)."""
    t0, t1 = float(lookups["ts"].min()) - 60.0, float(lookups["ts"].max())
    out: np.ndarray = np.clip(np.minimum(index + step, t1) - np.maximum(index, t0), 60.0, step)
    return out


def _layer_hits(m: Model, layer: str, s: float, p: Params) -> tuple[np.ndarray, np.ndarray]:
    """Replayed steady-state hits and requests of a layer per bucket (summed over its cache
    instances)."""
    R = m.rates[layer]
    prob, w = _zipf(s, m.catalog[layer])
    hits = np.zeros(len(R))
    req = np.zeros(len(R))
    # the cache's age (since the instance's last start) at SUB points of each bucket: a restart
    # inside a bucket empties the cache for the part of the bucket after it only
    at = R.index.to_numpy(float)[:, None] + (np.arange(SUB) + 0.5)[None, :] * BUCKET_S / SUB
    for inst in m.instances[layer]:
        sub = R[inst].to_numpy(float)  # buckets × families
        r = (sub[:, :, None] * prob[None, None, :]).reshape(len(sub), -1)
        ww = np.tile(w, sub.shape[1])  # type: ignore[misc]  # 2-D
        Tc = m.char_times(layer, inst, s)
        T = np.minimum(Tc, p.response_ttl_s) if layer == "response" else Tc
        starts = np.array(sorted(m.starts.get(inst, [m.t0])))
        last = starts[np.clip(np.searchsorted(starts, at, side="right") - 1, 0, len(starts) - 1)]
        age = np.maximum(at - last, 1.0)  # buckets × SUB
        steady = (age >= T[:, None]).all(1)
        h = np.zeros(len(sub))
        if steady.any():
            h[steady] = (ww * r[steady] * _hit(layer, r[steady], T[steady, None])).sum(1)
        young = ~steady
        if young.any():
            ry, Ty = r[young], np.minimum(T[young], 1e12)  # a cache that never fills: T = ∞
            acc = np.zeros(len(ry))
            for k in range(SUB):
                a = age[young, k]
                # younger than T: a key is cached iff it was read since the start, 1 − exp(−r·age),
                # for an LRU (Che) and a TTL cache alike; otherwise the steady state
                hk = np.where(
                    (a < Ty)[:, None], -np.expm1(-ry * a[:, None]), _hit(layer, ry, Ty[:, None])
                )
                acc += (ww * ry * hk).sum(1)
            h[young] = acc / SUB
        hits += h * m.covered(layer)
        req += sub.sum(1) * m.covered(layer)
    return hits, req


def _warm_extra(
    m: Model,
    layer: str,
    s: float,
    p: Params,
    rng: np.random.Generator,
    events_out: list[Any] | None = None,
) -> tuple[float, int]:
    """Extra hits and number of warm-up runs over the recorded span (each event's (t, extra)
    appended to ``events_out``)."""
    R = m.rates[layer]
    prob, w = _zipf(s, m.catalog[layer])
    keys_p = np.repeat(prob, w.astype(int))  # key-level for ranking
    n_keys = len(keys_p)
    idx = R.index.to_numpy(float)
    lags, rho = m.persist.get(layer, STABLE)
    lam = max(p.lambda_per_s, 1e-9)
    A = _persist_integrals(lags, rho, lam, np.zeros(1))[0]
    B = max(1.0 / lam - A, 0.0)  # the heat's weight on history whose popularity has since moved
    perm = rng.permutation(n_keys)
    extra, runs = 0.0, 0
    keys_pp = keys_p[perm]
    for inst in m.instances[layer]:
        if m.warmed is not None and inst not in m.warmed:
            continue  # this instance's recorded traffic had no warm-ups: replayed as it ran
        sub = R[inst].to_numpy(float)
        tc_all = m.char_times(layer, inst, s)
        starts = m.starts.get(inst, [m.t0])
        # a start is when the instance begins serving from an emptied cache (after its weights load
        # and its warm-up: a readiness gate or a surge instance's cut-over), so its warm-up's keys
        # are there then
        events = list(starts)
        day = (m.t0 // 86400) * 86400
        while day < m.t1:
            te = day + (m.peak_at - p.lead_s) % 86400
            if m.t0 <= te < m.t1:
                events.append(te)
            day += 86400
        for te in events:
            b = int(np.clip(np.searchsorted(idx, te, side="right") - 1, 0, len(idx) - 1))
            rate_now = sub[b]  # families' rates when the warm-up runs
            # a warmed entry lives until its TTL, or until the LRU evicts it unread: in the first
            # bucket whose characteristic time T_C is shorter than the entry's idle age (reads
            # racing that bucket's new entries get T_C of it)
            ttl = p.response_ttl_s if layer == "response" else np.inf
            b_end = int(np.clip(np.searchsorted(idx, te + min(ttl, SPAN_CAP_S)), b + 1, len(idx)))
            rw = sub[b:b_end]  # buckets × families
            tcs = tc_all[b:b_end]
            off0 = np.maximum(idx[b:b_end] - te, 0.0)
            # the last bucket is partial
            off1 = np.minimum(idx[b:b_end] + BUCKET_S, max(m.t1, te)) - te
            death = np.where(tcs < off0, off0 + tcs, tcs)
            life = float(min(ttl, SPAN_CAP_S, np.min(np.where(death < off1, death, np.inf))))
            r_now = np.outer(rate_now, keys_p)  # families × keys
            mu = (A * r_now + B * np.outer(rate_now, keys_pp)).ravel()
            k = min(p.warm_keys, mu.size)
            # the heat counts are drawn for the keys with the highest expected heat only (4k + 2,000
            # of them): a key further down has next to no chance of a count in the top k
            cand = (
                np.argpartition(-mu, min(4 * k + 2000, mu.size) - 1)[: 4 * k + 2000]
                if mu.size > 4 * k + 2000
                else np.arange(mu.size)
            )
            heat = rng.poisson(mu[cand]) + 1e-9 * r_now.ravel()[cand]
            top = cand[np.argpartition(-heat, k - 1)[:k]] if k > 0 else np.array([], int)
            fam, key = np.divmod(top, n_keys)
            # reads a warmed key gets in its life, bucket by bucket: its own rate while its
            # popularity holds (ρ), a random key's after
            seg0, seg1 = np.minimum(off0, life), np.clip(off1, 0.0, life)
            g0 = _persist_integrals(lags, rho, lam, seg0)[1]
            g1 = _persist_integrals(lags, rho, lam, seg1)[1]
            dG, dT = g1 - g0, seg1 - seg0
            expect = keys_p[key] * (rw[:, fam].T @ dG) + (rw[:, fam].T @ (dT - dG)) / n_keys
            tc = float(tcs[0])
            age = te - max([s0 for s0 in starts if s0 <= te], default=m.t0)
            # already cached
            held = _hit(layer, r_now.ravel()[top], np.full(k, max(min(age, ttl, tc), 0.0)))
            e = float(np.sum((1 - held) * -np.expm1(-expect)))
            extra += e
            runs += 1
            if events_out is not None:
                # the extra hit lands in the bucket of the key's first read: P(first read in bucket
                # j) = exp(−C_{j−1}) − exp(−C_j), C the cumulative expected reads (the total is e)
                per_b = (
                    keys_p[key][:, None] * (rw[:, fam].T * dG[None, :])
                    + rw[:, fam].T * (dT - dG)[None, :] / n_keys
                )  # keys × buckets
                surv = np.exp(-np.cumsum(per_b, axis=1))
                first = np.concatenate([np.ones((len(key), 1)), surv[:, :-1]], axis=1) - surv
                events_out.append((b, ((1 - held)[:, None] * first).sum(0)))
    return extra, runs


def replay(m: Model, p: Params, seed: int = 0, layers: tuple[str, ...] | None = None) -> Outcome:
    """Replay the recorded span with parameters ``p`` (``layers``: only these; default all). Each
    layer draws its heat counts from its own generator seeded with ``seed``, so a layer replays the
    same alone or with the others."""
    hr, extra, gpu, nbytes, saved, warm_saved = {}, 0.0, 0.0, 0.0, 0.0, 0.0
    hits, lgpu = {}, {}
    todo = [ly for ly in m.rates if layers is None or ly in layers]
    for layer in todo:
        hb, nb = _layer_hits(m, layer, m.s[layer], p)
        h, n = float(hb.sum()), float(nb.sum())
        e, runs = _warm_extra(m, layer, m.s[layer], p, np.random.default_rng(seed))
        hr[layer] = (h + e) / n if n else float("nan")
        hits[layer] = h + e
        lgpu[layer] = runs * p.warm_keys * m.cost_per_key[layer]
        extra += e
        gpu += runs * p.warm_keys * m.cost_per_key[layer]
        nbytes += runs * p.warm_keys * m.bytes_per_key[layer]
        saved += (h + e - m.base_hits[layer]) * m.cost_per_key[layer]
        warm_saved += e * m.cost_per_key[layer]
    base_cost = sum(m.base_hits.get(f"_cost_{layer}", 0.0) for layer in todo)
    net = saved - (gpu - base_cost)
    roi = (warm_saved - gpu) / gpu if gpu > 0 else float("nan")
    return Outcome(
        p, hr, extra, gpu, nbytes, saved, net, roi, (m.peak_at - p.lead_s) % 86400, hits, lgpu
    )


@dataclass
class _Recording:
    """What a recorded run says per layer, for :func:`calibrate`."""

    rates: dict[str, pd.DataFrame] = field(default_factory=dict)
    instances: dict[str, list[str]] = field(default_factory=dict)
    hit_rate: dict[str, float] = field(default_factory=dict)
    recorded: dict[str, pd.DataFrame] = field(default_factory=dict)
    cost_per_key: dict[str, float] = field(default_factory=dict)
    bytes_per_key: dict[str, float] = field(default_factory=dict)


# A warm-up's GPU-s per key when the recording has none (the simulator's defaults).
_DEFAULT_COST = {"response": 0.17, "embedding": 0.015}


def _pool(
    frames: dict[Any, Any], variant: str | None
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The lookups, warm-up runs and warmed keys of one A/B variant's pool (None: all)."""
    lk = frames["lookups"]
    if variant is not None:
        lk = lk[lk["variant"] == variant]
    runs = frames.get("warmup_runs", pd.DataFrame())
    wk = frames.get("warmed_keys", pd.DataFrame())
    if variant is not None and len(runs):
        reps = set(lk["replica"])
        runs = runs[runs["replica"].isin(reps)]
        wk = wk[wk["run_id"].isin(set(runs["run_id"]))] if len(wk) else wk
    return lk, runs, wk


def _record(lk: pd.DataFrame, runs: pd.DataFrame, wk: pd.DataFrame) -> _Recording:
    """Per layer with hit/miss lookups: request rates per bucket, instances, the recorded hit
    rate (overall and per bucket), a warmed key's cost and size."""
    rec = _Recording()
    for layer in LAYERS:
        sub = lk[(lk["layer"] == layer) & lk["result"].isin(["hit", "miss"])]
        if sub.empty:
            continue
        rec.rates[layer] = _rates(lk, layer, BUCKET_S)
        rec.instances[layer] = sorted({c[0] for c in rec.rates[layer].columns})
        hits = sub.loc[sub["result"] == "hit", "count"].sum()
        rec.hit_rate[layer] = float(hits / sub["count"].sum())
        rec.recorded[layer] = _recorded(sub, rec.rates[layer].index)
        w = wk[wk["layer"] == layer] if len(wk) else wk
        rec.cost_per_key[layer] = float(w["gpu_s"].mean()) if len(w) else _DEFAULT_COST[layer]
        r = runs[runs["layer"] == layer] if len(runs) else runs
        rec.bytes_per_key[layer] = (
            float(r["bytes"].sum() / max(r["keys"].sum(), 1)) if len(r) else 0.0
        )
    if not rec.rates:
        raise ValueError("no response or embedding lookups to replay")
    return rec


def _starts(
    rec: _Recording, lk: pd.DataFrame, runs: pd.DataFrame, gauges: Any, t0: float
) -> tuple[dict[str, list[float]], set[str]]:
    """Each instance's start times (a response instance is a variant's pool: it starts with the
    recording; an embedding one a replica: at its restarts), and the instances with warm-ups."""
    rs = restarts(runs, gauges, t0)
    warmed_reps = set(runs["replica"].astype(str)) if len(runs) else set()
    warmed_vars = set(lk.loc[lk["replica"].astype(str).isin(warmed_reps), "variant"].astype(str))
    starts: dict[str, list[float]] = {}
    warmed = set()
    for layer in rec.rates:
        for inst in rec.instances[layer]:
            if layer == "response":
                starts[inst] = [t0]
                if inst in warmed_vars:
                    warmed.add(inst)
            else:
                rep = inst.split("/", 1)[1]
                starts[inst] = rs.get(rep, [t0])
                if rep in warmed_reps:
                    warmed.add(inst)
    return starts, warmed


def _fit_skew(m: Model, layer: str, hit_rate: float) -> float:
    """The Zipf exponent whose replay (warm-ups included) gives the recorded hit rate, by
    bisection over [0, 2.5]."""
    lo, hi = 0.0, 2.5
    for _ in range(11):
        s = (lo + hi) / 2
        hb, nb = _layer_hits(m, layer, s, m.base)
        e, _ = _warm_extra(m, layer, s, m.base, np.random.default_rng(0))
        if (hb.sum() + e) / nb.sum() < hit_rate:
            lo = s
        else:
            hi = s
    return (lo + hi) / 2


def calibrate(
    frames: dict[Any, Any],
    variant: str | None = None,
    base: Params | None = None,
    catalog: dict[str, int] | None = None,
    capacity: dict[str, float] | None = None,
    peak_at: float | None = None,
    weights_load_s: float = 120.0,
) -> Model:
    """Fit the cache model to a recorded run (one A/B variant's pool, or all lookups): the
    recorded rates, starts and warm-ups, then each layer's popularity skew so that the replay
    gives the recorded hit rate."""
    lk, runs, wk = _pool(frames, variant)
    base = base or recorded_params({"warmup_runs": runs, "warmed_keys": wk})
    rec = _record(lk, runs, wk)
    t0, t1 = float(lk["ts"].min()) - 60.0, float(lk["ts"].max())
    starts, warmed = _starts(rec, lk, runs, frames.get("gauges"), t0)
    if peak_at is None:
        from .forecast import next_peak

        pk = next_peak(frames["lookups"])
        peak_at = (pk.at % 86400) if pk else 15 * 3600.0
    m = Model(
        rates=rec.rates,
        instances=rec.instances,
        s={},
        catalog={"response": 4000, "embedding": 15000, **(catalog or {})},
        capacity={"response": 20000.0, "embedding": 20000.0, **(capacity or {})},
        cost_per_key=rec.cost_per_key,
        bytes_per_key=rec.bytes_per_key,
        recorded_hit_rate=rec.hit_rate,
        starts=starts,
        peak_at=float(peak_at),
        weights_load_s=weights_load_s,
        t0=t0,
        t1=t1,
        base=base,
        warmed=frozenset(warmed),
        recorded=rec.recorded,
    )
    _readiness(m, lk, runs, frames)
    # recorded warm-up trigger: keep the recorded pre-peak time as the base lead
    pre = runs[runs["trigger"] == "forecast_peak"] if len(runs) else runs
    if len(pre):
        m.base = replace(base, lead_s=float((peak_at - pre["started"].min() % 86400) % 86400))
    for layer in m.rates:
        m.s[layer] = _fit_skew(m, layer, rec.hit_rate[layer])
    m.base_hits = {
        layer: _layer_hits(m, layer, m.s[layer], m.base)[0].sum()
        + _warm_extra(m, layer, m.s[layer], m.base, np.random.default_rng(0))[0]
        for layer in m.rates
    }
    m.base_hits.update({f"_cost_{layer}": v for layer, v in replay_cost(m, m.base).items()})
    return m


def _readiness(m: Model, lk: pd.DataFrame, runs: pd.DataFrame, frames: dict[Any, Any]) -> None:
    """What the gate wait, fidelity and persistence read: warm-up seconds per key and gated
    starts, each replica's request rate, the fault windows, each layer's persistence."""
    if len(runs):
        for layer in m.rates:
            r = runs[(runs["layer"] == layer) & (runs["keys"] > 0)]
            d = (r["ended"] - r["started"]) / r["keys"]
            m.sec_per_key[layer] = float(d.dropna().median()) if d.notna().any() else 0.0
        m.gated = restarts(runs[runs["trigger"] == "replica_start"], None, m.t0)
    per_request = [n for n in start_layers() if (lk["layer"] == n).any()] or ["response"]
    hw = lk[lk["layer"] == per_request[0]]
    m.req_rate = {
        str(k): float(v) / max(m.t1 - m.t0, 1.0)
        for k, v in hw.groupby("replica")["count"].sum().items()
    }
    fl = frames.get("faults")
    if fl is not None and len(fl):
        m.faults = [(float(a), float(b)) for a, b in zip(fl["start"], fl["end"], strict=True)]
    for layer in m.rates:
        lags, rho, note = persistence(frames.get("hot_keys"), layer)
        m.persist[layer], m.persist_note[layer] = (lags, rho), note


def curves(m: Model, p: Params, seed: int = 0) -> pd.DataFrame:
    """Replayed hit rate per layer and bucket (a warm-up's extra hits in the buckets of their first
    reads): ts (bucket end), layer, hit_rate, requests."""
    rows = []
    for layer in m.rates:
        hb, nb = _layer_hits(m, layer, m.s[layer], p)
        ev: list[Any] = []
        _warm_extra(m, layer, m.s[layer], p, np.random.default_rng(seed), ev)
        idx = m.rates[layer].index.to_numpy(float)
        for b, per_bucket in ev:
            hb[b : b + len(per_bucket)] += per_bucket
        rows.append(
            pd.DataFrame(
                {
                    "ts": idx + BUCKET_S,
                    "layer": layer,
                    "hit_rate": np.minimum(hb / np.maximum(nb, 1e-9), 1.0),
                    "requests": nb,
                }
            )
        )
    return pd.concat(rows, ignore_index=True)


def replay_cost(m: Model, p: Params) -> dict[str, float]:
    out = {}
    for layer in m.rates:
        _, runs = _warm_extra(m, layer, m.s[layer], p, np.random.default_rng(0))
        out[layer] = runs * p.warm_keys * m.cost_per_key[layer]
    return out


FIDELITY_TOL = 0.05  # replayed vs recorded hit rate per bucket, absolute
FIDELITY_SHARE = 0.90  # share of buckets that must be within FIDELITY_TOL
FIDELITY_MIN_REQUESTS = (
    100  # buckets with fewer lookups are not scored (binomial sd up to 5 points)
)


def _recorded(sub: pd.DataFrame, index: pd.Index) -> pd.DataFrame:
    """Recorded hits and lookups of one layer per replay bucket (``sub``: its hit/miss lookups)."""
    b = (sub["ts"].to_numpy(float) // BUCKET_S) * BUCKET_S
    hit = (sub["result"] == "hit").to_numpy()
    c = sub["count"].to_numpy(float)
    g = (
        pd.DataFrame({"b": b, "hits": np.where(hit, c, 0.0), "requests": c})
        .groupby("b")[["hits", "requests"]]
        .sum()
    )
    return g.reindex(index, fill_value=0.0)


@dataclass(frozen=True)
class Fidelity:
    """How well the replay with the recorded parameters reproduces the recorded traffic."""

    # per layer: buckets scored, within, share, ok, median and max |diff|, buckets in known fault
    # windows (faulted) and buckets with fewer than FIDELITY_MIN_REQUESTS lookups (unscored)
    table: pd.DataFrame
    # per layer and bucket: ts (bucket end), recorded, replayed, requests, diff, scored
    buckets: pd.DataFrame
    ok: bool  # every layer within FIDELITY_TOL in at least FIDELITY_SHARE of its scored buckets

    def sentence(self) -> str:
        """One sentence: trusted, or which layers miss and by how much."""
        if self.ok:
            return (
                f"The replay reproduces the recorded traffic: on every layer at least "
                f"{FIDELITY_SHARE:.0%} of 15-min buckets are within "
                f"±{FIDELITY_TOL * 100:.0f} points."
            )
        bad = self.table[~self.table["ok"]]
        parts = [
            f"{layer} {share:.0%} of {n} buckets within ±{FIDELITY_TOL * 100:.0f} points"
            if n
            else f"{layer} has no bucket with {FIDELITY_MIN_REQUESTS} lookups"
            for layer, share, n in zip(
                bad["layer"].astype(str), bad["share"], bad["buckets"], strict=True
            )
        ]
        return (
            "The replay does not reproduce the recorded traffic ("
            + "; ".join(parts)
            + f"; {FIDELITY_SHARE:.0%} needed), so it makes no recommendation."
        )


def fidelity(
    m: Model,
    p: Params | None = None,
    seed: int = 0,
    tol: float = FIDELITY_TOL,
    share: float = FIDELITY_SHARE,
    min_requests: float = FIDELITY_MIN_REQUESTS,
) -> Fidelity:
    """Replayed (parameters ``p``, default the recorded ones) vs recorded hit rate per layer and
    15-min bucket. A bucket is scored when it holds at least ``min_requests`` lookups and does not
    overlap a known fault window (the ``faults`` frame: a trap is not part of the replay); a layer
    passes when ``|replayed − recorded| ≤ tol`` in at least ``share`` of its scored buckets."""
    cv = curves(m, p or m.base, seed)
    rows, det = [], []
    for layer, g in cv.groupby("layer", sort=False):
        rec = m.recorded[str(layer)]
        recorded_rate = (rec["hits"] / rec["requests"].where(rec["requests"] > 0)).to_numpy(float)
        d = pd.DataFrame(
            {
                "ts": g["ts"].to_numpy(float),
                "layer": layer,
                "recorded": recorded_rate,
                "replayed": g["hit_rate"].to_numpy(float),
                "requests": rec["requests"].to_numpy(float),
            }
        )
        d["diff"] = d["replayed"] - d["recorded"]
        b0 = d["ts"].to_numpy(float) - BUCKET_S
        d["fault"] = np.zeros(len(d), bool)
        for fa, fb in m.faults:  # a known fault window is not replayed: its buckets are not scored
            d["fault"] |= (b0 < fb) & (b0 + BUCKET_S > fa)
        d["scored"] = (d["requests"] >= min_requests) & ~d["fault"]
        sc = d[d["scored"]]
        within = int((sc["diff"].abs() <= tol + 1e-12).sum())
        n = len(sc)
        rows.append(
            {
                "layer": layer,
                "buckets": n,
                "within": within,
                "share": within / n if n else 0.0,
                "ok": bool(n > 0 and within >= share * n),
                "median_abs_diff": float(sc["diff"].abs().median()) if n else float("nan"),
                "max_abs_diff": float(sc["diff"].abs().max()) if n else float("nan"),
                "faulted": int(d["fault"].sum()),
                "unscored": int((~d["scored"] & ~d["fault"]).sum()),
            }
        )
        det.append(d)
    table = pd.DataFrame(rows)
    return Fidelity(
        table,
        pd.concat(det, ignore_index=True) if det else pd.DataFrame(),
        bool(len(table) and table["ok"].all()),
    )


def gate_wait(m: Model, p: Params, layer: str) -> float:
    """Request-seconds of TTFT that requests spend waiting while ``layer``'s warm-up holds a
    readiness gate: at each gated start of a replica that warms up, the warm-up lasts ``D =
    warm_keys × seconds per key`` (the recorded runs' duration per key) and the requests arriving
    meanwhile (the replica's rate ``ρ``, from its ``weights`` lookups — one per request — else its
    response lookups) wait ``D/2`` on average: ``ρ·D²/2`` per start. A rolling restart's surge
    instance warms in the background and is not counted."""
    d = p.warm_keys * m.sec_per_key.get(layer, 0.0)
    total = 0.0
    for rep, ts in m.gated.items():
        if m.warmed is not None and not any(i.endswith("/" + rep) for i in m.warmed):
            continue
        total += len(ts) * m.req_rate.get(rep, 0.0) * d * d / 2.0
    return total
