import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from warmscope.analysis.latency import TTFT, hist_quantile, quantile_from_buckets


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
    M = "test.latency"  # not a schema metric: only the bounds present are known
    h = _hist([(60, M, "A", 1.0, 2), (60, M, "A", 2.0, 6), (60, M, "A", 4.0, 2),
               (60, M, "B", 1.0, 10), (120, M, "B", 4.0, 10), (60, "other", "A", 1.0, 99)])
    q = hist_quantile(h, 0.5, M, by=["variant"]).set_index("variant")
    assert q.loc["A", "value"] == pytest.approx(1.5) and q.loc["A", "count"] == 10
    assert q.loc["B", "value"] == pytest.approx(1.0)  # 10 of 20 in (0, 1]
    q2 = hist_quantile(h, 0.5, M, by=["variant"], end=60).set_index("variant")
    assert q2.loc["B", "value"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="quantile must be in"):
        hist_quantile(h, 95, M)
    assert hist_quantile(h.iloc[0:0], 0.5).empty


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=4, max_size=4))
def test_quantiles_are_monotone(counts):
    b = np.array([0.1, 0.5, 2.0])
    qs = [quantile_from_buckets(b, np.array(counts), q)[0] for q in (0.1, 0.5, 0.9, 0.99)]
    if sum(counts) == 0:
        assert all(np.isnan(qs))
    else:
        assert all(x <= y + 1e-12 for x, y in zip(qs, qs[1:], strict=False))


def test_missing_empty_buckets_do_not_move_the_quantile():
    # The store keeps only non-empty buckets; the lower edge must still be the schema's previous bound.
    from warmscope.analysis.latency import all_bounds
    from warmscope.model.schema import TTFT_BUCKETS

    h = _hist([(60, TTFT, "A", 1.0, 10)])  # all ten observations in (0.75, 1.0]
    q = hist_quantile(h, 0.5, TTFT).value.iloc[0]
    assert q == pytest.approx(0.75 + 0.25 * 0.5)
    only_overflow = _hist([(60, TTFT, "A", float("inf"), 3)])
    assert hist_quantile(only_overflow, 0.5, TTFT).value.iloc[0] == TTFT_BUCKETS[-1]
    assert list(all_bounds("unknown.metric", [2.0, 1.0, float("inf")])) == [1.0, 2.0, float("inf")]
