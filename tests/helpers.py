"""Helpers shared by tests (import as tests.helpers)."""

from __future__ import annotations


def points(reader, name: str) -> list:
    """Data points of one metric from an InMemoryReader collection."""
    md = reader.get_metrics_data()
    out = []
    if md is None:
        return out
    for rm in md.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == name:
                    out.extend(m.data.data_points)
    return out


def total(reader, name: str, attrs: dict | None = None) -> float:
    attrs = attrs or {}
    return sum(
        p.value for p in points(reader, name)
        if all(p.attributes.get(k) == v for k, v in attrs.items())
    )


def assert_same_report(ra, rb) -> None:
    """Two A/B reports (``analysis.ab_report.report_for``) on the same traffic
    agree: units, verdict, every table row, the effect over time and the
    request-level sample-ratio check."""
    import pandas as pd
    import pytest

    assert ra.units == rb.units and ra.verdict == rb.verdict and ra.error is None
    ta, tb = ra.table(), rb.table()
    assert len(ta) >= 6
    pd.testing.assert_frame_equal(ta, tb, check_exact=False, rtol=1e-9, atol=1e-12)
    pd.testing.assert_frame_equal(ra.effect_over_time, rb.effect_over_time, check_exact=False, rtol=1e-9)
    assert ra.srm_requests.p_value == pytest.approx(rb.srm_requests.p_value, rel=1e-9)
