"""How much a better forecast could still buy on the demo day: bounds for the predictive strategy.

    python -m bench.strategy_headroom [--bound recent|seen|truth|all] [--out DIR] [--hours 24]

Simulates the demo's day (``warmscope demo``: three pools on the same traffic — none, static
top-K, predictive — hourly rolling restarts and content drift, the two injected traps; a fixed
start, so every run is the same day) once as it is, then once per bound with pool C's
response-cache warm set chosen by that bound instead of by predictive's forecast (its other
layers, LoRA, prefix-KV and embeddings, are predictive's own), and prints C − B (static top-K)
from the project's A/B report for each: TTFT per request and every layer's hit rate, relative,
with 95 % CIs. The first row is the baseline in the same run: predictive as it ships.

Each bound knows each response key's true request rate now — the generating model's: the tenant's
share of traffic × the template's share of the tenant's × the fill's Zipf probability after the
current content drift (:func:`fill_probs`) × the pool's request rate — and warms, within the same
``warm_keys`` budget, the keys most likely to be read after their cached entry lapses and before
the next drift, weighted by the TTFT a miss costs (predictive's ranking, with the true rate in
place of the estimate):

* ``truth``: over every key the generator can produce (content no one has asked for yet
  included, which no forecast from traffic can name);
* ``seen``: over keys the pool has read today or yesterday's log holds;
* ``recent``: over the evergreen head (``EVERGREEN`` fills, whose popularity never moves) and
  keys read since the last content drift: what a forecast from traffic has evidence on, priced
  with perfect rates and a known drift time. A traffic-based forecast cannot do better than
  this on the response layer.

The bounds replace :func:`warmscope.simulator.engine.choose` in the worker processes, so they need
the ``fork`` start method (Linux); elsewhere the pools run in this process. A day takes about
3 minutes on two idle cores; ``--bound all`` runs four.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
from scipy.special import zeta
from warmscope.analysis.ab_report import report_for
from warmscope.simulator import engine as sim_engine
from warmscope.simulator import strategies
from warmscope.simulator.run import simulate
from warmscope.simulator.traffic import (
    EVERGREEN,
    FILL_CATALOG,
    FILL_DRIFT_STEP,
    FILL_ZIPF,
    TEMPLATES,
    drift,
    rate_at,
    tenant_weights,
)
from warmscope.sources import EmbeddedSource

DAY_START = 1796190000.0  # a fixed start: every run simulates the same day
METRICS = (
    "TTFT per request (s)",
    "hit rate (response)",
    "hit rate (embedding)",
    "hit rate (prefix_kv)",
    "hit rate (lora)",
)


def rank_probs(catalog: int = FILL_CATALOG, s: float = FILL_ZIPF) -> np.ndarray:
    """P(rank = r) for rank = (Z − 1) mod catalog, Z ~ Zipf(s): Σₖ (r + 1 + k·catalog)^−s / ζ(s)
    = catalog^−s · ζ(s, (r + 1)/catalog) / ζ(s) (Hurwitz zeta)."""
    r = np.arange(catalog)
    return np.asarray(zeta(s, (r + 1) / catalog) * catalog**-s / zeta(s, 1))


def fill_probs(cfg: Any, at_rel: float, p_rank: np.ndarray) -> np.ndarray:
    """P(fill = v) at ``at_rel`` s into the day: each rank's probability carried to the fill
    :func:`traffic.drift` moves it to (the evergreen head stays, the rest rotates)."""
    c = len(p_rank)
    fills = drift(np.arange(c), c, cfg, at_rel, FILL_DRIFT_STEP)
    return np.bincount(fills, weights=p_rank, minlength=c)


def _bounded_choose(bound: str, p_rank: np.ndarray, sim_ref: dict[str, Any]) -> Any:
    """A ``choose`` whose predictive response warm set is the bound's (see the module doc)."""
    original = strategies.choose

    def choose(
        strategy: str,
        cfg: Any,
        now_rel: float,
        yesterday: Any,
        heat: Any,
        by_name: Any,
        tenant_scope: Any = None,
        replica: Any = None,
        valid_for: Any = None,
        residence: Any = None,
    ) -> list:
        out = original(
            strategy,
            cfg,
            now_rel,
            yesterday,
            heat,
            by_name,
            tenant_scope,
            replica,
            valid_for,
            residence,
        )
        if strategy != "predictive" or replica is None or valid_for is None:
            return out
        out = [c for c in out if c[0] != "response"]
        period = cfg.content_drift_h * 3600
        drift_start = math.floor(now_rel / period) * period
        window = min(cfg.warm_horizon_s, residence("response"), drift_start + period - now_rel)
        pool_rate = rate_at(cfg, now_rel, sim_ref["sim"].bursts) / len(cfg.arms)
        tw = tenant_weights(cfg.tenants)
        pf = fill_probs(cfg, now_rel, p_rank)
        adapter_miss = strategies._adapter_miss(cfg, heat.tenant_recent) if heat else {}
        seen_heat = heat.heat if heat is not None else {}
        cands: list[tuple[float, str, str, int]] = []
        for ten in by_name.values():
            prev = 0.0
            for tpl, cum in zip(ten.templates, ten.cum, strict=True):
                share, prev = cum - prev, cum
                if not TEMPLATES[tpl].cacheable:
                    continue
                rate = pool_rate * tw[ten.idx] * share * pf
                miss_s = strategies._response_miss_ttft(cfg, tpl, adapter_miss.get(ten.name, 1.0))
                # the likeliest fills only: a fill past 4 budgets' worth in its own template
                # cannot outrank the budget's last key across all of them
                for v in np.argsort(-rate)[: 4 * cfg.warm_keys]:
                    key = f"resp:{TEMPLATES[tpl].name}:{ten.name}.{v}"
                    e = seen_heat.get(key)
                    if bound == "seen" and e is None and key not in yesterday.counts["response"]:
                        continue
                    if bound == "recent" and v >= EVERGREEN and (e is None or e[1] < drift_start):
                        continue
                    d = window - valid_for("response", key)
                    if d > 0:
                        cands.append((-math.expm1(-rate[v] * d) * miss_s, key, ten.name, tpl))
        cands.sort(key=lambda c: -c[0])
        return out + [
            ("response", key, t, tpl, strategies.warm_cost(cfg, "response", tpl))
            for _, key, t, tpl in cands[: cfg.warm_keys]
        ]

    return choose


