"""Warm-up advisor: tune the warm-up parameters by Bayesian optimisation over
the what-if replay, and say when the next peak comes.

Search space (each mapped to [0, 1]): warm-set size ``warm_keys`` 25–4000
(log), response TTL 5 min–4 h (log), heat decay λ 1e-5–1e-2 /s (log), trigger
lead time 0–8 h before the forecast peak. The objective (``objective``) is
the return of the compute ROI (``analysis.roi``: GPU-s saved × price − cost)
rather than its ratio:

* ``"net_gpu_s"`` (default) — the replay's ``net_gpu_s``: GPU-seconds saved
  against the recorded parameters minus the extra warm-up GPU-seconds (× a
  price per GPU-s it is the money a change returns). The ratio
  ``(saved − cost) / cost`` rewards spending little rather than saving much:
  a change that returns less in total can have the higher ratio, so it is
  reported beside the gain, not maximised, by default.
* ``"roi"`` — that ratio (the warm-ups' own compute ROI), for a team that
  must justify each GPU-second of warming on its own.

A candidate whose warm-ups cost more than the budget (GPU-s per day) is
penalised by the excess. A Gaussian process
(scikit-learn, Matérn 5/2 + white noise, normalised targets) models the
objective; the next point maximises expected improvement

    EI(x) = (μ(x) − f* − ξ)·Φ(z) + σ(x)·φ(z),   z = (μ(x) − f* − ξ) / σ(x)

over random candidates, after a scrambled Sobol start. The recommendation is
the best evaluated point within the budget; its expected gain is the replay's net GPU-s with the
GP's standard deviation there as its uncertainty.

Example::

    rec = advise(frames, budget_gpu_s=500)
    rec.params, rec.gain, rec.gain_sd, rec.peak
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy.stats import norm, qmc

from .forecast import Peak, next_peak
from .replay import SLO_LAMBDA, Model, Outcome, Params, calibrate, replay

__all__ = ["expected_improvement", "Recommendation", "advise", "OBJECTIVES", "optimise", "sim_overrides", "BOUNDS"]

BOUNDS = {"warm_keys": (25.0, 4000.0, "log"), "response_ttl_s": (300.0, 14400.0, "log"),
          "lambda_per_s": (1e-5, 1e-2, "log"), "lead_s": (0.0, 8 * 3600.0, "lin")}
NAMES = tuple(BOUNDS)


def expected_improvement(mu: Any, sd: Any, best: float, xi: float = 0.01) -> np.ndarray:
    """EI for maximisation; 0 where sd is 0 and the mean does not improve."""
    mu, sd = np.asarray(mu, float), np.asarray(sd, float)
    imp = mu - best - xi
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(sd > 0, imp / sd, 0.0)
        ei = np.where(sd > 0, imp * norm.cdf(z) + sd * norm.pdf(z), np.maximum(imp, 0.0))
    return ei  # type: ignore[no-any-return]  # scipy is untyped


def to_params(u: np.ndarray) -> Params:
    v = {}
    for x, (name, (lo, hi, kind)) in zip(u, BOUNDS.items(), strict=True):
        v[name] = math.exp(math.log(lo) + x * (math.log(hi) - math.log(lo))) if kind == "log" else lo + x * (hi - lo)
    return Params(warm_keys=int(round(v["warm_keys"])), response_ttl_s=round(v["response_ttl_s"]),
                  lambda_per_s=v["lambda_per_s"], lead_s=round(v["lead_s"] / 60) * 60)


def to_unit(p: Params) -> np.ndarray:
    out = []
    for name, (lo, hi, kind) in BOUNDS.items():
        v = float(np.clip(getattr(p, name), lo, hi))
        out.append((math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo)) if kind == "log" else
                   (v - lo) / (hi - lo))
    return np.array(out)


def optimise(f: Callable[[np.ndarray], float], dim: int, n_init: int = 8, n_iter: int = 16, seed: int = 0,
             progress: Callable[[int, int], None] | None = None, x0: list[np.ndarray] | None = None
             ) -> tuple[np.ndarray, np.ndarray, Any]:
    """Maximise ``f`` on [0, 1]^dim with a GP and expected improvement; returns (X, y, gp)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

    rng = np.random.default_rng(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Sobol balance needs 2^k points; a few start points do
        X = list(x0 or []) + list(qmc.Sobol(dim, scramble=True, seed=seed).random(n_init))
    total = len(X) + n_iter
    y = []
    for i, x in enumerate(X):
        y.append(f(x))
        if progress:
            progress(i + 1, total)
    kernel = ConstantKernel(1.0, (1e-3, 1e3)) * Matern([0.3] * dim, (1e-2, 10.0), nu=2.5) + \
        WhiteKernel(1e-3, (1e-8, 1e-1))
    gp = GaussianProcessRegressor(kernel, normalize_y=True, n_restarts_optimizer=0, random_state=seed)
    for _ in range(n_iter):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            gp.fit(np.array(X), np.array(y))
        cand = rng.random((1024, dim))
        # also search near the best point so far
        best_x = X[int(np.argmax(y))]
        cand[:128] = np.clip(best_x + rng.normal(0, 0.05, (128, dim)), 0, 1)
        mu, sd = gp.predict(cand, return_std=True)
        x = cand[int(np.argmax(expected_improvement(mu, sd, max(y))))]
        X.append(x)
        y.append(f(x))
        if progress:
            progress(len(X), total)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gp.fit(np.array(X), np.array(y))
    return np.array(X), np.array(y), gp


@dataclass
class Recommendation:
    params: Params
    base: Params
    outcome: Outcome
    base_outcome: Outcome
    gain: float  # the objective vs the recorded parameters: net GPU-s over the recorded span (or ROI ratio)
    gain_sd: float
    budget_gpu_s: float | None
    peak: Peak | None
    trigger_at: float | None  # Unix s of the recommended pre-peak warm-up
    evaluations: int
    seconds: float
    history: list[dict[Any, Any]] = field(default_factory=list)
    model: Model | None = None
    objective: str = "net_gpu_s"  # what ``gain`` is in: net GPU-s, or the ROI ratio

    def as_dict(self) -> dict[Any, Any]:
        d = {"params": self.params.as_dict(), "base": self.base.as_dict(), "outcome": self.outcome.as_dict(),
             "base_outcome": self.base_outcome.as_dict(), "objective": self.objective,
             "gain": self.gain, "gain_sd": self.gain_sd,
             "gain_gpu_s": self.outcome.net_gpu_s - self.base_outcome.net_gpu_s,
             "budget_gpu_s_per_day": self.budget_gpu_s, "evaluations": self.evaluations,
             "seconds": round(self.seconds, 2), "simulator": sim_overrides(self.params),
             "next_peak": asdict(self.peak) if self.peak else None, "trigger_at": self.trigger_at}
        return d


def sim_overrides(p: Params) -> dict[Any, Any]:
    """The ``[simulator]`` settings that apply ``p`` to a pool."""
    slo = abs(p.lambda_per_s / SLO_LAMBDA - 1) < 0.2
    return {"warm_keys": p.warm_keys, "response_ttl_s": float(p.response_ttl_s),
            "lambda_mode": "slo" if slo else "fixed", "lambda_fixed": float(p.lambda_per_s),
            "lead_s": float(p.lead_s)}


OBJECTIVES = ("net_gpu_s", "roi")


def advise(frames: dict[Any, Any], budget_gpu_s: float | None = None, variant: str | None = None, n_init: int = 8,
           n_iter: int = 16, seed: int = 0, progress: Callable[[int, int], None] | None = None,
           model: Model | None = None, objective: str = "net_gpu_s") -> Recommendation:
    """Calibrate the replay on ``frames``, tune, and return the recommendation."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    t0 = time.perf_counter()
    m = model or calibrate(frames, variant=variant)
    days = max((m.t1 - m.t0) / 86400.0, 1e-9)
    base_out = replay(m, m.base)
    history: list[dict[Any, Any]] = []

    def f(u: np.ndarray) -> float:
        o = replay(m, to_params(u))
        if objective == "roi":
            v = o.roi if np.isfinite(o.roi) else -1.0
            if budget_gpu_s is not None and o.warm_gpu_s / days > budget_gpu_s:
                v -= 10 * (o.warm_gpu_s / days - budget_gpu_s) / budget_gpu_s
        else:
            v = o.net_gpu_s
            if budget_gpu_s is not None and o.warm_gpu_s / days > budget_gpu_s:
                v -= 10 * (o.warm_gpu_s / days - budget_gpu_s) * days
        history.append({**o.params.as_dict(), "net_gpu_s": o.net_gpu_s, "warm_gpu_s": o.warm_gpu_s,
                        "objective": v})
        return v

    X, y, gp = optimise(f, len(NAMES), n_init, n_iter, seed, progress, x0=[to_unit(m.base)])
    ok = np.array([budget_gpu_s is None or h["warm_gpu_s"] / days <= budget_gpu_s for h in history])
    best = int(np.argmax(np.where(ok, y, -np.inf))) if ok.any() else int(np.argmax(y))
    p = to_params(X[best])
    out = replay(m, p)
    _, sd = gp.predict(X[best][None, :], return_std=True)
    peak = next_peak(frames["lookups"])
    trig = peak.at - p.lead_s if peak else None
    gain = out.net_gpu_s - base_out.net_gpu_s if objective == "net_gpu_s" else out.roi - base_out.roi
    return Recommendation(p, m.base, out, base_out, gain, float(sd[0]), budget_gpu_s, peak, trig, len(y),
                          time.perf_counter() - t0, history, m, objective)
