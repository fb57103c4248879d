"""The Root cause page's ranked explanations under AppTest: the cause table and its bars are in
score order, highest first, whatever order the search found the causes in."""

import json

from streamlit.testing.v1 import AppTest
from warmscope.analysis.rootcause import Localization, RootCause


def _show(loc):
    from warmscope.app.dashboard.views.rootcause import explanations

    explanations(loc, "Hit rate (every layer, weights included)")


def _cause(tenant, score, power):
    return RootCause({"tenant": tenant, "layer": "response"}, score, power, leaves=10, abnormal_leaves=5)


# The demo store's causes for the window 2026-12-03 18:24 -> 18:54 in the order the search found
# them: acme (score 0.037) before globex (0.408, explaining 77 % of the change).
LOC = Localization(
    causes=[_cause("acme", 0.037, 0.063), _cause("globex", 0.408, 0.767), _cause("hooli", 0.019, 0.016),
            _cause("stark", 0.020, 0.013), _cause("umbrella", 0.017, 0.031)],
    measure="hit rate", observed=0.68, expected=0.70, abnormal_leaves=25, leaves=100,
)


def test_the_causes_are_ranked_by_score_highest_first():
    at = AppTest.from_function(_show, args=(LOC,), default_timeout=60).run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    # 0.408 > 0.037 > 0.020 > 0.019 > 0.017
    order = ["globex", "acme", "stark", "hooli", "umbrella"]
    assert list(table["Cause"]) == [f"tenant = {t} · layer = response" for t in order]
    assert list(table["Score"]) == [0.408, 0.037, 0.020, 0.019, 0.017]
    # the bars: the same order, top cause first (the y axis runs top-down)
    bars = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert bars["data"][0]["y"] == list(table["Cause"])
    assert bars["layout"]["yaxis"]["autorange"] == "reversed"
    assert any("ranked by score, highest first" in c.value for c in at.caption)


def test_every_reader_of_the_largest_cause_takes_the_top_scored_one(capsys):
    # Localization.ranked() is the one order: the Root cause table's, the overview's "largest cause"
    # and `warmscope rca`'s JSON; the search's own order (causes) is left as found.
    import argparse
    import inspect

    from warmscope.app.cli.rca import _print
    from warmscope.app.dashboard.views import overview

    assert [c.element["tenant"] for c in LOC.ranked()] == ["globex", "acme", "stark", "hooli", "umbrella"]
    assert [c.element["tenant"] for c in LOC.causes][:2] == ["acme", "globex"]
    assert _print(LOC, argparse.Namespace(compact=True, max_causes=10)) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [c["element"]["tenant"] for c in printed] == ["globex", "acme", "stark", "hooli", "umbrella"]
    assert "loc.ranked()[0]" in inspect.getsource(overview._what_happened)  # the overview's sentence
