"""The dashboard's shared modules: the page registry's start-up imports and the hit-rate layer
filter that reads the layer registry."""

import dataclasses
import importlib

import pandas as pd
import pytest
from warmscope.app.dashboard import pages
from warmscope.model import records
from warmscope.model.registry import RegistryError


def test_every_page_import_is_a_module_and_the_server_loads_each_once():
    names = pages.page_imports()
    assert len(names) == len(set(names))
    # the overview's first view draws with plotly and evaluates the alert conditions
    assert {"plotly.graph_objects", "warmscope.analysis.alerts"} <= set(
        pages.page("overview").imports
    )
    for name in names:
        importlib.import_module(name)
    # every page's imports, none dropped: the union over pages, in page order
    assert set(names) == {m for p in pages.PAGES for m in p.imports}


def test_a_page_import_that_is_not_a_module_name_fails_at_import():
    bad = tuple(
        dataclasses.replace(p, imports=("plotly express",)) if p.name == "latency" else p
        for p in pages.PAGES
    )
    with pytest.raises(RegistryError, match="'latency': imports are dotted module names"):
        pages.check_pages(bad)


def test_hit_rate_layers_keep_the_layers_counted_in_hit_rates(monkeypatch):
    from warmscope.app.dashboard.cached import hit_rate_layers

    lk = pd.DataFrame(
        {
            "layer": ["weights", "prefix_kv", "ocr_pages", "weights"],
            "hits": [5, 3, 1, 2],
            "misses": [0, 1, 1, 0],
        }
    )
    kept = hit_rate_layers(lk)
    # weights is declared in_hit_rate=False; prefix_kv is declared; ocr_pages is not: the default
    # (counted)
    assert list(kept.layer) == ["prefix_kv", "ocr_pages"]
    assert int(kept.hits.sum()) == 3 + 1
    # the filter reads the registry: declare ocr_pages out of hit rates and it goes too
    monkeypatch.setitem(records.LAYERS, "ocr_pages", records.Layer(in_hit_rate=False))
    assert list(hit_rate_layers(lk).layer) == ["prefix_kv"]
    assert hit_rate_layers(lk.iloc[:0]).empty
