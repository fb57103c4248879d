"""The Advisor page's recommendation section under AppTest, on a recommendation tuned over a given replay
model: every figure on it is the recommendation's own."""

import numpy as np
import pandas as pd
from streamlit.testing.v1 import AppTest

from tests.analysis.test_advisor_staleness import _model, _warm_extra


def _show(rec, before, after):
    from warmscope.app.dashboard.views.advisor import _recommendation

    _recommendation(rec, before, after)


def test_the_recommendation_section_shows_the_recommendations_own_figures():
    from warmscope.analysis.advisor import advise
    from warmscope.analysis.replay import _layer_hits, curves, replay_cost

    m = _model(capacity=500.0, catalog=20000)
    m.base_hits = {"response": _layer_hits(m, "response", 1.0, m.base)[0].sum()
                   + _warm_extra(m, "response", 1.0, m.base, np.random.default_rng(0))[0]}
    m.base_hits.update({f"_cost_{k}": v for k, v in replay_cost(m, m.base).items()})
    r = m.rates["response"]
    lk = pd.DataFrame({"ts": r.index + 900.0, "layer": "response", "family": "f", "result": "hit",
                       "count": r.iloc[:, 0].to_numpy() * 900.0})
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
