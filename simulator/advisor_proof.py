"""The advisor's proof: a simulator A/B of a recommendation against the simulator's defaults.

The recommendation itself is a pure function of recorded frames
(:func:`warmscope.analysis.advisor.advise`); proving it needs the simulator, so it lives here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from warmscope.analysis.ab_report import report_for
from warmscope.analysis.advisor import sim_overrides
from warmscope.analysis.replay import Params
from warmscope.collectors.store import EmbeddedStore
from warmscope.sources import EmbeddedSource

from .config import SimConfig
from .engine import Simulation, write_run_info

__all__ = ["Proof", "prove"]


@dataclass
class Proof:
    """A simulator A/B: pool A on the default parameters, pool B on the recommended ones, same
    traffic."""

    store: str
    hours: float
    seed: int
    results: dict[
        str, dict[Any, Any]
    ]  # metric -> control, treatment, abs_effect, abs_low, abs_high, p_value
    requests_b: float
    warm_gpu_s: dict[str, float]  # variant -> warm-up GPU-s
    net_gpu_s: tuple[
        float, float, float
    ]  # estimate, 95 % low, high: GPU-s saved by B minus its extra warm-up
    wins: list[str]
    seconds: float

    def as_dict(self) -> dict[Any, Any]:
        return asdict(self)


def prove(
    params: Params,
    store: str,
    hours: float = 3.0,
    seed: int = 2,
    peak_at: float = 15 * 3600.0,
    rps: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Proof:
    """Simulate ``hours`` with both pools on the predictive strategy: pool A with the simulator's
    default parameters, pool B with ``params`` (``peak_at``: the forecast peak's time of day, s), on
    seed ``seed``; compare them with the A/B report's unit-level tests. A win: the prefix-KV hit
    rate up, or the net GPU-s return up, with a 95 % CI excluding zero."""
    t0 = time.perf_counter()
    common = dict(
        hours=hours,
        seed=seed,
        strategy_a="predictive",
        strategy_b="predictive",
        experiment="advisor-proof",
        rps=rps,
    )
    cfg_a = SimConfig.load(None, **common)
    o = sim_overrides(params)
    cfg_b = SimConfig.load(
        None,
        **common,
        warm_keys=o["warm_keys"],
        response_ttl_s=o["response_ttl_s"],
        lambda_mode=o["lambda_mode"],
        lambda_fixed=o["lambda_fixed"],
        peak_warmup_at_h=((peak_at - params.lead_s) % 86400) / 3600.0,
    )
    st = EmbeddedStore(store, durable=False)
    for i, (cfg, v) in enumerate(((cfg_a, "A"), (cfg_b, "B"))):
        prog = (lambda d, t, i=i: progress(i * t + d, 2 * t)) if progress else None
        # each pool's own warm-up run ids (the store keys runs by id)
        sim = Simulation(cfg, st, variants=(v,), progress=prog, first_run_seq=100_000 * i)
        sim.run(finish=False)
    write_run_info(st, cfg_a, cfg_a.start, [])
    st.close()
    src = EmbeddedSource(store)
    rep = report_for(src, "advisor-proof")
    res = {
        r.metric: {
            k: getattr(r, k)
            for k in ("control", "treatment", "abs_effect", "abs_low", "abs_high", "p_value")
        }
        for r in rep.results
    }
    runs = src.frame("warmup_runs")
    warm = {
        v: float(runs.loc[runs["replica"].str.startswith(v.lower() + "-"), "gpu_s"].sum())
        for v in "AB"
    }
    req = src.frame("requests")
    nb = float(req.loc[req["variant"] == "B", "requests"].sum())
    g = res.get("GPU-s per request", {})
    dw = warm["B"] - warm["A"]
    net = (
        -g.get("abs_effect", np.nan) * nb - dw,
        -g.get("abs_high", np.nan) * nb - dw,
        -g.get("abs_low", np.nan) * nb - dw,
    )
    wins = []
    kv = res.get("hit rate (prefix_kv)")
    if kv and kv["abs_low"] > 0:
        wins.append("prefix-KV hit rate")
    if net[1] > 0:
        wins.append("net GPU-s return")
    return Proof(store, hours, seed, res, nb, warm, net, wins, time.perf_counter() - t0)
