"""The What if page on a real block trace: the first 2,000 requests of the Mooncake conversation trace shipped in
data/traces, imported into a store, rendered under AppTest."""

import re
from pathlib import Path

from streamlit.testing.v1 import AppTest
from warmscope.app.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
MAIN = str(ROOT / "app" / "dashboard" / "main.py")


def test_the_what_if_page_answers_on_an_imported_trace(tmp_path, monkeypatch):
    lines = (ROOT / "data" / "traces" / "mooncake_conversation.jsonl").read_text().splitlines()[:2000]
    trace = tmp_path / "slice.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    store = tmp_path / "wi.sqlite"
    assert main(["--store", str(store), "trace", "import", str(trace), "--align", "keep"]) == 0
    monkeypatch.setenv("WARMSCOPE_STORE", str(store))
    at = AppTest.from_file(MAIN, default_timeout=600).run()
    at.switch_page("entries/whatif.py").run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Requests"] == "2,000"
    assert re.fullmatch(r"\d+\.\d%", metrics["Token hit rate, replayed"]), metrics
    # the trace carries no engine counts: the half-of-the-maximum size instead, at a size people read
    assert re.fullmatch(r"[\d.,]+ (k |M |G )?tokens", metrics["Half the maximum needs"]), metrics
    assert not metrics["Half the maximum needs"].startswith("0.0")
    fixes = at.table[0].value
    assert any(str(i).startswith("capacity ×2") for i in fixes.index), list(fixes.index)
    captions = " ".join(c.value for c in at.caption)
    assert "Block LRU reaches half of the maximum at" in captions
