"""Analysis settings: prices, windows, and the 12-dimension score's targets and
weights — one TOML table ``[analysis]`` (file from ``WARMSCOPE_CONFIG``), with
defaults, validated at load. Errors name the key and the allowed range.

```toml
[analysis]
price_per_gpu_s = 0.0008          # currency per GPU-second
value_per_conversion = 4.0
roi_windows_s = [300, 3600, 86400]
treatment_variant = "B"

[analysis.dimensions.cache_hit_rate]
target = 0.85
worst = 0.4
weight = 0.06
```
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from warmscope.collectors.config import ConfigError, load_section, setting

from .dimensions import DIMENSIONS, DimensionSpec

__all__ = ["AnalysisConfig", "DimensionSpec", "DEFAULT_DIMENSIONS", "ConfigError"]


# The dimensions and their defaults are declared once, on their computations
# (analysis/dimensions.py).
DEFAULT_DIMENSIONS: tuple[DimensionSpec, ...] = DIMENSIONS


def _roi_windows(key: str, v: Any) -> tuple[float, ...]:
    try:
        ws = tuple(float(x) for x in v)
    except (TypeError, ValueError):
        raise ConfigError(f"{key} must be a list of seconds, got {v!r}") from None
    if not ws or any(not w > 0 or w == float("inf") for w in ws):
        raise ConfigError(f"{key} must be positive seconds, got {v!r}")
    return ws


@dataclass(frozen=True)
class AnalysisConfig:
    price_per_gpu_s: float = setting(0.0008, ge=0.0, le=1e3)
    value_per_conversion: float = setting(4.0, ge=0.0, le=1e9)
    roi_windows_s: tuple[float, ...] = setting((300.0, 3600.0, 86400.0), parse=_roi_windows)
    recall_window_s: float = setting(900.0, ge=1.0, le=7 * 86400)
    effect_window_s: float = setting(900.0, ge=1.0, le=7 * 86400)
    slo_ttft_s: float = setting(1.0, ge=0.001, le=600.0)
    heat_recent_s: float = setting(3600.0, ge=1.0, le=7 * 86400)
    # the forecast cadence; coarser data use their own step
    prediction_freq_s: float = setting(15.0, ge=1.0, le=86400.0)
    prediction_alpha: float = setting(0.3, ge=0.001, le=1.0)
    decay_horizon_s: float = setting(6 * 3600.0, ge=60.0, le=30 * 86400)
    treatment_variant: str = "B"
    # the score's ROI window after each warm-up (T+5 min)
    roi_window_s: float = setting(300.0, ge=60.0, le=86400.0)
    # how much a breached dimension's weight grows (see scores)
    dynamic_boost: float = setting(1.0, ge=0.0, le=10.0)
    breach_below: float = setting(0.5, ge=0.0, le=1.0)  # a dimension scoring below this is breached
    dimensions: tuple[DimensionSpec, ...] = setting(
        default_factory=lambda: DEFAULT_DIMENSIONS, parse=lambda key, v: _dimensions(v)
    )

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None, **overrides: Any) -> AnalysisConfig:
        return load_section(cls, "analysis", path, None, overrides)

    def dimension(self, name: str) -> DimensionSpec:
        for d in self.dimensions:
            if d.name == name:
                return d
        raise KeyError(name)


def _dimensions(v: Any) -> tuple[DimensionSpec, ...]:
    if not isinstance(v, Mapping):
        raise ConfigError(
            "analysis.dimensions must be a table of [analysis.dimensions.NAME] tables"
        )
    by = {d.name: d for d in DEFAULT_DIMENSIONS}
    for name, spec in v.items():
        if name not in by:
            raise ConfigError(
                f"analysis.dimensions.{name} is not a dimension; dimensions: {', '.join(by)}"
            )
        if not isinstance(spec, Mapping):
            raise ConfigError(f"analysis.dimensions.{name} must be a table")
        d = by[name]
        upd: dict[str, float] = {}
        for k, x in spec.items():
            if k not in ("target", "worst", "weight"):
                raise ConfigError(
                    f"analysis.dimensions.{name}.{k} is not known; use target, worst, weight"
                )
            try:
                upd[k] = float(x)
            except (TypeError, ValueError):
                raise ConfigError(
                    f"analysis.dimensions.{name}.{k} must be a number, got {x!r}"
                ) from None
        if upd.get("weight", 0) < 0:
            raise ConfigError(
                f"analysis.dimensions.{name}.weight must be >= 0, got {upd['weight']}"
            )
        target, worst = upd.get("target", d.target), upd.get("worst", d.worst)
        if d.better != "target" and target == worst:
            raise ConfigError(
                f"analysis.dimensions.{name}: target and worst must differ (both {target})"
            )
        by[name] = replace(d, **upd)  # type: ignore[arg-type]  # numeric fields only
    dims = tuple(by[d.name] for d in DEFAULT_DIMENSIONS)
    if sum(d.weight for d in dims) <= 0:
        raise ConfigError("analysis.dimensions: the weights must not all be zero")
    return dims
