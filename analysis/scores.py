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

__all__ = ["DimensionScore", "ScoreCard", "score_card", "normalise"]

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
