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

import json
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import norm, qmc

from .forecast import Peak, next_peak
from .objectives import OBJECTIVES
from .replay import (
    FIDELITY_TOL,
    LAYERS,
    SLO_LAMBDA,
    Fidelity,
    Model,
    Outcome,
    Params,
    calibrate,
    fidelity,
    gate_wait,
    replay,
)
from .value import ValueModel

__all__ = [
    "fmt_hours",
    "expected_improvement",
    "Recommendation",
    "LayerAdvice",
    "NoRecommendation",
    "advise",
    "check_input",
    "OBJECTIVES",
    "optimise",
    "sim_overrides",
    "BOUNDS",
    "fidelity_text",
    "layer_table",
    "PrefixAdvice",
    "PrefixOutcome",
    "advise_prefix",
    "prefix_only",
    "prefix_text",
    "cache_shares",
    "cache_notes",
]

BOUNDS = {
    "warm_keys": (25.0, 4000.0, "log"),
    "response_ttl_s": (300.0, 14400.0, "log"),
    "lambda_per_s": (1e-5, 1e-2, "log"),
    "lead_s": (0.0, 8 * 3600.0, "lin"),
}
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
        v[name] = (
            math.exp(math.log(lo) + x * (math.log(hi) - math.log(lo)))
            if kind == "log"
            else lo + x * (hi - lo)
        )
    return Params(
        warm_keys=int(round(v["warm_keys"])),
        response_ttl_s=round(v["response_ttl_s"]),
        lambda_per_s=v["lambda_per_s"],
        lead_s=round(v["lead_s"] / 60) * 60,
    )


def to_unit(p: Params) -> np.ndarray:
    out = []
    for name, (lo, hi, kind) in BOUNDS.items():
        v = float(np.clip(getattr(p, name), lo, hi))
        out.append(
            (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))
            if kind == "log"
            else (v - lo) / (hi - lo)
        )
    return np.array(out)