def run_day(store: Path, hours: float, bound: str | None) -> dict[str, tuple[float, float, float]]:
    from warmscope.app.cli.main import demo_world

    cfg, faults = demo_world(hours, now=DAY_START)
    workers = 2 if "fork" in mp.get_all_start_methods() else 1
    if bound is None:
        simulate(cfg, store, faults, workers=workers)
    else:
        sim_ref: dict[str, Any] = {}
        init = sim_engine.Simulation.__init__

        def keep(self: Any, *a: Any, **kw: Any) -> None:
            init(self, *a, **kw)
            sim_ref["sim"] = self  # the worker's simulation: its traffic bursts

        with (
            mock.patch.object(sim_engine.Simulation, "__init__", keep),
            mock.patch.object(sim_engine, "choose", _bounded_choose(bound, rank_probs(), sim_ref)),
        ):
            simulate(cfg, store, faults, workers=workers)
    rep = report_for(EmbeddedSource(store), cfg.experiment, control="B", treatment="C")
    res = {r.metric: r for r in rep.results}
    return {m: (res[m].rel_effect, res[m].rel_low, res[m].rel_high) for m in METRICS if m in res}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bound", choices=("recent", "seen", "truth", "all"), default="recent")
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--out", type=Path, help="keep the stores in this folder")
    args = ap.parse_args(argv)
    bounds = ("recent", "seen", "truth") if args.bound == "all" else (args.bound,)
    out = args.out or Path(tempfile.mkdtemp(prefix="headroom-"))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in ("predictive", *bounds):
        t0 = time.perf_counter()
        bound = None if name == "predictive" else name
        rows.append((name, run_day(out / f"{name}.sqlite", args.hours, bound)))
        print(f"{name}: simulated and reported in {time.perf_counter() - t0:.0f} s", flush=True)
    print(f"\nC − B (static top-K), relative, 95 % CI; {args.hours:g} h demo day; stores in {out}")
    print("| pool C | " + " | ".join(METRICS) + " |")
    print("|---" * (len(METRICS) + 1) + "|")
    for name, res in rows:
        cells = [
            f"{e:+.2%} [{lo:+.2%}, {hi:+.2%}]" if not math.isnan(e) else "–"
            for e, lo, hi in (res.get(m, (math.nan,) * 3) for m in METRICS)
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
