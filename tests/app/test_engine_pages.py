"""Engine-only mode through the pages' own code, without an engine: a real Prometheus scrapes two
vLLM-shaped /metrics exporters whose prefix-cache counters advance by fixed amounts per scrape,
so every hit rate is known. The overview, the hit-rate explorer and root cause render the
engines' token-weighted hit rate through the same cached hit-rate tables the collector view uses.
(tests/engine/test_engine_prometheus.py does the same against real vLLM engines.)"""

from __future__ import annotations

import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.conftest import free_port, need_binary, wait_until

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

VIEWS = Path(__file__).resolve().parents[2] / "app" / "dashboard" / "entries"
# prompt tokens and cached tokens per scrape: A 80/100 until it drops to 20/100, B 30/100 throughout
QUERIES = 100
HITS = {"a": 80, "b": 30}
HITS_AFTER_DROP = {"a": 20, "b": 30}


class _Exporter(BaseHTTPRequestHandler):
    totals: dict = {}  # port -> (hits, queries) so far
    dropped = False  # A's hit ratio has dropped
    names: dict = {}  # port -> "a" | "b"

    def do_GET(self):  # noqa: N802
        port = self.server.server_port
        who = _Exporter.names[port]
        hits, queries = _Exporter.totals.get(port, (0, 0))
        step = (HITS_AFTER_DROP if _Exporter.dropped else HITS)[who]
        hits, queries = hits + step, queries + QUERIES
        _Exporter.totals[port] = (hits, queries)
        lines = [
            f"process_start_time_seconds {_Exporter.started}",
            f'vllm:prefix_cache_hits_total{{engine="0",model_name="tiny"}} {hits}',
            f'vllm:prefix_cache_queries_total{{engine="0",model_name="tiny"}} {queries}',
            'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25',
        ]
        body = ("\n".join(lines) + "\n").encode()
        # answer as a busy engine does: Prometheus stamps the samples with the scrape's start
        # and stores them when the answer is in, 0.3 s later
        time.sleep(0.3)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    """Prometheus scraping A and B every second: 30 s at the first ratios, then 30 s with A's
    dropped (and on, while the tests run); yields (url, {instance: name}, the time of the drop)."""
    prom_bin = need_binary("prometheus")
    tmp = tmp_path_factory.mktemp("engine-pages")
    _Exporter.started = time.time()
    servers = [HTTPServer(("127.0.0.1", free_port()), _Exporter) for _ in range(2)]
    for s, who in zip(servers, "ab", strict=True):
        _Exporter.names[s.server_port] = who
        threading.Thread(target=s.serve_forever, daemon=True).start()
    port = free_port()
    targets = ", ".join(f"'127.0.0.1:{s.server_port}'" for s in servers)
    (tmp / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: engines\n    static_configs: [{{targets: [{targets}]}}]\n"
    )
    import subprocess

    proc = subprocess.Popen(
        [
            prom_bin,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: urllib.request.urlopen(url + "/-/ready", timeout=2).status == 200,
            60,
            "prometheus",
        )
        time.sleep(30)
        _Exporter.dropped = True
        drop = time.time()
        time.sleep(30)
        yield (
            url,
            {f"127.0.0.1:{s.server_port}": _Exporter.names[s.server_port] for s in servers},
            drop,
        )
    finally:
        proc.terminate()
        proc.wait(10)
        for s in servers:
            s.shutdown()
            s.server_close()


@pytest.fixture
def engine_only(prom, tmp_path, monkeypatch):
    url, _, _ = prom
    monkeypatch.setenv("WARMSCOPE_PROMETHEUS_URL", url)
    monkeypatch.setenv("WARMSCOPE_STORE", str(tmp_path / "absent.sqlite"))
    monkeypatch.setenv("WARMSCOPE_DATA_DIR", str(tmp_path))
    import streamlit

    streamlit.cache_data.clear()
    return prom


def _page(name: str) -> AppTest:
    at = AppTest.from_file(str(VIEWS / f"{name}.py"), default_timeout=120)
    at.session_state["range"] = "last hour"
    return at.run()


def test_overview_table_is_each_engines_token_weighted_hit_rate(engine_only):
    _, names, _ = engine_only
    at = _page("overview")
    assert not at.exception and not at.error, (at.exception, at.error)
    table = at.dataframe[0].value.set_index("instance")
    assert set(table.index) == set(names)
    for inst, who in names.items():
        row = table.loc[inst]
        # B: 30 of every 100 prompt tokens cached, whatever the number of scrapes in the range
        if who == "b":
            assert row["hit_rate"] == pytest.approx(30 / 100)
        # A: 80/100 before the drop, 20/100 after, about 25 scrapes each: between the two
        else:
            assert 0.2 < row["hit_rate"] < 0.8
        assert row["hits"] == pytest.approx(row["hit_rate"] * row["queries"])
        assert row["queries"] % QUERIES == 0  # whole scrapes
    assert [s.value for s in at.subheader] == [
        "Hit rate by model, instance and engine",
        "Time to first token",
    ]
    text = " ".join(str(x.value) for x in at.info)
    assert "need the warmscope collectors" in text


def test_hit_rate_explorer_groups_the_engines_counters(engine_only):
    _, names, _ = engine_only
    at = _page("hitrate")
    assert not at.exception and not at.error, (at.exception, at.error)
    assert at.selectbox(key="groupby").options == ["instance", "model", "engine kind", "engine"]
    top = at.dataframe[0].value.set_index("instance")
    b = next(i for i, w in names.items() if w == "b")
    assert top.loc[b, "hit_rate"] == pytest.approx(0.30)
    assert top["share"].sum() == pytest.approx(1.0)
    assert "share of prompt tokens" in " ".join(str(c.value) for c in at.caption)
    # drill into B: the path narrows the table to it
    drill_picker(at).set_value(b).run()
    assert not at.exception
    assert set(at.dataframe[0].value["model"]) == {"tiny"}
    assert at.session_state["drill"] == [("instance", b)]


def test_root_cause_names_the_engine_whose_hit_rate_dropped(engine_only):
    _, names, drop = engine_only
    at = _page("rootcause")
    assert not at.exception and not at.error, (at.exception, at.error)
    # anomaly: from about the drop to now (slider step 0.01 h = 36 s); baseline: as long, before
    hours = max(round((time.time() - drop) / 36), 1) * 0.01
    at.slider(key="engine-rc-win").set_value((0.0, hours)).run()
    assert not at.exception
    leaves = at.dataframe[0].value
    assert set(leaves.instance) == set(names)
    assert [s.value for s in at.subheader] == ["Ranked explanations"]
    causes = at.dataframe[1].value
    a = next(i for i, w in names.items() if w == "a")
    assert f"instance = {a}" in causes.Cause.iloc[0]
    assert "Cold-start trap checks" in " ".join(str(c.value) for c in at.caption)


def test_hits_and_queries_of_a_read_come_from_the_same_scrapes(prom):
    """B caches 30 of every 100 prompt tokens on every scrape, so any read of whole scrapes is
    exactly 0.3. Hits and queries are read in one query (Prometheus answers it from one view:
    a scrape's samples are seen together or not at all); read as two queries, a scrape landing
    between them gave one more scrape of queries than of hits (1,680 / 5,700 = 0.2947).
    Reads ending now, back to back for 12 s (scrapes every second), so scrapes do land
    mid-read."""
    from warmscope.sources.prometheus import PrometheusSource

    url, names, _ = prom
    b = next(i for i, w in names.items() if w == "b")
    src = PrometheusSource(url, scrape_interval=1.0)
    asked = []
    query_range = src.query_range

    def counted(query, start, end, step):
        asked.append(query)
        return query_range(query, start, end, step)

    src.query_range = counted
    reads, off = 0, []
    stop = time.monotonic() + 12
    while time.monotonic() < stop:
        asked.clear()
        now = time.time()
        df = src.engine_frame("engine_prefix", now - 120, now)
        rows = df[df.instance == b]
        hits, queries = rows.hits.sum(), rows.queries.sum()
        assert queries > 0 and queries % QUERIES == 0  # whole scrapes
        if hits * QUERIES != queries * HITS["b"]:
            off.append((hits, queries))
        reads += 1
        # hits, queries and the targets' up and start times: one range query
        assert len(asked) == 1, asked
    assert reads >= 20
    assert not off, f"{len(off)} of {reads} reads mixed scrapes: {off[:5]}"


def drill_picker(at):
    """The hit rate explorer's "Drill into a ..." picker (its key changes with each level)."""
    return next(s for s in at.selectbox if s.label.startswith("Drill into"))
