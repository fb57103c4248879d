"""warmscope analysis: canonical frames in, numbers out; no I/O but in sources.

Modules, one per question: :mod:`~analysis.hitrate` (hit rates, Wilson CIs,
change), :mod:`~analysis.latency` (histogram quantiles), :mod:`~analysis.coverage`
(warm-set precision/recall, run effect), :mod:`~analysis.roi` (ROI and its
decay), :mod:`~analysis.heat` (heat decay, prediction MAPE),
:mod:`~analysis.scores` (the 12-dimension score), :mod:`~analysis.config`
(targets, weights, prices), :mod:`~analysis.sources` (frames from a backend).
"""

from __future__ import annotations

from .config import AnalysisConfig, ConfigError
from .coverage import run_effect, warm_set_coverage
from .heat import heat_scores, prediction_mape, rank_to_warm, slo_lambda
from .hitrate import hit_rate_change, hit_table, result_shares, wilson
from .latency import hist_quantile
from .roi import benefit_series, business_roi, compute_roi, fit_decay, roi_windows
from .scores import ScoreCard, score_card

__all__ = [
    "AnalysisConfig", "ConfigError", "ScoreCard", "benefit_series", "business_roi", "compute_roi", "fit_decay",
    "heat_scores", "hist_quantile", "hit_rate_change", "hit_table", "prediction_mape", "rank_to_warm",
    "result_shares", "roi_windows", "run_effect", "score_card", "slo_lambda", "warm_set_coverage", "wilson",
]
