"""The Advisor page's recommendation section under AppTest, on a recommendation tuned over a given replay
model: every figure on it is the recommendation's own."""

from streamlit.testing.v1 import AppTest

from tests.analysis.test_advisor_staleness import tunable_model


def _show(rec, before, after):
    from warmscope.app.dashboard.views.advisor import _recommendation

    _recommendation(rec, before, after)


def test_the_recommendation_section_shows_the_recommendations_own_figures():
    from warmscope.analysis.advisor import advise
    from warmscope.analysis.replay import curves

    m, lk = tunable_model()
    rec = advise({"lookups": lk}, model=m, n_init=4, n_iter=2, seed=1)
    before, after = curves(rec.model, rec.base), curves(rec.model, rec.params)
    at = AppTest.from_function(_show, args=(rec, before, after), default_timeout=60).run()
    assert not at.exception, at.exception
    metrics = {x.label: x for x in at.metric}
    o, bo = rec.outcome, rec.base_outcome
    assert rec.objective == "net_gpu_s"
    assert metrics["Expected gain"].value == f"{rec.gain:+,.0f} GPU-s"
    assert metrics["Warm-up ROI (compute)"].value == f"{o.roi:+.2f}"
    assert metrics["Warm-up GPU-s"].value == f"{o.warm_gpu_s:,.0f}"
    assert metrics["Warm-up bytes"].value == f"{o.warm_bytes / 1e6:,.0f} MB"
    assert metrics["Warm-up GPU-s"].delta == f"{o.warm_gpu_s - bo.warm_gpu_s:+,.0f}"
    said = " ".join(c.value for c in at.caption)
    assert "Fidelity not checked (a given model)." in said
    assert f"{rec.evaluations} replays in {rec.seconds:.1f} s." in said
    assert any(f"**Objective: {rec.objective}**" in md.value for md in at.markdown)
    layers = at.dataframe[0].value
    assert "response" in " ".join(map(str, layers.index)) + " ".join(map(str, layers.iloc[:, 0]))
