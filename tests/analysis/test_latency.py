import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.latency import TTFT, hist_quantile, quantile_from_buckets


def test_quantile_interpolates_inside_the_bucket():
    b = np.array([1.0, 2.0, 4.0])
    c = np.array([2, 6, 2, 0])
    assert quantile_from_buckets(b, c, 0.5)[0] == pytest.approx(1.5)
    assert quantile_from_buckets(b, c, 0.95)[0] == pytest.approx(3.5)
    assert quantile_from_buckets(b, c, 0.1)[0] == pytest.approx(0.5)  # first bucket starts at 0


def test_quantile_in_overflow_bucket_is_the_largest_bound_and_empty_is_nan():
    b = np.array([1.0, 2.0, 4.0])
    assert quantile_from_buckets(b, np.array([0, 0, 0, 5]), 0.99)[0] == 4.0
    assert np.isnan(quantile_from_buckets(b, np.array([0, 0, 0, 0]), 0.5)[0])


def _hist(rows):
    return pd.DataFrame(rows, columns=["ts", "metric", "variant", "le", "count"])


def test_hist_quantile_groups_and_window():
    h = _hist([(60, TTFT, "A", 1.0, 2), (60, TTFT, "A", 2.0, 6), (60, TTFT, "A", 4.0, 2),
               (60, TTFT, "B", 1.0, 10), (120, TTFT, "B", 4.0, 10), (60, "other", "A", 1.0, 99)])
    q = hist_quantile(h, 0.5, TTFT, by=["variant"]).set_index("variant")
    assert q.loc["A", "value"] == pytest.approx(1.5) and q.loc["A", "count"] == 10
    assert q.loc["B", "value"] == pytest.approx(1.0)  # 10 of 20 in (0, 1]
    q2 = hist_quantile(h, 0.5, TTFT, by=["variant"], end=60).set_index("variant")
    assert q2.loc["B", "value"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="quantile must be in"):
        hist_quantile(h, 95, TTFT)
    assert hist_quantile(h.iloc[0:0], 0.5).empty


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=4, max_size=4))
def test_quantiles_are_monotone(counts):
    b = np.array([0.1, 0.5, 2.0])
    qs = [quantile_from_buckets(b, np.array(counts), q)[0] for q in (0.1, 0.5, 0.9, 0.99)]
    if sum(counts) == 0:
        assert all(np.isnan(qs))
    else:
        assert all(x <= y + 1e-12 for x, y in zip(qs, qs[1:]))
