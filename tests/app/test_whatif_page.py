"""The What if page and the Advisor's judgement of warm-up strategies on a real block trace alone: the first
requests of the Mooncake conversation trace shipped in data/traces, imported into a store, rendered under AppTest."""

import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from warmscope.app.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
MAIN = str(ROOT / "app" / "dashboard" / "main.py")


def _page_on_trace(tmp_path, monkeypatch, requests: int, page: str) -> AppTest:
    """The dashboard on a store that holds the first ``requests`` of the Mooncake trace alone (its
    own times kept), switched to ``page``."""
    lines = (ROOT / "data" / "traces" / "mooncake_conversation.jsonl").read_text().splitlines()[:requests]
    trace = tmp_path / "slice.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    store = tmp_path / "trace.sqlite"
    assert main(["--store", str(store), "trace", "import", str(trace), "--align", "keep"]) == 0
    monkeypatch.setenv("WARMSCOPE_STORE", str(store))
    at = AppTest.from_file(MAIN, default_timeout=900).run()
    at.switch_page(f"entries/{page}.py").run()
    assert not at.exception, at.exception
    return at


def test_the_what_if_page_answers_on_an_imported_trace(tmp_path, monkeypatch):
    at = _page_on_trace(tmp_path, monkeypatch, 2000, "whatif")
    assert not at.error, [e.value for e in at.error]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Requests"] == "2,000"
    assert re.fullmatch(r"\d+\.\d%", metrics["Token hit rate, replayed"]), metrics
    # the trace carries no engine counts: the half-of-the-maximum size instead, at a size people read
    # (the unit in the label: "4.07 M tokens" did not fit a quarter of the page's width)
    assert re.fullmatch(r"[\d.,]+( k| M| G)?", metrics["Tokens for half the max"]), metrics
    assert not metrics["Tokens for half the max"].startswith("0.0")
    fixes = at.table[0].value
    assert any(str(i).startswith("capacity ×2") for i in fixes.index), list(fixes.index)
    captions = " ".join(c.value for c in at.caption)
    assert "Block LRU reaches half of the maximum at" in captions


@pytest.mark.slow  # about 30 s: 30 restarts replayed for five strategies and four budgets
def test_the_advisor_judges_warm_up_strategies_on_an_imported_trace(tmp_path, monkeypatch):
    """The Advisor page's judgement of warm-up strategies on the trace alone, its button pressed: a
    recommendation with four metric tiles whose values fit a quarter of the page (the unit in the
    label: "1.58 M tokens" and "Prefill tokens saved per restart" were cut at 1280 px)."""
    # half the hour (about 30 min): 5 min of history before a restart and 15 min after it fit
    at = _page_on_trace(tmp_path, monkeypatch, 6000, "advisor")
    # no lookups: no forecast or tuning, but the trace's judgement is offered
    assert any("no lookups yet" in i.value for i in at.info), [i.value for i in at.info]
    at.button(key="adv_trace_go").click().run()
    assert not at.exception, at.exception
    metrics = {m.label: m.value for m in at.metric}
    restart = metrics["Tokens saved per restart"]
    assert re.fullmatch(r"[+-][\d,]+", restart), metrics
    assert re.fullmatch(r"[+-][\d,]+", metrics["Tokens saved per request"]), metrics
    # the Mooncake trace has no time to first token: the warm-up's own prefill instead, no word
    assert re.fullmatch(r"[\d.,]+( k| M| G)?", metrics["Warm-up's prefill, tokens"]), metrics
    assert re.fullmatch(r"\d+\.\d%", metrics["Of the seen oracle's gain"]), metrics
    assert all(len(v) <= 10 for v in metrics.values() if v), metrics
    # the tiles agree with the recommendation's own sentence on this slice: "It costs more prefill
    # than it saves (2,566,093 tokens warmed for 295,305 saved per restart)", 2,566,093 read as 2.57 M
    said = " ".join(m.value for m in at.markdown)
    m = re.search(r"\(([\d,]+) tokens warmed for ([\d,]+) saved per restart\)", said)
    assert m, said
    assert m.group(2) == restart.lstrip("+")
    assert metrics["Warm-up's prefill, tokens"] == f"{int(m.group(1).replace(',', '')) / 1e6:.3g} M"