def optimise(
    f: Callable[[np.ndarray], float],
    dim: int,
    n_init: int = 8,
    n_iter: int = 16,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    x0: list[np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, Any]:
    """Maximise ``f`` on [0, 1]^dim with a GP and expected improvement; returns (X, y, gp)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

    rng = np.random.default_rng(seed)
    with warnings.catch_warnings():
        # Sobol balance needs 2^k points; a few start points do
        warnings.simplefilter("ignore", UserWarning)
        X = list(x0 or []) + list(qmc.Sobol(dim, scramble=True, seed=seed).random(n_init))
    total = len(X) + n_iter
    y = []
    for i, x in enumerate(X):
        y.append(f(x))
        if progress:
            progress(i + 1, total)
    kernel = ConstantKernel(1.0, (1e-3, 1e3)) * Matern(
        [0.3] * dim, (1e-2, 10.0), nu=2.5
    ) + WhiteKernel(1e-3, (1e-8, 1e-1))
    gp = GaussianProcessRegressor(
        kernel, normalize_y=True, n_restarts_optimizer=0, random_state=seed
    )
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
class LayerAdvice:
    """The recommendation for one cache layer (the layers' replays are independent, so each is
    tuned on its own contribution to the objective)."""

    layer: str
    params: Params
    base_hit_rate: float
    hit_rate: float
    warm_gpu_s: float
    base_warm_gpu_s: float
    gain: float  # the objective's gain on this layer (currency for value/slo, GPU-s for net_gpu_s)
    gain_low: float  # with the latency price at its 95 % bounds (= gain when latency is not priced)
    gain_high: float
    gain_gpu_s: float  # net GPU-s on this layer
    # at a search bound; lowers the hit rate, and why
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[Any, Any]:
        d = asdict(self)
        d["params"] = self.params.as_dict()
        return d


@dataclass
class Recommendation:
    params: Params
    base: Params
    outcome: Outcome
    base_outcome: Outcome
    gain: float  # the objective vs the recorded parameters (currency, net GPU-s, or the ROI ratio)
    gain_sd: float
    budget_gpu_s: float | None
    peak: Peak | None
    trigger_at: float | None  # Unix s of the recommended pre-peak warm-up
    evaluations: int
    seconds: float
    history: list[dict[Any, Any]] = field(default_factory=list)
    model: Model | None = None
    objective: str = (
        "net_gpu_s"  # what ``gain`` is in: net GPU-s, the ROI ratio, or value (currency)
    )
    layers: dict[str, LayerAdvice] = field(default_factory=dict)
    values: ValueModel | None = None
    fidelity: Fidelity | None = None
    notes: list[str] = field(default_factory=list)  # objective chosen, and why

    def as_dict(self) -> dict[Any, Any]:
        d = {
            "params": self.params.as_dict(),
            "base": self.base.as_dict(),
            "outcome": self.outcome.as_dict(),
            "base_outcome": self.base_outcome.as_dict(),
            "objective": self.objective,
            "gain": self.gain,
            "gain_sd": self.gain_sd,
            "gain_gpu_s": self.outcome.net_gpu_s - self.base_outcome.net_gpu_s,
            "budget_gpu_s_per_day": self.budget_gpu_s,
            "evaluations": self.evaluations,
            "seconds": round(self.seconds, 2),
            "simulator": sim_overrides(self.params),
            "next_peak": asdict(self.peak) if self.peak else None,
            "trigger_at": self.trigger_at,
            "layers": {k: v.as_dict() for k, v in self.layers.items()},
            "prices": self.values.prices() if self.values else None,
            "notes": self.notes,
            "fidelity": (
                json.loads(self.fidelity.table.to_json(orient="records"))
                if self.fidelity is not None
                else None
            ),
        }
        return d


class NoRecommendation(ValueError):
    """The advisor will not recommend: one sentence says what is missing (``fidelity`` when the
    replay does not reproduce the recorded traffic)."""

    def __init__(self, sentence: str, fidelity: Fidelity | None = None) -> None:
        super().__init__(sentence)
        self.fidelity = fidelity


def sim_overrides(p: Params) -> dict[Any, Any]:
    """The ``[simulator]`` settings that apply ``p`` to a pool."""
    slo = abs(p.lambda_per_s / SLO_LAMBDA - 1) < 0.2
    return {
        "warm_keys": p.warm_keys,
        "response_ttl_s": float(p.response_ttl_s),
        "lambda_mode": "slo" if slo else "fixed",
        "lambda_fixed": float(p.lambda_per_s),
        "lead_s": float(p.lead_s),
    }


MIN_SPAN_S = 2 * 3600.0


def check_input(frames: dict[Any, Any], variant: str | None = None) -> str | None:
    """One sentence saying what the frames lack for a recommendation, or None."""
    lk = frames.get("lookups")
    if lk is None or len(lk) == 0:
        return "No lookups in the range: there is no traffic to replay."
    if variant is not None:
        lk = lk[lk["variant"] == variant]
    span = float(lk["ts"].max() - lk["ts"].min()) if len(lk) else 0.0
    if span < MIN_SPAN_S:
        return (
            f"Too little data: {span / 3600:.1f} h of lookups in the range, and the replay and "
            "forecasts "
            f"need at least {MIN_SPAN_S / 3600:g} h."
        )
    have = [ly for ly in LAYERS if ((lk["layer"] == ly) & lk["result"].isin(["hit", "miss"])).any()]
    if len(have) < len(LAYERS):
        missing = [ly for ly in LAYERS if ly not in have]
        return (
            (
                f"Only {' and '.join(have) or 'no'} replayable lookups in the range: the "
                "advisor needs the "
                f"{' and '.join(missing)} layer too, to share the warm-up between the layers."
            )
            if have
            else (
                "No response or embedding lookups in the range: those are the layers the "
                "advisor replays."
            )
        )
    runs = frames.get("warmup_runs")
    if runs is None or len(runs) == 0:
        return (
            "No warm-up runs in the range: the replay takes the warm-set size, cost per key "
            "and timing "
            "from recorded warm-ups, so pick a range with at least one run."
        )
    return None


def _bound_notes(layer: str, p: Params) -> list[str]:
    u = to_unit(p)
    out = []
    names: dict[str, tuple[str, Callable[[float], str]]] = {
        "warm_keys": ("warm-set size", lambda v: f"{v:g} keys"),
        "response_ttl_s": ("response TTL", lambda v: f"{v / 3600:g} h"),
        "lambda_per_s": ("heat decay λ", lambda v: f"{v:g} /s"),
        "lead_s": ("trigger lead time", lambda v: f"{v / 3600:g} h"),
    }
    for x, (name, (lo, hi, _)) in zip(u, BOUNDS.items(), strict=True):
        if name == "response_ttl_s" and layer != "response":
            continue
        label, fmt = names[name]
        if x <= 0.01:
            out.append(
                f"{label} is at the search's lower bound ({fmt(lo)}): a smaller value may be "
                "better still"
            )
        elif x >= 0.99:
            out.append(
                f"{label} is at the search's upper bound ({fmt(hi)}): a larger value may be "
                "better still"
            )
    return out


def _value_model(values: ValueModel | None) -> ValueModel:
    """The prices to tune on: ``values``, or GPU-s at 0.0008 each with latency not priced."""
    return values or ValueModel("gpu_s", 0.0008, 0.0, (0.0, 0.0), "no value model given")


def _pick_objective(vm: ValueModel, objective: str | None) -> tuple[str, list[str]]:
    """The objective asked for, or the default the prices give (``value`` when they price latency
    from conversions, ``slo`` when from an SLO, ``net_gpu_s`` otherwise) with a note saying so."""
    notes: list[str] = []
    if objective is None:
        objective = {"conversion": "value", "slo": "slo"}.get(vm.kind, "net_gpu_s")
        notes.append(
            "the default: "
            + {
                "value": "latency priced from the recorded conversions",
                "slo": "latency priced from the configured SLO",
            }.get(objective, f"latency not priced ({vm.note})")
        )
    return objective, notes


def _check_objective(vm: ValueModel, objective: str) -> None:
    """Refuse an unknown objective (``ValueError``), and ``value``/``slo`` without the prices they
    need (:class:`NoRecommendation`)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if objective == "value" and vm.kind != "conversion":
        raise NoRecommendation(
            f"No conversion data to price latency ({vm.note}): use --objective net_gpu_s, "
            "or configure an SLO for --objective slo."
        )
    if objective == "slo" and vm.kind != "slo":
        raise NoRecommendation(
            f"No SLO price ({vm.note}): configure the TTFT target and the penalty per "
            "request over it, or use --objective net_gpu_s."
        )


def _calibrated(
    frames: dict[Any, Any], variant: str | None, model: Model | None, require_fidelity: bool
) -> tuple[Model, Fidelity | None]:
    """The replay model (``model``, or calibrated on ``frames`` once :func:`check_input` passes)
    and its fidelity on the recorded day; refuses a model that does not reproduce it when
    ``require_fidelity``."""
    fid = None
    if model is None:
        missing = check_input(frames, variant)
        if missing:
            raise NoRecommendation(missing)
    m = model or calibrate(frames, variant=variant)
    if m.recorded:
        fid = fidelity(m)
        if require_fidelity and not fid.ok:
            raise NoRecommendation(fid.sentence(), fid)
    return m, fid


@dataclass
class _Tuning:
    """What the search steps share: the model, the recorded parameters' replay, the objective and
    its prices, and every evaluated point (``history``, in evaluation order)."""

    m: Model
    base_out: Outcome
    objective: str
    vm: ValueModel
    days: float
    history: list[dict[Any, Any]] = field(default_factory=list)

    def worth(self, o: Outcome, layer: str, per_ttft: float) -> float:
        """The objective's value of ``o`` on one layer against the recorded parameters."""
        m, base_out, vm = self.m, self.base_out, self.vm
        dh = o.hits[layer] - base_out.hits[layer]
        dg = o.layer_warm_gpu_s[layer] - base_out.layer_warm_gpu_s[layer]
        c = m.cost_per_key[layer]
        if self.objective == "net_gpu_s":
            return dh * c - dg
        # TTFT: the extra hits' miss seconds saved, minus the wait behind a gated start's warm-up
        dw = gate_wait(m, o.params, layer) - gate_wait(m, m.base, layer)
        return dh * c * (vm.price_per_gpu_s + per_ttft) - dw * per_ttft - dg * vm.price_per_gpu_s

    def objective_fn(
        self, lys: tuple[str, ...], cap: float | None
    ) -> Callable[[np.ndarray], float]:
        """The function the search maximises on layers ``lys``: the objective, less 10× the
        excess over the budget ``cap`` (GPU-s per day); each evaluation goes to ``history``."""
        objective, vm, days = self.objective, self.vm, self.days

        def f(u: np.ndarray) -> float:
            o = replay(self.m, to_params(u), layers=lys)
            over = o.warm_gpu_s / days - cap if cap is not None else 0.0
            if objective == "roi":
                v = o.roi if np.isfinite(o.roi) else -1.0
                if cap is not None and over > 0:
                    v -= 10 * over / cap
            else:
                v = sum(self.worth(o, ly, vm.per_ttft_s) for ly in lys)
                if over > 0:
                    v -= (
                        10
                        * over
                        * days
                        * (1.0 if objective == "net_gpu_s" else max(vm.price_per_gpu_s, 1e-9))
                    )
            self.history.append(
                {
                    **o.params.as_dict(),
                    "layers": "+".join(lys),
                    "net_gpu_s": o.net_gpu_s,
                    "warm_gpu_s": o.warm_gpu_s,
                    "objective": v,
                }
            )
            return v

        return f

    def best_of(self, start: int, lys_budget: float | None) -> int:
        """Index (from ``start``) of the best evaluation within the budget, or the best of all
        when none is within it."""
        hs = self.history[start:]
        ok = np.array([lys_budget is None or h["warm_gpu_s"] / self.days <= lys_budget for h in hs])
        y = np.array([h["objective"] for h in hs])
        return int(np.argmax(np.where(ok, y, -np.inf))) if ok.any() else int(np.argmax(y))


def _tune(
    t: _Tuning,
    budget_gpu_s: float | None,
    n_init: int,
    n_iter: int,
    seed: int,
    progress: Callable[[int, int], None] | None,
) -> tuple[dict[str, Params], list[float]]:
    """The best parameters per layer and the GP's standard deviation at each best point. ``roi``
    (a ratio, not additive over layers) is tuned jointly on the whole budget; the other objectives
    layer by layer, each on an even share of the budget, the progress bar spanning the layers."""
    layers = list(t.m.rates)
    x0 = [to_unit(t.m.base)]
    sds = []
    if t.objective == "roi":  # a ratio: not additive over layers, tuned jointly
        f = t.objective_fn(tuple(layers), budget_gpu_s)
        X, y, gp = optimise(f, len(NAMES), n_init, n_iter, seed, progress, x0=x0)
        i = t.best_of(0, budget_gpu_s)
        per_layer = {ly: to_params(X[i]) for ly in layers}
        sds.append(float(gp.predict(X[i][None, :], return_std=True)[1][0]))
        return per_layer, sds
    per_layer = {}
    cap = budget_gpu_s / len(layers) if budget_gpu_s is not None else None  # split evenly
    for k, ly in enumerate(layers):
        start = len(t.history)
        prog = (lambda i, n, k=k: progress(k * n + i, n * len(layers))) if progress else None
        X, y, gp = optimise(
            t.objective_fn((ly,), cap), len(NAMES), n_init, n_iter, seed, prog, x0=x0
        )
        i = t.best_of(start, cap)
        per_layer[ly] = to_params(X[i])
        sds.append(float(gp.predict(X[i][None, :], return_std=True)[1][0]))
    return per_layer, sds


def _layer_advice(t: _Tuning, ly: str, p: Params, o: Outcome) -> LayerAdvice:
    """One layer's advice from its own replay ``o`` at ``p``: the objective's gain (with its 95 %
    bounds when latency is priced), the net GPU-s, notes at a search bound, and — when it lowers
    the hit rate by more than half a point on an additive objective — why that still pays."""
    m, base_out, objective, vm = t.m, t.base_out, t.objective, t.vm
    g = t.worth(o, ly, vm.per_ttft_s)
    glo, ghi = (
        (t.worth(o, ly, vm.per_ttft_s_ci[0]), t.worth(o, ly, vm.per_ttft_s_ci[1]))
        if objective in ("value", "slo")
        else (g, g)
    )
    gg = (
        t.worth(o, ly, 0.0)
        if objective == "net_gpu_s"
        else (
            (o.hits[ly] - base_out.hits[ly]) * m.cost_per_key[ly]
            - (o.layer_warm_gpu_s[ly] - base_out.layer_warm_gpu_s[ly])
        )
    )
    la = LayerAdvice(
        ly,
        p,
        base_out.hit_rate[ly],
        o.hit_rate[ly],
        o.layer_warm_gpu_s[ly],
        base_out.layer_warm_gpu_s[ly],
        g,
        min(glo, ghi),
        max(glo, ghi),
        gg,
        _bound_notes(ly, p),
    )
    if la.hit_rate < la.base_hit_rate - 0.005 and objective != "roi":
        saved_gpu = la.base_warm_gpu_s - la.warm_gpu_s
        wait = gate_wait(m, m.base, ly) - gate_wait(m, p, ly)
        also = (
            f" and the {wait:,.0f} request-seconds requests no longer wait behind its gated start"
            if objective in ("value", "slo") and wait > 0
            else ""
        )
        la.notes.append(
            f"lowers the {ly} hit rate from {la.base_hit_rate:.1%} to {la.hit_rate:.1%}; "
            "it is still better on "
            f"{objective} because the warm-up GPU-s it no longer spends "
            f"({saved_gpu:,.0f}){also} are worth "
            f"more than the hits it gives up (net {g:+,.4g} on the objective)"
        )
    return la


def _total_gain(t: _Tuning, out: Outcome, advice: dict[str, LayerAdvice]) -> float:
    """The objective's gain over the recorded parameters: net GPU-s and the ROI ratio on the
    merged outcome, value/slo as the sum of the layers' gains."""
    if t.objective == "net_gpu_s":
        return out.net_gpu_s - t.base_out.net_gpu_s
    if t.objective == "roi":
        return out.roi - t.base_out.roi
    return sum(a.gain for a in advice.values())


def advise(
    frames: dict[Any, Any],
    budget_gpu_s: float | None = None,
    variant: str | None = None,
    n_init: int = 8,
    n_iter: int = 16,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    model: Model | None = None,
    objective: str | None = None,
    values: ValueModel | None = None,
    require_fidelity: bool = True,
) -> Recommendation:
    """Calibrate the replay on ``frames``, check that it reproduces the recorded traffic, tune each
    layer on the objective and return the recommendation. Raises :class:`NoRecommendation` (a
    ``ValueError``) with one sentence when the data cannot support one.

    ``objective``: ``value`` (the default when ``values`` prices latency from conversion data),
    ``slo`` (the default when it prices latency from an SLO), ``net_gpu_s`` (the default otherwise)
    or ``roi`` (the ratio, tuned jointly over the layers)."""
    vm = _value_model(values)
    objective, notes = _pick_objective(vm, objective)
    _check_objective(vm, objective)
    t0 = time.perf_counter()
    m, fid = _calibrated(frames, variant, model, require_fidelity)
    days = max((m.t1 - m.t0) / 86400.0, 1e-9)
    t = _Tuning(m, replay(m, m.base), objective, vm, days)
    per_layer, sds = _tune(t, budget_gpu_s, n_init, n_iter, seed, progress)
    outs = {ly: replay(m, per_layer[ly], layers=(ly,)) for ly in m.rates}
    advice = {ly: _layer_advice(t, ly, per_layer[ly], outs[ly]) for ly in m.rates}
    out = _merge(m, outs, per_layer)
    p = per_layer.get("response", next(iter(per_layer.values())))
    peak = next_peak(frames["lookups"]) if "lookups" in frames else None
    return Recommendation(
        p,
        m.base,
        out,
        t.base_out,
        _total_gain(t, out, advice),
        float(np.sqrt(np.sum(np.square(sds)))),
        budget_gpu_s,
        peak,
        peak.at - p.lead_s if peak else None,
        len(t.history),
        time.perf_counter() - t0,
        t.history,
        m,
        objective,
        advice,
        vm,
        fid,
        notes,
    )


def _merge(m: Model, outs: dict[str, Outcome], per_layer: dict[str, Params]) -> Outcome:
    """One outcome from the layers' own replays (each with its own parameters)."""
    o = list(outs.values())
    gpu = sum(x.warm_gpu_s for x in o)
    warm_saved = sum(x.extra_hits * m.cost_per_key[ly] for ly, x in outs.items())
    p = per_layer.get("response", next(iter(per_layer.values())))
    return Outcome(
        p,
        {ly: x.hit_rate[ly] for ly, x in outs.items()},
        sum(x.extra_hits for x in o),
        gpu,
        sum(x.warm_bytes for x in o),
        sum(x.gpu_s_saved for x in o),
        sum(x.net_gpu_s for x in o),
        (warm_saved - gpu) / gpu if gpu > 0 else float("nan"),
        (m.peak_at - p.lead_s) % 86400,
        {ly: x.hits[ly] for ly, x in outs.items()},
        {ly: x.layer_warm_gpu_s[ly] for ly, x in outs.items()},
    )


def fidelity_text(f: Fidelity, sentence: bool = True) -> str:
    """The replay-fidelity table and its sentence (``sentence=False``: the table alone, where the
    sentence is printed as the error that ends the command)."""
    t = f.table.rename(columns={"share": "share within"})
    t["share within"] = t["share within"].map(lambda x: f"{x:.0%}")
    for c in ("median_abs_diff", "max_abs_diff"):
        t[c] = t[c].map(lambda x: f"{x * 100:.1f} pts" if x == x else "no bucket")
    return (
        "Replay fidelity (recorded parameters vs recorded hit rate, per 15-min bucket):\n"
        + t.to_string(index=False)
        + ("\n" + f.sentence() if sentence else "")
    )


def layer_table(rec: Recommendation) -> Any:
    """Recorded vs recommended parameters and hit rate, one column pair per layer."""
    import pandas as pd

    rows: dict[str, list[str]] = {}
    b = rec.base
    for ly, la in rec.layers.items():
        p = la.params
        ttl = (
            (fmt_hours(b.response_ttl_s), fmt_hours(p.response_ttl_s))
            if ly == "response"
            else ("–", "–")
        )
        rows[f"{ly} recorded"] = [
            str(b.warm_keys),
            ttl[0],
            f"{b.lambda_per_s:.2e}",
            fmt_hours(b.lead_s),
            f"{la.base_hit_rate:.1%}",
            f"{la.base_warm_gpu_s:,.0f}",
        ]
        rows[f"{ly} recommended"] = [
            str(p.warm_keys),
            ttl[1],
            f"{p.lambda_per_s:.2e}",
            fmt_hours(p.lead_s),
            f"{la.hit_rate:.1%}",
            f"{la.warm_gpu_s:,.0f}",
        ]
    return pd.DataFrame(
        rows,
        index=[
            "warm-set size (keys)",
            "response TTL",
            "heat decay λ (/s)",
            "trigger lead before peak",
            "replayed hit rate",
            "warm-up GPU-s",
        ],
    )


def fmt_hours(s: float) -> str:
    """A duration for people: "1.50 h", "20 min" or "45 s"."""
    return f"{s / 3600:.2f} h" if s >= 3600 else (f"{s / 60:.0f} min" if s >= 60 else f"{s:g} s")


# ------------------------------------------------------ one layer: an engine's prefix cache
PREFIX = "prefix_kv"
PREFIX_MIN_KEYS = 5  # distinct prefixes needed to rank a warm set
EVICTED_TOO_SMALL = 0.05  # share of missed tokens evicted before reuse that says "cache too small"


@dataclass
class PrefixOutcome:
    """A fresh engine warmed with the ``warm_keys`` most requested prefixes, then serving the
    recorded requests again (every recorded prefix is read)."""

    warm_keys: int
    hit_tokens: float
    prompt_tokens: float
    requests: float
    hit_rate: float  # token hit rate
    missed_per_request: float
    ttft_per_request_s: float  # the fitted line at the mean missed tokens
    warm_s: float  # how long the warm-up takes (one cold prefill per prefix)

    def as_dict(self) -> dict[Any, Any]:
        return asdict(self)


@dataclass
class PrefixAdvice:
    """The recommendation for an engine's prefix cache (the one layer a gateway records)."""

    objective: str
    warm_keys: int  # recommended warm-set size: the most requested prefixes
    lead_s: float  # start the warm-up this long before the replica takes traffic
    keys: int  # prefixes recorded
    span_s: float
    recorded_hit_rate: float
    replayed_hit_rate: float  # the model with no warm-up on the recorded requests (fidelity)
    re_miss_share: float  # requests that missed a prefix read before in the range
    prefix_tokens: dict[str, float]  # tenant -> cached tokens of a request that read its prefix
    latency: Any  # value.TokenLatency
    values: ValueModel
    gain: float  # the objective over the next span like the recorded one
    gain_low: float
    gain_high: float
    outcome: PrefixOutcome
    table: Any  # per prefix, most requested first: tenant, requests, misses, tokens, p_read, worth
    notes: list[str] = field(default_factory=list)
    cache: dict[str, float] = field(default_factory=dict)  # miss-class shares (KV events), if any
    trigger_at: float | None = None  # Unix s of a pre-peak warm-up (a forecast needs >= 2 h)

    def outcome_for(self, k: int) -> PrefixOutcome:
        """The recorded requests replayed on a fresh engine warmed with the ``k`` most requested
        prefixes (equal request counts share a rank: their prefixes are averaged)."""
        t = self.table
        grp = t.groupby("requests", sort=False)["tokens"]
        saved = warm = 0.0
        left = max(int(k), 0)
        for _, g in sorted(grp, key=lambda kv: -kv[0]):
            n = min(left, len(g))
            saved += n * float(g.mean())
            warm += n * float(g.mean())
            left -= n
            if left == 0:
                break
        lat = self.latency
        base_hits = float(((t["requests"] - 1) * t["tokens"]).sum())
        total = float(t.attrs["prompt_tokens"])
        reqs = float(t.attrs["requests"])
        hits = base_hits + saved
        missed = (total - hits) / reqs
        n_warm = min(max(int(k), 0), len(t))
        return PrefixOutcome(
            n_warm,
            hits,
            total,
            reqs,
            hits / total,
            missed,
            lat.ttft(missed),
            n_warm * lat.fixed_s + warm * lat.per_token_s,
        )

    def versus(self, k: int) -> dict[str, Any]:
        """Recommended minus a warm set of the ``k`` most requested prefixes, on the recorded
        requests replayed on fresh engines: token hit rate and TTFT per request, in seconds at the
        recording's speed and relative to the top-k's TTFT (95 % intervals: the slope of the TTFT
        line over its interval, the line pivoting on the recording's mean).

        The token hit rate carries to any engine of the same cache; the seconds hold at the
        recording's engine speed. On a shared machine that speed moves with the other work on it
        (in the engine proof, tests/engine/test_advisor_engine.py, by up to 4× between the
        recording and the A/B and by up to 1.8× between the two arms' engines), and neither the
        relative change nor these intervals include that.
        """
        a, b = self.outcome_for(k), self.outcome
        dm = b.missed_per_request - a.missed_per_request
        lat = self.latency
        lo, hi = sorted((dm * lat.ci_low, dm * lat.ci_high))

        def rel(slope: float) -> float:
            fixed = lat.mean_ttft_s - slope * lat.mean_missed
            return float(slope * dm / (fixed + slope * a.missed_per_request))

        rlo, rhi = sorted((rel(lat.ci_low), rel(lat.ci_high)))
        return {
            "versus_top_k": int(k),
            "warm_keys": b.warm_keys,
            "hit_rate": b.hit_rate - a.hit_rate,
            "ttft_per_request_s": dm * lat.per_token_s,
            "ttft_per_request_ci": (lo, hi),
            "ttft_relative": dm * lat.per_token_s / a.ttft_per_request_s,
            "ttft_relative_ci": (rlo, rhi),
            "warm_s": b.warm_s - a.warm_s,
            "base": a.as_dict(),
        }

    def as_dict(self, versus_top_k: int | None = None) -> dict[Any, Any]:
        d = {
            "layer": PREFIX,
            "objective": self.objective,
            "warm_keys": self.warm_keys,
            "lead_s": self.lead_s,
            "keys": self.keys,
            "span_s": self.span_s,
            "recorded_hit_rate": self.recorded_hit_rate,
            "replayed_hit_rate": self.replayed_hit_rate,
            "re_miss_share": self.re_miss_share,
            "prefix_tokens": self.prefix_tokens,
            "ttft_line": asdict(self.latency),
            "prices": self.values.prices(),
            "gain": self.gain,
            "gain_low": self.gain_low,
            "gain_high": self.gain_high,
            "outcome": self.outcome.as_dict(),
            "notes": self.notes,
            "cache": self.cache,
            "trigger_at": self.trigger_at,
        }
        if versus_top_k is not None:
            d["versus"] = self.versus(versus_top_k)
        return d


def prefix_only(frames: dict[Any, Any]) -> bool:
    """True when the range's replayable lookups are an engine's prefix cache only (what a gateway
    in front of an engine records): :func:`advise_prefix` is the advisor for it."""
    lk = frames.get("lookups")
    if lk is None or len(lk) == 0:
        return False
    hm = lk[lk["result"].isin(["hit", "miss"])]
    return bool((hm["layer"] == PREFIX).any() and not hm["layer"].isin(LAYERS).any())


def cache_shares(misses: pd.DataFrame | None) -> dict[str, float]:
    """Shares of the missed prompt tokens per KV-event class (``misses`` frame), the partial last
    block left out (no cache holds it); empty without KV events."""
    if misses is None or len(misses) == 0:
        return {}
    by = misses.groupby("miss_class")["tokens"].sum()
    by = by[by.index != "partial"]
    tot = float(by.sum())
    return {str(k): float(v) / tot for k, v in by.items()} if tot > 0 else {}


def cache_notes(shares: dict[str, float], saved_tokens: float, cold_tokens: float) -> list[str]:
    """What the KV-event classes say: evicted tokens mean the cache is too small (a bigger warm set
    is evicted the same way); cold tokens are what a warm set can save."""
    out = []
    ev, cold = shares.get("evicted", 0.0), shares.get("cold", 0.0)
    if ev >= EVICTED_TOO_SMALL:
        out.append(
            f"{ev:.0%} of the missed prompt tokens were evicted before they were read again: the "
            "KV cache is too small for this traffic; grow it (or warm fewer prefixes) before "
            "warming more, since a warmed prefix is evicted the same way"
        )
    else:
        out.append(
            f"{ev:.0%} of the missed prompt tokens were evicted: the cache holds this traffic, "
            "so the warm set is sized on the cold misses"
        )
    if cold > 0 and cold_tokens > 0:
        out.append(
            f"{cold:.0%} of the missed prompt tokens were cold (never cached): what a warm set can "
            f"save; the recommended warm set covers {min(saved_tokens / cold_tokens, 1.0):.0%} "
            "of them"
        )
    return out


@dataclass
class _PrefixData:
    """A prefix-cache recording read for the advisor: its prefix lookups (hits and misses), its
    prefixes most requested first (``keys``, with their tenant's cached tokens per read and the
    recording's prompt tokens and requests in ``attrs``), the TTFT line, and the hit tokens per
    tenant."""

    lk: pd.DataFrame
    keys: pd.DataFrame
    ptok: dict[str, float]
    lat: Any  # value.TokenLatency
    hit_tok: pd.Series
    total: float  # prompt tokens
    reqs: float  # requests that read the prefix cache


def _prefix_keys(frames: dict[Any, Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The recording's prefix hits and misses, and its prefixes with their tenant and recorded
    hits, misses and requests; refuses a recording with no lookups, no hot keys, or fewer than
    ``PREFIX_MIN_KEYS`` prefixes requested."""
    lk = frames.get("lookups")
    lk = lk[(lk["layer"] == PREFIX) & lk["result"].isin(["hit", "miss"])] if lk is not None else lk
    if lk is None or len(lk) == 0:
        raise NoRecommendation("No prefix_kv lookups in the range: there is no traffic to replay.")
    hk = frames.get("hot_keys")
    hk = hk[hk["layer"] == PREFIX] if hk is not None and len(hk) else None
    if hk is None or len(hk) == 0:
        raise NoRecommendation(
            "No prefix_kv hot keys in the range: the warm set is ranked on each prefix's recorded "
            "requests, and none were recorded."
        )
    keys = (
        hk.groupby("key_hash")
        .agg(tenant=("tenant", "first"), hits=("hits", "sum"), misses=("misses", "sum"))
        .reset_index()
    )
    keys["requests"] = keys["hits"] + keys["misses"]
    keys = keys[keys["requests"] > 0]
    if len(keys) < PREFIX_MIN_KEYS:
        raise NoRecommendation(
            f"Too little data: {len(keys)} prefixes recorded, and ranking a warm set needs at "
            f"least {PREFIX_MIN_KEYS}."
        )
    return lk, keys


def _prefix_data(frames: dict[Any, Any], units: pd.DataFrame | None) -> _PrefixData:
    """Read the recording: a tenant's cached tokens per prefix read are its hit tokens over the
    requests that hit (the overall ratio for a tenant with none); the missed-token price is the
    TTFT line fitted on the A/B ``units``. Refuses a recording where no request read a cached
    prefix or TTFT does not grow with the missed tokens."""
    from .value import TokenLatency, ttft_per_token

    lk, keys = _prefix_keys(frames)
    hit_tok = lk[lk["result"] == "hit"].groupby("tenant")["count"].sum()
    hit_req = keys.groupby("tenant")["hits"].sum()
    if float(hit_req.sum()) <= 0 or float(hit_tok.sum()) <= 0:
        raise NoRecommendation(
            "No request read a cached prefix in the range: how many tokens a warmed prefix saves "
            "cannot be measured."
        )
    overall = float(hit_tok.sum() / hit_req.sum())
    ptok = {
        str(t): float(hit_tok.get(t, 0.0) / hit_req[t]) if hit_req.get(t, 0) > 0 else overall
        for t in keys["tenant"].unique()
    }
    lat = ttft_per_token(units)
    if isinstance(lat, str):
        raise NoRecommendation(lat[0].upper() + lat[1:] + ".")
    if not isinstance(lat, TokenLatency) or lat.per_token_s <= 0:
        raise NoRecommendation(
            "The recorded TTFT does not grow with the missed tokens: a warmed prefix would save "
            "no measurable TTFT."
        )
    keys["tokens"] = keys["tenant"].astype(str).map(ptok)
    keys = keys.sort_values(["requests", "key_hash"], ascending=[False, True])
    keys = keys.reset_index(drop=True)
    total = float(lk["count"].sum())
    keys.attrs["prompt_tokens"] = total
    # every request, with the ones whose prefix is not among the hot keys (read once in a flush
    # window): those miss whatever is warmed, since no ranking sees them
    assert units is not None  # ttft_per_token refused a store without units
    reqs = float(units[units[f"lookups_{PREFIX}"] > 0]["requests"].sum())
    keys.attrs["requests"] = reqs
    return _PrefixData(lk, keys, ptok, lat, hit_tok, total, reqs)


def _prefix_fidelity(d: _PrefixData) -> tuple[float, float, float]:
    """``(re_miss, recorded, modelled)``: requests that missed a prefix read before, and the
    recorded and modelled token hit rates with no warm-up (a fresh engine that keeps what it
    cached misses each prefix once). Refuses a recording the model misses by more than
    ``FIDELITY_TOL``."""
    keys = d.keys
    re_miss = float((keys["misses"] - 1).clip(lower=0).sum())
    recorded = float(d.hit_tok.sum()) / d.total
    modelled = float(((keys["requests"] - 1) * keys["tokens"]).sum()) / d.total
    if abs(modelled - recorded) > FIDELITY_TOL:
        raise NoRecommendation(
            f"The replay does not reproduce the recording: {re_miss:,.0f} of {d.reqs:,.0f} "
            f"requests missed a prefix read before, so the cache evicted (replayed hit rate "
            f"{modelled:.1%} against {recorded:.1%} recorded, ±{FIDELITY_TOL * 100:.0f} points "
            "allowed); this model assumes a cache that keeps the warm set, so it makes no "
            "recommendation."
        )
    return re_miss, recorded, modelled


def _prefix_worth(
    keys: pd.DataFrame, p: np.ndarray, objective: str, g: float, b: float, vt: float
) -> np.ndarray:
    """Each prefix's worth of warming: ``s·(p − 1)`` GPU-s on ``net_gpu_s``, ``s·(p·(g + vt) − g)``
    otherwise, with ``s = b × tokens`` its cold prefill and ``p`` its chance of a read."""
    sk = keys["tokens"].to_numpy(float) * b
    if objective == "net_gpu_s":
        return sk * (p - 1.0)
    return sk * (p * (g + vt) - g)


def _warm_set_size(keys: pd.DataFrame) -> tuple[int, np.ndarray]:
    """The number of most requested prefixes whose summed ``worth`` is largest (a rank shared by
    equal request counts is taken whole or not at all), and the cumulative worth by size."""
    cum = np.concatenate([[0.0], np.cumsum(keys["worth"].to_numpy(float))])
    ends = np.concatenate([[0], np.flatnonzero(np.diff(keys["requests"].to_numpy()) != 0) + 1])
    ends = np.unique(np.append(ends, len(keys)))
    return int(ends[int(np.argmax(cum[ends]))]), cum


def _price_prefixes(
    keys: pd.DataFrame, objective: str, vm: ValueModel, lat: Any
) -> tuple[int, float, float, float]:
    """Price every prefix (``p_read`` = 1 − e^−requests, ``worth`` at the fitted TTFT slope and
    the latency price, both added to ``keys``) and size the warm set: ``(k, gain, gain_low,
    gain_high)``, the bounds from the slope's and the latency price's 95 % intervals."""
    g = vm.price_per_gpu_s
    p = -np.expm1(-keys["requests"].to_numpy(float))
    keys["p_read"] = p
    keys["worth"] = _prefix_worth(keys, p, objective, g, lat.per_token_s, vm.per_ttft_s)
    k, cum = _warm_set_size(keys)
    lo_hi = [
        float(np.sum(_prefix_worth(keys, p, objective, g, b, vt)[:k]))
        for b in (lat.ci_low, lat.ci_high)
        for vt in (vm.per_ttft_s_ci if objective != "net_gpu_s" else (0.0, 0.0))
    ]
    return k, float(cum[k]), min(lo_hi), max(lo_hi)


def _size_note(keys: pd.DataFrame, k: int, objective: str) -> str:
    """Why the warm set has ``k`` prefixes: all pay, none pays (and, on net GPU-s, why), or the
    least requested one that still pays."""
    unit = "GPU-s" if objective == "net_gpu_s" else "in value"
    if k == len(keys):
        return (
            f"warm-set size is at its upper bound, all {len(keys)} prefixes recorded: each pays "
            f"(a prefix read once in the span is read again with probability {1 - math.exp(-1):.2f}"
            "), and a larger warm set has no recorded prefix to add"
        )
    if k == 0:
        return "warm-set size 0: no prefix pays" + (
            " in GPU-s alone (a warmed prefix does the prefill its first read would have "
            "done, and wastes it when no read comes); price latency (--slo-penalty, or "
            "conversions) to value the TTFT it saves"
            if objective == "net_gpu_s"
            else ""
        )
    return (
        f"warm the {k} prefixes read at least {int(keys['requests'].iloc[k - 1])} times: a "
        f"prefix read fewer times is read again too rarely to pay for its prefill "
        f"(net {float(keys['worth'].iloc[k]):+.3g} {unit} each)"
    )


def _prefix_timing(frames: dict[Any, Any], adv: PrefixAdvice) -> None:
    """The lead time's note, and the pre-peak trigger (lead time before the forecast peak) when
    the recording spans the ``MIN_SPAN_S`` a forecast needs, else a note saying why not."""
    adv.notes.append(
        f"lead time: start the warm-up {adv.lead_s:.1f} s before the replica takes traffic (one "
        "cold prefill per prefix, on the fitted TTFT line); it holds the readiness gate that long"
    )
    if adv.span_s >= MIN_SPAN_S:
        peak = next_peak(frames["lookups"])
        if peak is not None:
            adv.trigger_at = peak.at - adv.lead_s
    else:
        adv.notes.append(
            f"no pre-peak trigger: {adv.span_s / 3600:.2f} h recorded, and a peak forecast needs "
            f"{MIN_SPAN_S / 3600:g} h; the lead time is for a replica start"
        )


def _prefix_cache_classes(frames: dict[Any, Any], adv: PrefixAdvice, base_hits: float) -> None:
    """With KV events (``misses``): the miss-class shares and what they say about the cache and
    the warm set (``base_hits``: the modelled hit tokens with no warm-up)."""
    shares = cache_shares(frames.get("misses"))
    if shares:
        adv.cache = shares
        cold_tok = float(
            frames["misses"].loc[frames["misses"]["miss_class"] == "cold", "tokens"].sum()
        )
        adv.notes.extend(cache_notes(shares, adv.outcome.hit_tokens - base_hits, cold_tok))


def advise_prefix(
    frames: dict[Any, Any],
    units: pd.DataFrame | None,
    values: ValueModel | None = None,
    objective: str | None = None,
) -> PrefixAdvice:
    """Recommend the warm-set size and lead time for an engine's prefix cache from a recording of
    that one layer (a gateway's: ``lookups`` and ``hot_keys`` of ``prefix_kv`` in tokens and
    requests, A/B ``units`` with TTFT and tokens per request, optionally the KV-event ``misses``).

    The model: on an engine that keeps what it cached (fidelity: the recording's requests never
    miss a prefix read before in the range, within ±5 points of its hit rate), a prefix's first
    read misses its cached length ``P`` (the tenant's cached tokens per request that read a cached
    prefix) and the later ones hit; warming it turns that first read into a hit. A missed token
    costs ``per_token_s`` of TTFT (the fitted line, :func:`value.ttft_per_token`) and as many
    GPU-seconds; warming a prefix costs one cold prefill, ``s = per_token_s × P``. A prefix read
    ``c`` times in the recorded span is read in the next span like it with probability
    ``p = 1 − e^{−c}``, so warming it is worth ``s·(p·(g + v) − g)`` (GPU price ``g``, latency
    price ``v``) on ``value``/``slo`` and ``s·(p − 1)`` GPU-s on ``net_gpu_s`` — never positive:
    warming does the work a first read would have done, and wastes it when none comes. The warm
    set is the most requested prefixes up to the size that maximises the sum; the lead time is the
    warm-up's duration (a cold prefill per prefix), which it holds the replica's readiness gate.

    Raises :class:`NoRecommendation` with one sentence when the recording cannot support it."""
    vm = _value_model(values)
    objective, notes = _pick_objective(vm, objective)
    if objective == "roi":
        raise NoRecommendation(
            "The roi objective is not defined for a prefix cache (a warmed prefix costs the "
            "prefill its first read would have cost): use value, slo or net_gpu_s."
        )
    _check_objective(vm, objective)
    d = _prefix_data(frames, units)
    re_miss, recorded, modelled = _prefix_fidelity(d)
    keys = d.keys
    k, gain, gain_low, gain_high = _price_prefixes(keys, objective, vm, d.lat)
    span = float(frames["lookups"]["ts"].max() - frames["lookups"]["ts"].min())
    adv = PrefixAdvice(
        objective,
        k,
        0.0,
        len(keys),
        span,
        recorded,
        modelled,
        re_miss / d.reqs,
        d.ptok,
        d.lat,
        vm,
        gain,
        gain_low,
        gain_high,
        PrefixOutcome(0, 0, 0, 0, 0, 0, 0, 0),
        keys,
        notes,
    )
    adv.outcome = adv.outcome_for(k)
    adv.lead_s = adv.outcome.warm_s
    notes.append(_size_note(keys, k, objective))
    _prefix_timing(frames, adv)
    _prefix_cache_classes(frames, adv, modelled * d.total)
    return adv


def prefix_text(adv: PrefixAdvice, versus_top_k: int | None = None) -> str:
    """The prefix-cache recommendation as the CLI prints it."""
    o = adv.outcome
    lines = [
        f"Prefix cache (prefix_kv, the one layer recorded): {adv.keys} prefixes, "
        f"{o.requests:,.0f} requests over {adv.span_s / 60:.1f} min",
        f"  replay fidelity: no warm-up, hit rate {adv.replayed_hit_rate:.1%} replayed vs "
        f"{adv.recorded_hit_rate:.1%} recorded; {adv.re_miss_share:.1%} of requests missed a "
        "prefix read before",
        "  cached tokens per prefix read: "
        + ", ".join(f"{t} {v:,.0f}" for t, v in sorted(adv.prefix_tokens.items())),
        f"  {adv.latency.sentence()}",
        f"\nObjective: {adv.objective}",
        f"  {adv.values.prices()}",
        f"\nRecommended warm set: the {adv.warm_keys} most requested prefixes; lead time "
        f"{adv.lead_s:.1f} s",
        f"  expected gain over the next span like the recorded one: {adv.gain:+.4g} "
        f"({adv.gain_low:+.4g} to {adv.gain_high:+.4g}) "
        + ("GPU-s" if adv.objective == "net_gpu_s" else "in value"),
        f"  replayed: token hit rate {o.hit_rate:.1%}, TTFT {o.ttft_per_request_s:.4f} s per "
        "request",
    ]
    lines += [f"  note: {n}" for n in adv.notes]
    if versus_top_k is not None:
        d = adv.versus(versus_top_k)
        lo, hi = d["ttft_per_request_ci"]
        lines.append(
            f"\nVersus the {versus_top_k} most requested prefixes (the recorded requests on fresh "
            f"engines): token hit rate {d['hit_rate'] * 100:+.2f} points, TTFT per request "
            f"{d['ttft_relative']:+.1%} (95 % CI {d['ttft_relative_ci'][0]:+.1%} to "
            f"{d['ttft_relative_ci'][1]:+.1%}), {d['ttft_per_request_s']:+.4f} s at the "
            f"recording's speed (95 % CI {lo:+.4f} to {hi:+.4f}), warm-up {d['warm_s']:+.1f} s"
        )
    return "\n".join(lines)
