"""The "add a cache layer" recipe of docs/architecture.md, end to end.

A dummy layer ("rerank") is declared the way the recipe says (an entry in
``records.LAYERS``; here through monkeypatch instead of an edit), its cache is
wrapped with the public collector API, lookups are made inside request
contexts, the pipeline flushes to a real embedded store, and the lookups are
read back from the store and through the hit-rate analysis."""

from __future__ import annotations

import pytest
from statsmodels.stats.proportion import proportion_confint
from warmscope.analysis.hitrate import hit_table
from warmscope.collectors import EmbeddedStore, InstrumentedCache, request_context
from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.pipeline import Telemetry
from warmscope.model import records


@pytest.fixture
def rerank_layer(monkeypatch):
    monkeypatch.setitem(records.LAYERS, "rerank", records.Layer(length_buckets=True))
    return "rerank"


def test_a_new_layer_flows_from_the_wrapper_to_the_store_and_the_hit_rate(rerank_layer, tmp_path):
    path = tmp_path / "store.sqlite"
    cfg = CollectorConfig.load(env={}, store_path=str(path), key_secret="recipe", exporter="embedded",
                               replica="r1")
    tel = Telemetry(cfg, background=False, clock=lambda: 1_000.0)
    cache = InstrumentedCache({"rerank:doc:1": [0.9], "rerank:doc:2": [0.4]}, layer=rerank_layer, telemetry=tel)
    other = InstrumentedCache({}, layer="response", telemetry=tel)  # an undeclared layer: defaults
    with request_context(tenant="acme", prompt_tokens=300, telemetry=tel):
        for key in ("rerank:doc:1", "rerank:doc:1", "rerank:doc:2", "rerank:doc:3"):
            cache.get(key)  # 3 hits, 1 miss
        other.get("resp:x")
    with request_context(tenant="beta", prompt_tokens=5000, telemetry=tel):
        cache.get("rerank:doc:9")  # 1 miss
    tel.flush(now=1_060.0)
    tel.close()

    lk = EmbeddedStore(path, readonly=True).frame("lookups")
    mine = lk[lk["layer"] == "rerank"]
    got = mine.groupby(["tenant", "result", "length_bucket"])["count"].sum().to_dict()
    # prompt_tokens 300 -> bucket 512, 5000 -> 8192 (declared length_buckets=True)
    assert got == {("acme", "hit", "512"): 3, ("acme", "miss", "512"): 1, ("beta", "miss", "8192"): 1}
    assert set(mine["family"]) == {"rerank:doc:*"}  # no key text: the family template only
    assert set(mine["replica"]) == {"r1"} and set(mine["ts"]) == {1_060.0}
    # The undeclared layer gets no length bucket (the default declaration).
    assert set(lk.loc[lk["layer"] == "response", "length_bucket"]) == {""}

    t = hit_table(lk, by=["layer"]).set_index("layer")
    assert t.loc["rerank", "hits"] == 3 and t.loc["rerank", "lookups"] == 5
    assert t.loc["rerank", "hit_rate"] == pytest.approx(3 / 5)  # 3 hits of 5 lookups
    lo, hi = proportion_confint(3, 5, alpha=0.05, method="wilson")
    assert (t.loc["rerank", "ci_low"], t.loc["rerank", "ci_high"]) == (pytest.approx(lo), pytest.approx(hi))
    by_tenant = hit_table(mine, by=["tenant"]).set_index("tenant")["hit_rate"]
    assert by_tenant.to_dict() == {"acme": pytest.approx(0.75), "beta": 0.0}  # 3/4 and 0/1
