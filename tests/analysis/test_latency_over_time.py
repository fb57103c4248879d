"""Latency quantiles per time bucket: hand-computed interpolation, the overflow flag, and agreement with
hist_quantile on each bucket alone."""

import numpy as np
import pandas as pd
import pytest
from warmscope.analysis.latency import hist_quantile, quantiles_over_time

M = "test.latency"  # not a schema metric: only the bounds present are known (1, 2, 4 and +Inf)
COLS = ["ts", "metric", "tenant", "le", "count"]


def test_quantiles_per_bucket_and_group_by_hand():
    h = pd.DataFrame([
        # bucket (0, 600]: acme 2 in (0,1], 6 in (1,2], 2 in (2,4]; two flushes add up
        (60, M, "acme", 1.0, 2), (60, M, "acme", 2.0, 3), (600, M, "acme", 2.0, 3), (600, M, "acme", 4.0, 2),
        # bucket (600, 1200]: acme all 4 in the overflow bucket; globex 10 in (0, 1]
        (660, M, "acme", np.inf, 4), (1200, M, "globex", 1.0, 10),
        (900, "other", "acme", 1.0, 99),  # another metric: ignored
    ], columns=COLS)
    q = quantiles_over_time(h, M, qs=(0.5, 0.95), freq=600, by=["tenant"])
    assert list(q.columns) == ["bucket", "tenant", "count", "p50", "p95", "overflow_p50", "overflow_p95"]
    assert list(zip(q.bucket, q.tenant, strict=True)) == [(0.0, "acme"), (600.0, "acme"), (600.0, "globex")]
    a0 = q.iloc[0]
    # P50: rank 5 of 10; 2 below 1 → 3 of the 6 in (1, 2] → 1 + 3/6 = 1.5.  P95: rank 9.5; 8 below 2 → 2 + 1.5/2 × 2
    assert a0["count"] == 10 and a0.p50 == pytest.approx(1.5) and a0.p95 == pytest.approx(3.5)
    assert not a0.overflow_p50 and not a0.overflow_p95
    a1 = q.iloc[1]  # past the last edge: the largest finite bound (4), flagged
    assert a1.p50 == 4.0 and a1.overflow_p50 and a1.overflow_p95
    g = q.iloc[2]  # 10 in (0, 1]: P50 = 0.5 (the first bucket starts at 0)
    assert g.p50 == pytest.approx(0.5) and g.p95 == pytest.approx(0.95) and not g.overflow_p95


def test_each_bucket_equals_hist_quantile_over_that_bucket_alone():
    rng = np.random.default_rng(3)
    les = [1.0, 2.0, 4.0, np.inf]
    rows = [(float(ts), M, t, le, int(rng.integers(1, 20))) for ts in range(60, 3601, 60)
            for t in ("a", "b") for le in les if rng.random() < 0.7]
    h = pd.DataFrame(rows, columns=COLS)
    q = quantiles_over_time(h, M, qs=(0.5, 0.99), freq=900, by=["tenant"])
    for r in q.itertuples():
        ref = hist_quantile(h, 0.99, M, by=["tenant"], start=r.bucket, end=r.bucket + 900).set_index("tenant")
        assert r.p99 == pytest.approx(ref.loc[r.tenant, "value"])
        assert r.count == ref.loc[r.tenant, "count"]


def test_empty_and_missing_metric_give_an_empty_frame():
    h = pd.DataFrame([(60, "other", "acme", 1.0, 1)], columns=COLS)
    assert quantiles_over_time(h, M).empty
    assert quantiles_over_time(h.iloc[0:0], M, by=["tenant"]).columns.tolist()[:3] == ["bucket", "tenant", "count"]
