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
from scipy.stats import norm, qmc

from .forecast import Peak, next_peak
from .replay import (
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
        warnings.simplefilter(
            "ignore", UserWarning
        )  # Sobol balance needs 2^k points; a few start points do
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
    """The recommendation for one cache layer (the layers' replays are independent, so each is tuned on its
    own contribution to the objective)."""

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
    notes: list[str] = field(
        default_factory=list
    )  # at a search bound; lowers the hit rate, and why

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
    """The advisor will not recommend: one sentence says what is missing (``fidelity`` when the replay
    does not reproduce the recorded day)."""

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


OBJECTIVES = ("value", "slo", "net_gpu_s", "roi")
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
            f"Too little data: {span / 3600:.1f} h of lookups in the range, and the replay and forecasts "
            f"need at least {MIN_SPAN_S / 3600:g} h."
        )
    have = [ly for ly in LAYERS if ((lk["layer"] == ly) & lk["result"].isin(["hit", "miss"])).any()]
    if len(have) < len(LAYERS):
        missing = [ly for ly in LAYERS if ly not in have]
        return (
            (
                f"Only {' and '.join(have) or 'no'} replayable lookups in the range: the advisor needs the "
                f"{' and '.join(missing)} layer too, to share the warm-up between the layers."
            )
            if have
            else (
                "No response or embedding lookups in the range: those are the layers the advisor replays."
            )
        )
    runs = frames.get("warmup_runs")
    if runs is None or len(runs) == 0:
        return (
            "No warm-up runs in the range: the replay takes the warm-set size, cost per key and timing "
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
                f"{label} is at the search's lower bound ({fmt(lo)}): a smaller value may be better still"
            )
        elif x >= 0.99:
            out.append(
                f"{label} is at the search's upper bound ({fmt(hi)}): a larger value may be better still"
            )
    return out


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
    """Calibrate the replay on ``frames``, check that it reproduces the recorded day, tune each layer on
    the objective and return the recommendation. Raises :class:`NoRecommendation` (a ``ValueError``)
    with one sentence when the data cannot support one.

    ``objective``: ``value`` (the default when ``values`` prices latency from conversion data),
    ``slo`` (the default when it prices latency from an SLO), ``net_gpu_s`` (the default otherwise) or
    ``roi`` (the ratio, tuned jointly over the layers)."""
    vm = values or ValueModel("gpu_s", 0.0008, 0.0, (0.0, 0.0), "no value model given")
    notes: list[str] = []
    if objective is None:
        objective = {"conversion": "value", "slo": "slo"}.get(vm.kind, "net_gpu_s")
        notes.append(
            "the default: "
            + (
                "latency priced from the recorded conversions"
                if objective == "value"
                else "latency priced from the configured SLO"
                if objective == "slo"
                else f"latency not priced ({vm.note})"
            )
        )
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
    t0 = time.perf_counter()
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
    days = max((m.t1 - m.t0) / 86400.0, 1e-9)
    base_out = replay(m, m.base)
    history: list[dict[Any, Any]] = []
    layers = list(m.rates)

    def worth(o: Outcome, layer: str, per_ttft: float) -> float:
        """The objective's value of ``o`` on one layer against the recorded parameters."""
        dh = o.hits[layer] - base_out.hits[layer]
        dg = o.layer_warm_gpu_s[layer] - base_out.layer_warm_gpu_s[layer]
        c = m.cost_per_key[layer]
        if objective == "net_gpu_s":
            return dh * c - dg
        # TTFT: the extra hits' miss seconds saved, minus the wait behind a gated start's warm-up
        dw = gate_wait(m, o.params, layer) - gate_wait(m, m.base, layer)
        return dh * c * (vm.price_per_gpu_s + per_ttft) - dw * per_ttft - dg * vm.price_per_gpu_s

    def objective_fn(lys: tuple[str, ...], cap: float | None) -> Callable[[np.ndarray], float]:
        def f(u: np.ndarray) -> float:
            o = replay(m, to_params(u), layers=lys)
            over = o.warm_gpu_s / days - cap if cap is not None else 0.0
            if objective == "roi":
                v = o.roi if np.isfinite(o.roi) else -1.0
                if cap is not None and over > 0:
                    v -= 10 * over / cap
            else:
                v = sum(worth(o, ly, vm.per_ttft_s) for ly in lys)
                if over > 0:
                    v -= (
                        10
                        * over
                        * days
                        * (1.0 if objective == "net_gpu_s" else max(vm.price_per_gpu_s, 1e-9))
                    )
            history.append(
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

    def best_of(start: int, lys_budget: float | None) -> int:
        hs = history[start:]
        ok = np.array([lys_budget is None or h["warm_gpu_s"] / days <= lys_budget for h in hs])
        y = np.array([h["objective"] for h in hs])
        return int(np.argmax(np.where(ok, y, -np.inf))) if ok.any() else int(np.argmax(y))

    advice: dict[str, LayerAdvice] = {}
    sds = []
    if objective == "roi":  # a ratio: not additive over layers, tuned jointly
        X, y, gp = optimise(
            objective_fn(tuple(layers), budget_gpu_s),
            len(NAMES),
            n_init,
            n_iter,
            seed,
            progress,
            x0=[to_unit(m.base)],
        )
        i = best_of(0, budget_gpu_s)
        per_layer = {ly: to_params(X[i]) for ly in layers}
        sds.append(float(gp.predict(X[i][None, :], return_std=True)[1][0]))
    else:
        per_layer = {}
        cap = (
            budget_gpu_s / len(layers) if budget_gpu_s is not None else None
        )  # the budget split evenly
        for k, ly in enumerate(layers):
            start = len(history)
            prog = (lambda i, n, k=k: progress(k * n + i, n * len(layers))) if progress else None
            X, y, gp = optimise(
                objective_fn((ly,), cap),
                len(NAMES),
                n_init,
                n_iter,
                seed,
                prog,
                x0=[to_unit(m.base)],
            )
            i = best_of(start, cap)
            per_layer[ly] = to_params(X[i])
            sds.append(float(gp.predict(X[i][None, :], return_std=True)[1][0]))
    outs = {ly: replay(m, per_layer[ly], layers=(ly,)) for ly in layers}
    for ly in layers:
        o = outs[ly]
        g = worth(o, ly, vm.per_ttft_s)
        glo, ghi = (
            (worth(o, ly, vm.per_ttft_s_ci[0]), worth(o, ly, vm.per_ttft_s_ci[1]))
            if objective in ("value", "slo")
            else (g, g)
        )
        gg = (
            worth(o, ly, 0.0)
            if objective == "net_gpu_s"
            else (
                (o.hits[ly] - base_out.hits[ly]) * m.cost_per_key[ly]
                - (o.layer_warm_gpu_s[ly] - base_out.layer_warm_gpu_s[ly])
            )
        )
        la = LayerAdvice(
            ly,
            per_layer[ly],
            base_out.hit_rate[ly],
            o.hit_rate[ly],
            o.layer_warm_gpu_s[ly],
            base_out.layer_warm_gpu_s[ly],
            g,
            min(glo, ghi),
            max(glo, ghi),
            gg,
            _bound_notes(ly, per_layer[ly]),
        )
        if la.hit_rate < la.base_hit_rate - 0.005 and objective != "roi":
            saved_gpu = la.base_warm_gpu_s - la.warm_gpu_s
            wait = gate_wait(m, m.base, ly) - gate_wait(m, per_layer[ly], ly)
            also = (
                f" and the {wait:,.0f} request-seconds requests no longer wait behind its gated start"
                if objective in ("value", "slo") and wait > 0
                else ""
            )
            la.notes.append(
                f"lowers the {ly} hit rate from {la.base_hit_rate:.1%} to {la.hit_rate:.1%}; it is still better on "
                f"{objective} because the warm-up GPU-s it no longer spends ({saved_gpu:,.0f}){also} are worth "
                f"more than the hits it gives up (net {g:+,.4g} on the objective)"
            )
        advice[ly] = la
    out = _merge(m, outs, per_layer)
    p = per_layer.get("response", next(iter(per_layer.values())))
    peak = next_peak(frames["lookups"]) if "lookups" in frames else None
    trig = peak.at - p.lead_s if peak else None
    if objective == "net_gpu_s":
        gain = out.net_gpu_s - base_out.net_gpu_s
    elif objective == "roi":
        gain = out.roi - base_out.roi
    else:
        gain = sum(a.gain for a in advice.values())
    return Recommendation(
        p,
        m.base,
        out,
        base_out,
        gain,
        float(np.sqrt(np.sum(np.square(sds)))),
        budget_gpu_s,
        peak,
        trig,
        len(history),
        time.perf_counter() - t0,
        history,
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


def fidelity_text(f: Fidelity) -> str:
    """The replay-fidelity table and its sentence."""
    t = f.table.rename(columns={"share": "share within"})
    t["share within"] = t["share within"].map(lambda x: f"{x:.0%}")
    for c in ("median_abs_diff", "max_abs_diff"):
        t[c] = t[c].map(lambda x: f"{x * 100:.1f} pts" if x == x else "no bucket")
    return (
        "Replay fidelity (recorded parameters vs recorded hit rate, per 15-min bucket):\n"
        + t.to_string(index=False)
        + "\n"
        + f.sentence()
    )


def layer_table(rec: Recommendation) -> Any:
    """Recorded vs recommended parameters and hit rate, one column pair per layer."""
    import pandas as pd

    rows: dict[str, list[str]] = {}
    b = rec.base
    for ly, la in rec.layers.items():
        p = la.params
        ttl = (
            (_fmt_h(b.response_ttl_s), _fmt_h(p.response_ttl_s)) if ly == "response" else ("–", "–")
        )
        rows[f"{ly} recorded"] = [
            str(b.warm_keys),
            ttl[0],
            f"{b.lambda_per_s:.2e}",
            _fmt_h(b.lead_s),
            f"{la.base_hit_rate:.1%}",
            f"{la.base_warm_gpu_s:,.0f}",
        ]
        rows[f"{ly} recommended"] = [
            str(p.warm_keys),
            ttl[1],
            f"{p.lambda_per_s:.2e}",
            _fmt_h(p.lead_s),
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


def _fmt_h(s: float) -> str:
    return f"{s / 3600:.2f} h" if s >= 3600 else (f"{s / 60:.0f} min" if s >= 60 else f"{s:g} s")
