"""The warm-up-out-of-step trap reads the layers declared ``loaded_at_start`` in
``records.LAYERS`` when it runs, not a layer name: a new layer with the attribute is picked up,
an undeclared one is not. The tests declare their own registry (a model-weights layer and, where
needed, a LoRA one), so they hold whatever the shipped registry declares."""

import re
from pathlib import Path

import pandas as pd
import pytest
from warmscope.analysis.traps import out_of_step
from warmscope.model import records
from warmscope.model.registry import RegistryError

AN, BASE = (3600.0, 7200.0), (0.0, 3600.0)


def _lookups() -> pd.DataFrame:
    rows = [
        # baseline (0, 3600]: every lora lookup hits
        (1800.0, "lora", "r1", "hit", 100),
        (1800.0, "lora", "r2", "hit", 100),
        # window (3600, 7200]: r2 misses 40 of its 100 lora lookups
        (5400.0, "lora", "r1", "hit", 100),
        (5400.0, "lora", "r2", "hit", 60),
        (5400.0, "lora", "r2", "miss", 40),
        # a layer not loaded at start: r1's prefix-KV misses must not count
        (5400.0, "prefix_kv", "r1", "miss", 90),
        (5400.0, "prefix_kv", "r1", "hit", 10),
    ]
    return pd.DataFrame(rows, columns=["ts", "layer", "replica", "result", "count"])


@pytest.fixture(autouse=True)
def weights_only(monkeypatch):
    monkeypatch.setattr(records, "LAYERS", {"weights": records.Layer(loaded_at_start=True)})


def test_the_start_layers_are_the_declared_ones():
    assert records.start_layers() == ("weights",)
    with pytest.raises(RegistryError):
        records.Layer(loaded_at_start="yes")  # type: ignore[arg-type]


def test_an_undeclared_layer_is_not_read():
    v = out_of_step({"lookups": _lookups()}, AN, BASE)
    assert not v.detected and v.evidence == "no weights lookups in the window"


def test_a_new_layer_loaded_at_start_is_picked_up(monkeypatch):
    monkeypatch.setitem(records.LAYERS, "lora", records.Layer(loaded_at_start=True))
    assert records.start_layers() == ("weights", "lora")
    v = out_of_step({"lookups": _lookups()}, AN, BASE)
    assert v.detected and v.scope == {"replica": "r2"}
    # r2: 40 misses of 100 lookups = 40% (baseline 0%); r1's prefix-KV misses (90%) left out
    assert v.numbers == {"miss_rate": pytest.approx(0.4), "baseline": 0.0}
    assert v.confidence == 1.0  # min(1, 0.5 + 5 x 0.4)
    # the text names the declared layers, not "weights" alone
    assert v.evidence.startswith(
        "replica r2: 40 requests met unloaded weights and lora (40.0% of its weights and lora"
    ), v.evidence


def test_no_module_compares_a_layer_with_the_name_weights():
    """What the weights are used for is the declaration (loaded_at_start, in_hit_rate,
    shared), not a layer name compared in the code (before: analysis/traps.py twice and
    analysis/replay.py)."""
    root = Path(__file__).resolve().parents[2]
    pattern = re.compile(r"""layer["']?\]?\s*[!=]=\s*\(?\s*["']weights["']""")
    packages = ("model", "collectors", "sources", "analysis", "app")
    found = [str(p.relative_to(root)) for pkg in packages
             for p in (root / pkg).rglob("*.py") if pattern.search(p.read_text())]
    assert found == []
    assert pattern.search('d["layer"] == "weights"') and pattern.search("x.layer != 'weights'")
