"""The 12-dimension warm-up score: raw values, 0–1 scores, weights, composite.

Each dimension is computed from the canonical frames (see ``collectors.store``)
over the frames given, reports its raw value, unit and source, and is
normalised to 0–1 against a target and a worst value from
:class:`analysis.config.AnalysisConfig`:

* lower is better — ``1`` at or below target, ``0`` at or beyond worst,
  linear between;
* higher is better — the mirror image;
* target (grey-release penetration) — ``1 − |value − target| / max(target,
  1 − target)``.

A dimension without the data it needs says so (``value is None``, ``note``)
and is left out of the composite; nothing is invented.

The dimensions themselves — what each measures, from which frames — are declared in
:mod:`analysis.dimensions`.

Dynamic weighting: a dimension scoring below ``breach_below`` whose CI
excludes the target (or that has no CI: an exact value) is breached, and its
weight grows to ``w × (1 + dynamic_boost × (breach_below − s) /
breach_below)``; a low score whose CI includes the target reads "within noise"
and keeps its base weight. The weights of the dimensions with data are then
renormalised to sum to 1, and the composite is their weighted mean.

Example::

    card = score_card(frames, AnalysisConfig.load())
    card.composite, [d.name for d in card.dimensions if d.breached]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .config import AnalysisConfig
from .dimensions import DimensionSpec, Measurement

__all__ = [
    "DimensionScore",
    "ScoreCard",
    "score_card",
    "normalise",
    "status",
    "weight_text",
    "weights_note",
    "GOOD_AT",
    "FAIR_AT",
]

Frames = Mapping[str, pd.DataFrame]


@dataclass(frozen=True)
class DimensionScore:
    name: str
    label: str
    value: float | None
    unit: str
    source: str
    score: float | None
    target: float
    weight: float
    effective_weight: float
    breached: bool
    note: str = ""
    ci_low: float | None = None
    ci_high: float | None = None


@dataclass(frozen=True)
class ScoreCard:
    dimensions: tuple[DimensionScore, ...]
    composite: float | None
    note: str = ""

    def as_frame(self) -> pd.DataFrame:
        return pd.DataFrame([d.__dict__ for d in self.dimensions])


def normalise(spec: DimensionSpec, value: float) -> float:
    if spec.better == "target":
        span = max(spec.target, 1 - spec.target) or 1.0
        return float(np.clip(1 - abs(value - spec.target) / span, 0, 1))
    if spec.better == "lower":
        s = (spec.worst - value) / (spec.worst - spec.target)
    else:
        s = (value - spec.worst) / (spec.target - spec.worst)
    return float(np.clip(s, 0, 1))


def _excludes_target(spec: DimensionSpec, ci: tuple[float, float] | None) -> bool:
    """The CI lies wholly on the bad side of the target (no CI: an exact value)."""
    if ci is None:
        return True
    lo, hi = ci
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return False
    if spec.better == "lower":
        return lo > spec.target
    if spec.better == "higher":
        return hi < spec.target
    return not lo <= spec.target <= hi


def score_card(frames: Frames, cfg: AnalysisConfig | None = None) -> ScoreCard:
    cfg = cfg or AnalysisConfig()
    raw = []
    for spec in cfg.dimensions:
        try:
            out = spec.compute({n: frames[n] for n in spec.frames if n in frames}, cfg)
        except (KeyError, ValueError) as e:  # a frame missing a column: say so, don't crash
            out = Measurement(None, "", f"cannot compute: {e}")
        value, source, note, ci = out.value, out.source, out.note, out.ci
        if value is not None and not np.isfinite(value):
            value, note = None, note or "not finite"
        score = normalise(spec, value) if value is not None else None
        raw.append((spec, value, source, note, score, ci))
    weights = {}
    breached = {}
    for spec, _value, _, _, score, ci in raw:
        if score is None:
            continue
        w = spec.weight
        low = score < cfg.breach_below and cfg.breach_below > 0
        breached[spec.name] = low and _excludes_target(spec, ci)
        if breached[spec.name]:
            w *= 1 + cfg.dynamic_boost * (cfg.breach_below - score) / cfg.breach_below
        weights[spec.name] = w
    total = sum(weights.values())
    dims = []
    for spec, value, source, note, score, ci in raw:
        ew = weights.get(spec.name, 0.0) / total if total > 0 else 0.0
        b = breached.get(spec.name, False)
        if score is not None and score < cfg.breach_below and not b:
            note = "within noise: the CI includes the target" + (f"; {note}" if note else "")
        dims.append(
            DimensionScore(
                spec.name,
                spec.label,
                value,
                spec.unit,
                source,
                score,
                spec.target,
                spec.weight,
                ew,
                b,
                note if value is not None else (note or "no data"),
                ci[0] if ci is not None and value is not None else None,
                ci[1] if ci is not None and value is not None else None,
            )
        )
    composite = (
        sum(d.score * d.effective_weight for d in dims if d.score is not None)
        if total > 0
        else None
    )
    missing = [d.name for d in dims if d.score is None]
    return ScoreCard(
        tuple(dims),
        composite,
        f"no data for: {', '.join(missing)} (left out of the composite)" if missing else "",
    )


GOOD_AT, FAIR_AT = 0.8, 0.5  # a score at or above: OK; FAIR; below FAIR_AT: POOR


def _spec(cfg: AnalysisConfig, name: str) -> DimensionSpec | None:
    return next((s for s in cfg.dimensions if s.name == name), None)


def status(d: DimensionScore, cfg: AnalysisConfig) -> str:
    """ "good", "fair", "poor" or "none" (no data) for a scored dimension: by its score
    (``GOOD_AT``, ``FAIR_AT``), but never "good" while its value misses its target (a lower-is-
    better value above the target, a higher-is-better one below it) unless its CI reaches the
    target: 6 % against a 5 % target scores 0.96 and reads FAIR, not OK."""
    if d.score is None or d.value is None:
        return "none"
    grade = "good" if d.score >= GOOD_AT else "fair" if d.score >= FAIR_AT else "poor"
    spec = _spec(cfg, d.name)
    if grade == "good" and spec is not None and spec.better != "target":
        if spec.better == "lower":
            meets = d.value <= d.target or (d.ci_low is not None and d.ci_low <= d.target)
        else:
            meets = d.value >= d.target or (d.ci_high is not None and d.ci_high >= d.target)
        grade = "good" if meets else "fair"
    return grade


def weight_text(d: DimensionScore, card: ScoreCard, cfg: AnalysisConfig) -> str:
    """Why a dimension carries its weight: its base weight, the boost a breach gives it, and what
    it comes to once the weights of the dimensions with data are shared out to 100 % ("base
    25.0% × 1.40 (breached) → 41.4%"; :func:`weights_note` says over how many)."""
    if d.score is None:
        return f"base {d.weight:.1%}; no data, left out"
    boost = ""
    if d.breached and cfg.breach_below > 0:
        b = 1 + cfg.dynamic_boost * (cfg.breach_below - d.score) / cfg.breach_below
        boost = f" × {b:.2f} (breached)"
    return f"base {d.weight:.1%}{boost} → {d.effective_weight:.1%}"


def weights_note(card: ScoreCard) -> str:
    """How the weights shown come about, for the card as a whole."""
    n = sum(x.score is not None for x in card.dimensions)
    return (
        f"Weight: each dimension's configured base weight, raised while it is breached (its CI "
        f"excludes the target), then shared out over the {n} dimensions with data, so the "
        "weights shown add up to 100 %."
    )
