"""What time-series charts share: their time buckets and the annotations every one carries (warm-up
runs, injected fault windows, alert onsets)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from warmscope.app.dashboard import data
from warmscope.app.dashboard.state import step

if TYPE_CHECKING:
    import plotly.graph_objects as go

ALERT_ONSETS = (
    "Dotted green lines: warm-up runs · red bands: known fault windows · orange lines: onsets of "
    "the alerts open at the range's end (the Alerts page's “Holding now”)."
)


def time_marks(start: float, end: float) -> dict[str, pd.DataFrame]:
    """Warm-up runs and injected fault windows in [start, end) to draw on time series."""
    try:
        return data.time_marks(start, end)
    except data.SourceError:
        return {"runs": pd.DataFrame(), "faults": pd.DataFrame()}


def open_alerts(start: float, end: float) -> pd.DataFrame:
    """The alerts open at the range's end (``cached.alerts``: the overview's count and the Alerts
    page's "Holding now"), whose onsets every time series marks; empty when they cannot be read."""
    from warmscope.app.dashboard import cached

    try:
        return cached.alerts(start, end)
    except data.SourceError:
        return pd.DataFrame(columns=["severity", "alert", "summary", "since"])


LABEL_CHAR_FRACTION = 1 / 120  # a 10-px label character, as a share of a chart's time axis


def label_row(rows: list[list[tuple[float, float]]], x0: float, x1: float) -> int:
    """The first text row where a label spanning [x0, x1] overlaps none placed before (the label
    is recorded there): fault labels close in time stack instead of printing over each other."""
    for i, placed in enumerate(rows):
        if all(x1 <= a or x0 >= b for a, b in placed):
            placed.append((x0, x1))
            return i
    rows.append([(x0, x1)])
    return len(rows) - 1


PAD = 0.02  # of the range, after its end, on a chart of one instant


def break_at_gaps(g: pd.DataFrame, col: str, step_s: float) -> pd.DataFrame:
    """``g`` sorted by ``col`` (bucket starts, seconds) with an all-NaN row one step after each
    bucket whose next one is more than a step later: a line drawn through it breaks there instead
    of joining two measured points straight across buckets that measured nothing (e.g. a cache
    bypassed for an hour)."""
    g = g.sort_values(col)
    t = g[col].to_numpy(dtype=float)
    after = t[:-1][np.diff(t) > 1.5 * step_s]
    if not len(after):
        return g
    gap = pd.DataFrame({c: np.nan for c in g.columns}, index=range(len(after)))
    gap[col] = after + step_s
    return pd.concat([g, gap], ignore_index=True).sort_values(col, kind="stable")


def span_one_instant(fig: go.Figure, start: float, end: float) -> None:
    """A time axis whose traces hold one instant at most (one bucket of data in the range) spans
    the range instead: plotly's autorange would zoom into a millisecond around the point, with
    ticks such as 02:20:59.9995. The axis ends a little after the range (``PAD`` of it), so a
    point at the range's end is drawn whole, not cut in half by the plot's edge, and each point
    is drawn with a marker."""
    first = None
    for trace in fig.data:
        x = getattr(trace, "x", None)
        if x is None or len(x) == 0:
            continue
        arr = np.asarray(x)
        if first is None:
            first = arr[0]
        if (arr != first).any():
            return
    pad = (end - start) * PAD
    fig.update_xaxes(range=[pd.Timestamp(start, unit="s"), pd.Timestamp(end + pad, unit="s")])
    # a line of one point is a dot a pixel wide: each point gets a marker
    fig.update_traces(mode="lines+markers", selector={"type": "scatter"})


def annotate(fig: go.Figure, start: float, end: float, alerts: pd.DataFrame | None = None) -> None:
    """Draw runs (green ticks), fault windows (red bands) and alert onsets (orange lines) on a time
    axis; ``alerts`` defaults to the alerts open at the range's end (:func:`open_alerts`). A chart
    of one instant spans the range (:func:`span_one_instant`).

    The shapes are added in one layout update: plotly's ``add_vline``/``add_vrect`` re-validate
    every shape already on the figure, which made a day of runs cost seconds per chart."""
    span_one_instant(fig, start, end)
    a = time_marks(start, end)
    if alerts is None:
        alerts = open_alerts(start, end)
    shapes: list[dict[str, object]] = []
    notes: list[dict[str, object]] = []

    def line(t: float, colour: str, dash: str = "solid") -> dict[str, object]:
        x = pd.Timestamp(t, unit="s")
        return dict(
            type="line",
            xref="x",
            yref="paper",
            x0=x,
            x1=x,
            y0=0,
            y1=1,
            line=dict(width=1, dash=dash, color=colour),
        )

    f = a["faults"]
    spans = (
        zip(f["start"].astype(float), f["end"].astype(float), f["trap"].astype(str), strict=True)
        if len(f)
        else iter(())
    )
    rows: list[list[tuple[float, float]]] = []  # the labels' extents placed in each text row
    for f0, f1, trap in spans:
        x0, x1 = max(float(f0), start), min(float(f1), end)
        if x1 > x0:
            text = f"fault: {trap}"
            row = label_row(rows, x0, x0 + len(text) * LABEL_CHAR_FRACTION * (end - start))
            shapes.append(
                dict(
                    type="rect",
                    xref="x",
                    yref="paper",
                    x0=pd.Timestamp(x0, unit="s"),
                    x1=pd.Timestamp(x1, unit="s"),
                    y0=0,
                    y1=1,
                    fillcolor="#cf222e",
                    opacity=0.08,
                    line=dict(width=0),
                    layer="below",
                )
            )
            notes.append(
                dict(
                    x=pd.Timestamp(x0, unit="s"),
                    y=1,
                    xref="x",
                    yref="paper",
                    text=text,
                    showarrow=False,
                    xanchor="left",
                    yanchor="top",
                    yshift=-13 * row,
                    font=dict(size=10, color="#cf222e"),
                )
            )
    runs = a["runs"]
    if len(runs):
        # One mark per minute is enough: runs of several layers on one replica start together.
        starts = sorted({math.floor(t / 60) * 60 for t in runs.started})
        shapes += [line(t, "#1a7f37", "dot") for t in starts]
        notes.append(
            dict(
                x=pd.Timestamp(starts[-1], unit="s"),
                y=1.0,
                xref="x",
                yref="paper",
                text="warm-up run",
                showarrow=False,
                font=dict(size=10, color="#1a7f37"),
                xanchor="left",
                yanchor="bottom",
            )
        )
    if len(alerts):
        shapes += [
            line(t, "#b35900")
            for t in sorted({x for x in alerts.since if x == x and start <= x < end})
        ]
    if shapes or notes:
        fig.update_layout(
            shapes=list(fig.layout.shapes) + shapes,
            annotations=list(fig.layout.annotations) + notes,
        )


OVERVIEW_FREQ_S = 600  # the overview chart's bucket below a day


EXPLORER_FREQ_S = 600  # the hit-rate explorer's default bucket


def overview_freq(start: float, end: float) -> int:
    return int(max(OVERVIEW_FREQ_S, step(start, end) or 0))
