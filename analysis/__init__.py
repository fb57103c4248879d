"""warmscope analysis: canonical frames in, numbers out; no I/O but in sources.

Modules, one per question: :mod:`~analysis.hitrate` (hit rates, Wilson CIs,
change), :mod:`~analysis.latency` (histogram quantiles), :mod:`~analysis.coverage`
(warm-set precision/recall, run effect), :mod:`~analysis.roi` (ROI and its
decay), :mod:`~analysis.heat` (heat decay, prediction MAPE),
:mod:`~analysis.scores` (the 12-dimension score), :mod:`~analysis.config`
(targets, weights, prices), :mod:`~analysis.sources` (frames from a backend),
:mod:`~analysis.rootcause` and :mod:`~analysis.drilldown` (root causes).

The names below are imported on first use, so importing one module (e.g. the
root-cause localiser) does not load the others and their dependencies.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

_WHERE = {
    "AnalysisConfig": "config",
    "ConfigError": "config",
    "run_effect": "coverage",
    "warm_set_coverage": "coverage",
    "heat_scores": "heat",
    "prediction_mape": "heat",
    "rank_to_warm": "heat",
    "slo_lambda": "heat",
    "hit_rate_change": "hitrate",
    "hit_table": "hitrate",
    "result_shares": "hitrate",
    "wilson": "hitrate",
    "hist_quantile": "latency",
    "benefit_series": "roi",
    "business_roi": "roi",
    "compute_roi": "roi",
    "fit_decay": "roi",
    "roi_windows": "roi",
    "ScoreCard": "scores",
    "score_card": "scores",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    mod = _WHERE.get(name)
    if mod is None:
        if (
            importlib.util.find_spec(f"{__name__}.{name}") is not None
        ):  # a submodule, e.g. analysis.hitrate
            return importlib.import_module(f".{name}", __name__)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
