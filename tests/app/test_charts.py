"""Chart helpers: fault labels close in time stack instead of printing over each other; a chart of one
instant spans the range."""

from warmscope.app.dashboard.charts import LABEL_CHAR_FRACTION, label_row


def test_labels_that_would_overlap_go_to_the_next_row():
    rows: list[list[tuple[float, float]]] = []
    assert label_row(rows, 0.0, 10.0) == 0
    assert label_row(rows, 5.0, 15.0) == 1  # overlaps the first
    assert label_row(rows, 10.0, 20.0) == 0  # touches the first's end only: same row
    assert label_row(rows, 6.0, 9.0) == 2  # overlaps row 0's first and row 1's
    assert rows == [[(0.0, 10.0), (10.0, 20.0)], [(5.0, 15.0)], [(6.0, 9.0)]]


def test_the_demo_days_two_faults_take_two_rows_on_a_day_and_one_on_six_hours():
    # bypass from 18:23, the cross-tenant read from 20:53: 2.5 h apart; "fault: bypass" is 13 characters,
    # 13/120 of the axis: 2.6 h on a 24 h range (overlap), 0.65 h on a 6 h range (no overlap)
    for hours, want in ((24, [0, 1]), (6, [0, 0])):
        span = hours * 3600.0
        rows: list[list[tuple[float, float]]] = []
        got = [label_row(rows, x0, x0 + len(text) * LABEL_CHAR_FRACTION * span)
               for x0, text in ((18.38 * 3600, "fault: bypass"), (20.88 * 3600, "fault: tenant_isolation"))]
        assert got == want, hours


def test_a_chart_of_one_instant_spans_the_range_and_others_keep_plotlys():
    """One bucket of data in the range (an engine scraped for two minutes of a 6-hour range): plotly
    would zoom the axis into a millisecond around the point; the range is shown instead."""
    import pandas as pd
    import plotly.express as px
    import plotly.graph_objects as go
    from warmscope.app.dashboard.charts import span_one_instant

    start, end = 1_796_400_000.0, 1_796_421_600.0  # six hours
    at = pd.Timestamp(1_796_421_300, unit="s")
    # two series (instances), each one point, at the same instant
    one = px.line(pd.DataFrame({"time": [at, at], "usage": [0.25, 0.3], "instance": ["a", "b"]}),
                  x="time", y="usage", color="instance")
    span_one_instant(one, start, end)
    # the range, and 2 % of it after its end (432 s of six hours: 21,600 s x 0.02), so a point
    # at the end is drawn whole
    assert tuple(one.layout.xaxis.range) == (pd.Timestamp(start, unit="s"),
                                             pd.Timestamp(end + 432, unit="s"))
    assert {t.mode for t in one.data} == {"lines+markers"}  # a lone point is a marker, not a pixel
    # a second instant in any trace: plotly's own autorange stays
    two = go.Figure([go.Scatter(x=[at], y=[0.5]), go.Scatter(x=[at + pd.Timedelta(minutes=3)], y=[0.3])])
    span_one_instant(two, start, end)
    assert two.layout.xaxis.range is None
    assert {t.mode for t in two.data} == {None}
    # no data at all: nothing to zoom into, the range is shown
    empty = go.Figure([go.Scatter(x=[], y=[])])
    span_one_instant(empty, start, end)
    assert empty.layout.xaxis.range is not None


def test_a_line_breaks_where_buckets_measured_nothing():
    """Buckets of 10 min with nothing between 00:20 and 01:20 (a bypassed cache): one all-NaN row
    at 00:30 breaks the line there; a series without gaps is left as it is."""
    import numpy as np
    import pandas as pd
    from warmscope.app.dashboard.charts import break_at_gaps

    g = pd.DataFrame({"bucket": [4800, 0, 600, 1200, 5400], "tenant": ["a"] * 5,
                      "hit_rate": [0.5, 0.7, 0.7, 0.6, 0.6]})
    out = break_at_gaps(g, "bucket", 600)
    assert list(out.bucket) == [0, 600, 1200, 1800, 4800, 5400]  # 1200 + 600: the first empty bucket
    assert np.isnan(out.hit_rate.iloc[3]) and out.tenant.isna().iloc[3]
    assert list(out.hit_rate.dropna()) == [0.7, 0.7, 0.6, 0.5, 0.6]
    same = break_at_gaps(g[g.bucket < 4800], "bucket", 600)
    assert list(same.bucket) == [0, 600, 1200] and not same.hit_rate.isna().any()
