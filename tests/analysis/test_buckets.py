"""Time buckets at real Unix timestamps: one integer helper, used by every analysis."""

from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from warmscope.analysis.buckets import bucket_start
from warmscope.analysis.heat import family_series, prediction_mape
from warmscope.analysis.hitrate import hit_table

FREQS = st.sampled_from([1.0, 15.0, 60.0, 300.0, 600.0, 3600.0, 86400.0])
NEAR_NOW = st.integers(1_700_000_000, 1_900_000_000)


def test_boundary_point_closes_its_bucket_by_hand():
    # 1_800_000_300 = 6_000_001 × 300: on a boundary, so it closes (1_800_000_000, 1_800_000_300]
    assert bucket_start(1_800_000_300.0, 300) == 1_800_000_000.0
    # the float nudge this helper replaces is lost at Unix times: (t − 1e-9) == t
    assert (1_800_000_300.0 - 1e-9) // 300 * 300 == 1_800_000_300.0
    # half a second later the point is in the next bucket
    assert bucket_start(1_800_000_300.5, 300) == 1_800_000_300.0
    # one microsecond after a boundary: the next bucket as well
    assert bucket_start(1_800_000_300.000001, 300) == 1_800_000_300.0


@settings(max_examples=300, deadline=None)
@given(k=NEAR_NOW, freq=FREQS)
def test_every_boundary_point_lands_in_the_bucket_it_closes(k, freq):
    b = int(k // freq) * freq  # a boundary near k
    assert bucket_start(float(b), freq) == b - freq


@settings(max_examples=300, deadline=None)
@given(k=NEAR_NOW, freq=FREQS, us=st.integers(1, 10**6 * 86400))
def test_matches_exact_rational_arithmetic(k, freq, us):
    """Against Fraction arithmetic on the microsecond the float stands for."""
    ts = float(k) + (us % int(freq * 10**6)) / 1e6
    exact = Fraction(round(ts * 10**6), 10**6)
    f = Fraction(freq).limit_denominator()
    ref = (-(-exact // f) - 1) * f  # ceil(ts / f) − 1 buckets from the epoch
    assert bucket_start(ts, freq) == float(ref)
    assert float(ref) < ts <= float(ref) + freq


@settings(max_examples=100, deadline=None)
@given(start=NEAR_NOW, n=st.integers(2, 50), freq=st.sampled_from([60.0, 300.0]))
def test_arrays_series_and_scalars_agree_and_keep_the_index(start, n, freq):
    ts = (start // 60 * 60) + 60.0 * np.arange(1, n + 1)  # per-minute flushes, stamped at interval ends
    arr = bucket_start(ts, freq)
    s = bucket_start(pd.Series(ts, index=np.arange(n) + 7), freq)
    assert list(s.index) == list(np.arange(n) + 7)
    assert np.array_equal(arr, s.to_numpy())
    assert [bucket_start(float(t), freq) for t in ts] == list(arr)
    assert np.all((arr < ts) & (ts <= arr + freq))


def test_nan_stays_nan_and_bad_width_is_refused():
    out = bucket_start(np.array([np.nan, 120.0]), 60)
    assert np.isnan(out[0]) and out[1] == 60.0
    with pytest.raises(ValueError, match="bucket width"):
        bucket_start(1.0, 0)


def _flat_lookups(t0: float, minutes: int) -> pd.DataFrame:
    # 10 hits and 10 misses every minute, stamped at the end of each minute
    ts = t0 + 60.0 * np.arange(1, minutes + 1)
    rows = [{"ts": t, "tenant": "t", "layer": "prefix_kv", "family": "f", "result": r, "count": 10}
            for t in ts for r in ("hit", "miss")]
    return pd.DataFrame(rows)


def test_flat_traffic_predicts_perfectly_and_has_no_phantom_bucket():
    t0 = 1_800_000_000.0  # a 300-s boundary
    lk = _flat_lookups(t0, 60)  # one hour
    s = family_series(lk, 300)
    # 60 minutes / 5 = 12 full buckets of 5 × 20 requests; no partial 13th
    assert len(s) == 12 and (s["f"] == 100).all()
    assert s.index[0] == t0
    assert prediction_mape(lk, 300) == 0.0  # flat traffic: the forecast equals what happened
    t = hit_table(lk, by=["layer"], freq=300)
    assert len(t) == 12 and (t["lookups"] == 100).all() and (t["hit_rate"] == 0.5).all()
