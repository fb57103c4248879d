import re

import numpy as np
import pandas as pd
import pytest
from warmscope.analysis.ab_report import (
    build_from_series,
    build_report,
    render_html,
    render_markdown,
)
from warmscope.collectors import EmbeddedStore
from warmscope.simulator import SimConfig

from tests.conftest import simulated_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("ab") / "ab.sqlite"
    simulated_store(path, SimConfig.load(hours=1.0, rps=6.0, tenants=4, replicas=2, seed=9, strategy_b="static_topk"),
                    workers=1)
    return EmbeddedStore(path, readonly=True)


@pytest.mark.slow
def test_report_from_unit_records(store):
    units = store.units("warmup-strategy")
    rep = build_report(units, "warmup-strategy", requests=store.frame("requests"))
    assert rep.error is None and rep.srm_units is not None and not rep.srm_units.flagged
    names = {r.metric for r in rep.results}
    assert {"conversion (units)", "hit rate (prefix_kv)", "GPU-s per request", "P95 latency (s)",
            "latency per request (s)"} <= names
    prim = [r for r in rep.results if r.primary]
    assert len(prim) == 1 and prim[0].metric == "latency per request (s)"
    others = [r for r in rep.results if not r.primary and np.isfinite(r.p_value)]
    assert all(r.p_holm >= r.p_value - 1e-12 and r.p_bh >= r.p_value - 1e-12 for r in others)
    assert rep.units["A"] + rep.units["B"] == len(units)
    # The headline equals a direct computation on the units.
    a, b = units[units.variant == "A"], units[units.variant == "B"]
    la, lb = a.latency_sum.sum() / a.requests.sum(), b.latency_sum.sum() / b.requests.sum()
    assert prim[0].control == pytest.approx(la) and prim[0].treatment == pytest.approx(lb)
    assert len(rep.effect_over_time) > 3


def test_html_is_self_contained_and_markdown_has_the_same_content(store):
    rep = build_report(store.units("warmup-strategy"), "warmup-strategy")
    page = render_html(rep)
    assert "plotly" in page.lower() and not re.search(r'<script[^>]+src="http', page)
    assert rep.verdict.split(":")[0] in page or rep.verdict[:30] in page
    md = render_markdown(rep)
    assert rep.verdict in md and "SRM on units: ok" in md and "★ latency per request (s)" in md
    assert "(a mismatch is p < 0.001)" in md


def test_srm_mismatch_puts_a_warning_before_everything(store):
    units = store.units("warmup-strategy")
    a = units[units.variant == "A"]
    b = units[units.variant == "B"]
    skewed = pd.concat([a, b.iloc[: len(b) // 2]])
    rep = build_report(skewed, "warmup-strategy")
    assert rep.srm_units.flagged and rep.verdict.startswith("Do not trust")
    md = render_markdown(rep)
    assert md.index("MISMATCH") < md.index("| Metric")


def test_unknown_experiment_is_a_clear_error(store):
    rep = build_report(store.units("warmup-strategy"), "no-such-experiment")
    assert rep.error and "no unit records for experiment 'no-such-experiment'" in rep.error


def test_prometheus_only_fallback_warns(store):
    rep = build_from_series(store.frame("lookups"), store.frame("requests"), "warmup-strategy")
    assert rep.source.startswith("metric series") and "unit records" in rep.warnings[0]
    assert rep.results[0].primary and "batch means" in rep.results[0].test


def test_cli_writes_html_and_markdown(store, tmp_path, capsys):
    from warmscope.app.cli.main import main as cli_main

    out = tmp_path / "r" / "ab.html"
    assert cli_main(["--store", str(store.path), "report", "ab", "--out", str(out)]) == 0
    assert out.exists() and out.with_suffix(".md").exists()
    assert capsys.readouterr().out.strip() in out.with_suffix(".md").read_text()
    assert cli_main(["--store", str(store.path), "report", "ab", "--experiment", "nope", "--out",
                     str(out)]) == 2


def test_p_values_read_as_people_write_them():
    from warmscope.analysis.ab_report import fmt_p

    assert [fmt_p(p) for p in (5.502e-153, 0.00099, 0.001, 0.0123, 0.5, float("nan"))] == [
        "< 0.001", "< 0.001", "0.001", "0.012", "0.500", "–"]


def test_arms_are_named_by_their_strategy_and_the_headline_names_winner_metric_size_and_confidence(store):
    import dataclasses

    from warmscope.analysis.ab_report import arm_strategies, guardrail_statement, headline

    labels = arm_strategies(store.frame("lookups"), store.frame("warmup_runs"), "warmup-strategy")
    # the fixture's pools: A runs no warm-up, B static top-K
    assert labels == {"A": "none", "B": "static_topk"}
    rep = dataclasses.replace(build_report(store.units("warmup-strategy"), "warmup-strategy"), labels=labels)
    h = headline(rep)
    prim = [r for r in rep.results if r.primary][0]
    assert "A (none)" in h and prim.metric in h and ("p < 0.001" in h or "p = 0." in h)
    assert ("B (static_topk) wins on" in h) == (prim.p_value < 0.05 and prim.abs_effect < 0)
    assert "e-" not in h  # no 5.502e-153
    page = render_html(rep, breakdown=pd.DataFrame({"Tenant": ["acme"], "Relative": ["+1.0%"]}))
    assert "<h2>Guardrails</h2>" in page and guardrail_statement(rep) in page
    assert "<h2>Breakdown by segment</h2>" in page and "<td>acme</td>" in page
    assert "B (static_topk) vs A (none)" in page and h in page.replace("&#x27;", "'")


def test_a_significant_improvement_with_numpy_figures_is_a_win_in_the_headline(store):
    """The demo's headline read "No arm beats A (none) … no significant difference" beside a primary metric the
    table marked a win (−2.7 %, Holm p < 0.001): the effect is a numpy float, and ``better`` returned numpy's bool,
    which the headline's ``is True`` refused."""
    import dataclasses

    import numpy as np
    from warmscope.analysis.ab_report import better, headline

    rep = build_report(store.units("warmup-strategy"), "warmup-strategy")
    prim = [r for r in rep.results if r.primary][0]
    won = dataclasses.replace(prim, abs_effect=np.float64(-0.035), rel_effect=np.float64(-0.027),
                              p_value=np.float64(1e-6), p_holm=np.float64(1e-6), direction="lower")
    assert better(won) is True
    rep = dataclasses.replace(rep, results=[won if r is prim else r for r in rep.results])
    assert " wins on " in headline(rep) and "No arm beats" not in headline(rep)


def test_report_cells_read_in_plain_notation():
    from warmscope.analysis.ab_report import plain_number

    # seen on the demo's guardrail rows: "2.512e-05 [2.025e-08, 5.022e-05]" and "+0.00% [-0.00%, +0.00%]"
    assert [plain_number(x) for x in (2.512e-05, 2.025e-08, -3.331e-06)] == ["0.000025", "0.00000002", "-0.0000033"]
    assert [plain_number(x) for x in (0.6488, 8.357, 12345.678, 0.0)] == ["0.649", "8.36", "12,346", "0"]
    assert [plain_number(x, True) for x in (2.5e-05, -2e-07, -0.0267)] == ["+0.0025%", "-0.00002%", "-2.67%"]
    assert plain_number(float("nan")) == "–"
