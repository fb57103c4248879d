"""The Warm-up runs page's and `warmscope runs`' text: no None/nan cell, a missing figure says why, and a
decay rate only when the benefit is significantly decaying."""

import math

import pandas as pd
from warmscope.analysis.roi import Decay, decay_text, roi_text

NAN = float("nan")


def _row(**kw):
    base = {
        "window_s": 300.0,
        "requests": 120,
        "conversions": 0.0,
        "baseline_conversions": 0.0,
        "gpu_s_saved": 1.5,
        "cost": 0.004,
        "roi_compute": 0.25,
        "roi_compute_low": -0.5,
        "roi_compute_high": 1.0,
        "roi_business": NAN,
        "roi_business_low": NAN,
        "roi_business_high": NAN,
        "baseline": "control variant",
        "complete": True,
        "state": "ok",
    }
    return {**base, **kw}


def test_roi_cells_say_why_a_figure_is_missing():
    t = roi_text(
        pd.DataFrame(
            [
                _row(),
                _row(
                    window_s=3600.0,
                    conversions=3.0,
                    state="cost too small to estimate",
                    roi_compute=NAN,
                ),
                _row(
                    window_s=86400.0,
                    requests=0,
                    gpu_s_saved=NAN,
                    roi_compute=NAN,
                    complete=False,
                    state="no requests",
                ),
            ]
        )
    )
    assert list(t["window"]) == ["T+5 min", "T+1 h", "T+24 h (unfinished)"]
    assert t.loc[0, "roi_compute"] == "+0.25 (95 % CI -0.50 to +1.00)"
    assert t.loc[0, "roi_business"] == "no conversion data"  # no conversions on either side
    assert t.loc[1, "roi_compute"] == t.loc[1, "roi_business"] == "cost too small to estimate"
    assert t.loc[2, "gpu_s_saved"] == "no requests"
    cells = " ".join(t.astype(str).to_numpy().ravel())
    assert "nan" not in cells.lower() and "None" not in cells


def test_a_decay_rate_is_shown_only_when_its_interval_is_above_zero():
    # the case: -5.24 /h fitted to noise, CI straddling zero
    assert decay_text(Decay(-5.24, -16.89, 6.42, math.nan, 1.0, 20)).startswith(
        "no decay measured: the benefit's fitted rate -5.24 /h has a 95 % CI (-16.89 to +6.42)"
    )
    assert (
        decay_text(Decay(0.5, 0.2, 0.8, math.log(2) / 0.5, 1.0, 20))
        == "0.50 /h (95 % CI 0.20 to 0.80; half-life 1.39 h)"
    )  # ln 2 / 0.5 = 1.386 h
    assert decay_text(Decay(0.5, NAN, NAN, 1.39, 1.0, 5)).startswith(
        "no decay measured: the rate's interval"
    )
    assert (
        decay_text(Decay(NAN, NAN, NAN, NAN, NAN, 2, "not enough points after the run (need 4)"))
        == "no decay measured: not enough points after the run (need 4)"
    )


def test_a_benefit_gone_between_two_points_is_too_fast_to_measure_not_a_rate():
    import numpy as np
    import pandas as pd
    from warmscope.analysis.roi import fit_decay

    # a benefit of 5 right after the run, then noise around 0 at points every 5 min: the fit runs
    # off to a huge k (its Wald interval with it); only the first two points (0 and 5 min) are
    # under k·t < ln 1000 at any k that fits, so it is gone by 10 min
    rng = np.random.default_rng(1)
    t = np.arange(0.0, 3600.0, 300.0)
    gone = fit_decay(pd.DataFrame({"t_s": t, "benefit": np.r_[5.0, rng.normal(0, 0.3, len(t) - 1)]}))
    assert gone.error is not None and math.isnan(gone.k_per_hour) and gone.gone_min == 10.0
    assert decay_text(gone).startswith("too fast to measure: the benefit is gone by 10 min after the run")
    # a decay the points do follow (0.8 /h over an hour: e^(-0.8) = 0.45 left at the end) is a rate
    slow = fit_decay(pd.DataFrame({"t_s": t, "benefit": 3 * np.exp(-0.8 * t / 3600) + rng.normal(0, 0.05, len(t))}))
    assert slow.error is None and 0.7 < slow.k_per_hour < 0.9 and math.isnan(slow.gone_min)
    assert decay_text(slow).startswith(f"{slow.k_per_hour:.2f} /h (95 % CI")
    # over several warm-ups: the fast one is said, not counted as fitted
    from warmscope.analysis.roi import decay_summary

    assert decay_summary([gone]) == ("benefit decay: faster than measured (after 1 warm-up(s) the "
                                     "benefit is gone between two points)")
    assert decay_summary([slow, gone]).endswith("; 1 more gone between two points, faster than measured)")
    assert "median over the 1 of 1 warm-ups" in decay_summary([slow, gone])
