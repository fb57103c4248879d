"""The Alerts page's history table under AppTest, on a hand-written history: every summary shows
in full (a wrapped table, not a data grid that cuts it at its column's width), newest first, with
markup in a summary shown as text; a long history scrolls in a box of its own."""

import pandas as pd
from streamlit.testing.v1 import AppTest

from tests.helpers import wrapped_table

T = 1_800_000_000.0
LONG = (
    "strategy static_topk on embedding: 26% of 800 warmed keys were read (2 runs, 8.9 GPU-s wasted); "
    "the rest expired or were evicted before a reader came, so the warm set is too wide for the cache "
    "& its TTL <1 h>"
)


def _history(n: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "alert": ["WarmSetPrecisionLow", *["CacheBypassSpike"] * (n - 1)],
            "subject": ["strategy static_topk on embedding", *["layer response"] * (n - 1)],
            "severity": "warning",
            "since": [T + 60 * i for i in range(n)],
            "fired": [T + 60 * i + 600 for i in range(n)],
            "resolved": [T + 60 * i + 1200 for i in range(n - 1)] + [float("nan")],
            "summary": [LONG, *[f"tenant globex, layer response: {i}% of lookups bypassed" for i in range(1, n)]],
        }
    )


def _show(hist, end):
    from warmscope.app.dashboard.views.alerts import _history_table

    _history_table(hist, end)


def _table(at):
    return wrapped_table(next(m.value for m in at.markdown if "Fired (UTC)" in m.value))


def test_every_summary_shows_in_full_newest_first():
    hist = _history(3)
    at = AppTest.from_function(_show, args=(hist, T + 3600), default_timeout=60).run()
    assert not at.exception, at.exception
    assert not at.dataframe  # no data grid: it cuts long text at its column's width
    shown = _table(at)
    assert list(shown.columns) == ["Alert", "Subject", "Severity", "Began (UTC)", "Fired (UTC)", "Resolved (UTC)",
                                   "Lasted", "Summary"]
    # newest first: the rows reversed; the first episode's long summary whole, "&" and "<1 h>" as text
    assert list(shown["Summary"]) == list(hist.summary[::-1])
    assert shown["Summary"].iloc[-1] == LONG
    # the last episode still fires: (T + 3600) - (T + 120 + 600) = 2,880 s = 48 min, "+"
    assert shown["Lasted"].iloc[0] == "48 min+" and shown["Resolved (UTC)"].iloc[0] == "still firing"


def test_a_long_history_scrolls_in_its_own_box():
    from warmscope.app.dashboard.views.alerts import HISTORY_HEIGHT, HISTORY_ROWS

    assert (HISTORY_ROWS, HISTORY_HEIGHT) == (12, 560)
    for n, height in ((12, 0), (13, 560)):  # 12 episodes at their own height; 13 in a 560 px box
        at = AppTest.from_function(_show, args=(_history(n), T + 3600), default_timeout=60).run()
        assert len(_table(at)) == n
        box = at.main.children[0].proto
        assert box.height_config.pixel_height == height and box.height_config.use_content == (not height)
