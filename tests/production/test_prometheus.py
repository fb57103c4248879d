"""The Prometheus source against a real Prometheus scraping the collectors
while the simulator runs in real time; escaping and failure messages."""

import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from warmscope.sources import SourceError
from warmscope.sources.prometheus import PrometheusSource, choose_step, promql_string, selector

from tests.conftest import free_port, prom_query
from tests.production.conftest import live_simulation


def _decode_literal(s: str, i: int) -> tuple[str, int]:
    """Read the PromQL string literal starting at s[i] == '"'; return (value, end)."""
    assert s[i] == '"'
    out, i = [], i + 1
    esc = {"\\": "\\", '"': '"', "n": "\n", "r": "\r", "t": "\t"}
    while s[i] != '"':
        if s[i] == "\\":
            out.append(esc[s[i + 1]])
            i += 2
        else:
            out.append(s[i])
            i += 1
    return "".join(out), i + 1


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40), st.lists(st.text(max_size=10), min_size=1, max_size=4))
@pytest.mark.slow
def test_label_values_cannot_change_the_query(value, values):
    q = selector("warmscope_cache_lookups_total", {"tenant": value, "layer": values})
    assert q.startswith('warmscope_cache_lookups_total{warmscope_tenant="')
    got, end = _decode_literal(q, q.index('"'))
    assert got == value
    rest = q[end:]
    assert rest.startswith(', warmscope_cache_layer=~"')
    rx, end2 = _decode_literal(rest, rest.index('"'))
    assert rest[end2:] == "}"  # nothing after the last matcher: no injected clause
    import re

    assert all(re.fullmatch(rx, v) for v in values)
    assert not re.fullmatch(rx, "".join(values) + "x") or "".join(values) + "x" in values


def test_unknown_dimension_and_steps():
    with pytest.raises(ValueError, match="cannot filter on 'tenant\\}'"):
        selector("m", {"tenant}": "x"})
    assert choose_step(0, 3600) == 15 and choose_step(0, 86400) == 300 and choose_step(0, 7 * 86400) == 3600
    assert promql_string('a"b\\c\n') == '"a\\"b\\\\c\\n"'


def test_unreachable_prometheus_is_a_clear_message():
    src = PrometheusSource(f"http://127.0.0.1:{free_port()}", timeout=2)
    with pytest.raises(SourceError, match=r"is unreachable; start it or set WARMSCOPE_PROMETHEUS_URL"):
        src.frame("lookups", 0, 3600)


class _Odd(BaseHTTPRequestHandler):
    mode = "html"

    def do_GET(self):  # noqa: N802
        if _Odd.mode == "slow":
            time.sleep(3)
        body = b"<html>not prometheus</html>" if _Odd.mode in ("html", "slow") else b'{"status":"error"}'
        self.send_response(500 if _Odd.mode == "error" else 200)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.mark.parametrize("mode, needle", [("html", "not the Prometheus API"), ("error", "refused the query"),
                                          ("slow", "did not answer within 1 s")])
def test_garbage_error_and_slow_answers_are_clear_messages(mode, needle):
    srv = HTTPServer(("127.0.0.1", free_port()), _Odd)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    _Odd.mode = mode
    try:
        src = PrometheusSource(f"http://127.0.0.1:{srv.server_port}", timeout=1)
        with pytest.raises(SourceError, match=needle):
            src.frame("lookups", 0, 3600)
    finally:
        srv.shutdown()
        srv.server_close()


def test_other_frames_say_where_they_live():
    with pytest.raises(SourceError, match="come from Redis or the embedded store"):
        PrometheusSource("http://127.0.0.1:1").frame("hot_keys", 0, 1)


@pytest.fixture(scope="module")
def live_run(tmp_path_factory):
    """Simulator in real time, scraped every second by a real Prometheus."""
    with live_simulation(tmp_path_factory.mktemp("prom")) as run:
        yield run


@pytest.mark.prometheus
def test_prometheus_counts_agree_with_the_embedded_store(live_run):
    import urllib.parse  # noqa: F401

    url, store, t0, t1 = live_run
    lk = store.frame("lookups")
    by_layer = lk.groupby("layer")["count"].sum()
    got = {r["metric"]["warmscope_cache_layer"]: float(r["value"][1])
           for r in prom_query(url, "sum by (warmscope_cache_layer) (warmscope_cache_lookups_total)")}
    assert set(got) == set(by_layer.index)
    # The last scrape can miss at most one scrape interval (1 s) of traffic.
    per_second = lk.groupby("layer")["count"].sum() / max(lk.ts.max() - lk.ts.min(), 1)
    for layer, n in by_layer.items():
        assert abs(got[layer] - n) <= 2 * per_second[layer] + 1, (layer, got[layer], n)


@pytest.mark.prometheus
def test_prometheus_source_builds_canonical_frames(live_run):
    url, store, t0, t1 = live_run
    src = PrometheusSource(url)
    df = src.frame("lookups", t0 - 30, t1 + 5)
    assert list(df.columns) == ["ts", "tenant", "layer", "family", "result", "experiment", "variant", "model",
                                "replica", "length_bucket", "count"]
    assert len(df) > 0 and set(df.layer) <= set(store.frame("lookups").layer)
    st_lk = store.frame("lookups")
    per_layer = df.groupby("layer")["count"].sum()
    rate = st_lk.groupby("layer")["count"].sum() / max(st_lk.ts.max() - st_lk.ts.min(), 1)
    for layer, n in st_lk.groupby("layer")["count"].sum().items():  # within one scrape interval of traffic
        assert abs(per_layer[layer] - n) <= 2 * rate[layer] + 1, (layer, per_layer[layer], n)
    inj = src.frame("lookups", t0 - 30, t1 + 5, filters={"tenant": 'acme"} or vector(1) #'})
    assert inj.empty  # an injected value is just a tenant that does not exist
    req = src.frame("requests", t0 - 30, t1 + 5)
    assert req["requests"].sum() > 0 and req["gpu_s"].sum() > 0


@pytest.mark.prometheus
def test_dashboard_reads_lookups_from_prometheus(live_run, monkeypatch):
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    url, store, t0, t1 = live_run
    monkeypatch.setenv("WARMSCOPE_PROMETHEUS_URL", url)
    monkeypatch.setenv("WARMSCOPE_STORE", str(store.path))
    main = str(Path(__file__).resolve().parents[2] / "app" / "dashboard" / "main.py")
    at = AppTest.from_file(main, default_timeout=120).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    shown = int({m.label: m.value for m in at.metric}["Lookups"].replace(",", ""))
    lk = store.frame("lookups")
    expected = lk[lk.result.isin(["hit", "miss"]) & (lk.layer != "weights")]["count"].sum()  # the headline's definition
    assert abs(shown - expected) <= 0.05 * expected + 20
    assert "Prometheus" in at.sidebar.caption[0].value
