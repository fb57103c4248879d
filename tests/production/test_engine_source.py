"""Engine frames from a real Prometheus scraping engine-shaped /metrics: the
names as Prometheus 2.x stores them when a current prometheus_client escapes
colons (vllm_…), the colon names (sglang:…), both forms of one series at once,
and several instances kept apart, and a target that goes down keeping the
counts of its last scrapes. The exporter is a small HTTP server whose counters
advance by fixed amounts per scrape, so every total is known."""

from __future__ import annotations

import threading
import time
import urllib.request
from http.server import HTTPServer

import pytest
from warmscope.sources.prometheus import PrometheusSource, engine_kind

from tests.conftest import ExpositionHandler, free_port, need_binary, prom_query, wait_until

STEP = {"hits_a": 62, "hits_b": 35, "queries": 100, "sg_device": 45, "sg_host": 15, "sg_prompt": 100}


_D_DOWN: list = []      # set once the test has taken D down


class _Engine(ExpositionHandler):
    scrapes: dict = {}   # port -> scrapes served
    frozen = False       # counters stop moving (the test reads a settled state); not D's
    last_scrape: dict = {}  # port -> time of the last scrape served

    def exposition(self) -> bytes:
        port = self.server.server_port
        if not _Engine.frozen or port == _Engine.ports[3]:
            _Engine.scrapes[port] = _Engine.scrapes.get(port, 0) + 1
        _Engine.last_scrape[port] = time.time()
        n = _Engine.scrapes.get(port, 0)
        # as vLLM and SGLang export it (prometheus_client): the engines started inside every range read
        # here, so their first scrape's counts are the range's (see test_counter_booking.py)
        lines = [f"process_start_time_seconds {_Engine.started}"]
        if port == _Engine.ports[3]:   # vLLM D: the one that goes down (its counters never freeze)
            lines += [f'vllm_prefix_cache_hits_total{{engine="0",model_name="tiny"}} {STEP["hits_a"] * n}',
                      f'vllm_prefix_cache_queries_total{{engine="0",model_name="tiny"}} {STEP["queries"] * n}']
        elif port == _Engine.ports[0]:   # vLLM A, escaped names, plus the colon twin of one series
            lines += [f'vllm_prefix_cache_hits_total{{engine="0",model_name="tiny"}} {STEP["hits_a"] * n}',
                      f'vllm_prefix_cache_queries_total{{engine="0",model_name="tiny"}} {STEP["queries"] * n}',
                      f'vllm:prefix_cache_queries_total{{engine="0",model_name="tiny"}} {STEP["queries"] * n}',
                      f'vllm:prefix_cache_hits_total{{engine="0",model_name="tiny"}} {STEP["hits_a"] * n}',
                      'vllm_kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25']
        elif port == _Engine.ports[1]:  # vLLM B, escaped names only
            lines += [f'vllm_prefix_cache_hits_total{{engine="0",model_name="tiny"}} {STEP["hits_b"] * n}',
                      f'vllm_prefix_cache_queries_total{{engine="0",model_name="tiny"}} {STEP["queries"] * n}',
                      f'vllm_prompt_tokens_cached_by_source_total{{engine="0",model_name="tiny",source="device"}} '
                      f'{STEP["hits_b"] * n}']
        else:                            # SGLang, colon names
            lines += [f'sglang:cached_tokens_total{{model_name="qwen",cache_source="device"}} {STEP["sg_device"] * n}',
                      f'sglang:cached_tokens_total{{model_name="qwen",cache_source="host"}} {STEP["sg_host"] * n}',
                      f'sglang:prompt_tokens_total{{model_name="qwen"}} {STEP["sg_prompt"] * n}',
                      'sglang:token_usage{model_name="qwen"} 0.5']
        return ("\n".join(lines) + "\n").encode()


@pytest.fixture(scope="module")
def engines_prom(tmp_path_factory):
    prom_bin = need_binary("prometheus")
    tmp = tmp_path_factory.mktemp("engine-src")
    _Engine.started = time.time()
    servers = [HTTPServer(("127.0.0.1", free_port()), _Engine) for _ in range(4)]
    _Engine.ports = [s.server_port for s in servers]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    port = free_port()
    targets = ", ".join(f"'127.0.0.1:{s.server_port}'" for s in servers)
    (tmp / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: engines\n    static_configs: [{{targets: [{targets}]}}]\n")
    prom = __import__("subprocess").Popen(
        [prom_bin, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=__import__("subprocess").DEVNULL, stderr=__import__("subprocess").DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: urllib.request.urlopen(url + "/-/ready", timeout=2).status == 200, 60, "prometheus")
        t0 = time.time()
        time.sleep(8)
        yield url, t0, servers
    finally:
        prom.terminate()
        prom.wait(10)
        for s in servers:
            if s.server_port != _Engine.ports[3] or not _D_DOWN:
                s.shutdown()
            s.server_close()


def test_engine_kind_from_either_name_form():
    assert [engine_kind(n) for n in ("vllm:x", "vllm_x", "sglang:y", "lmcache_num_hit_tokens", "foo")] == \
        ["vllm", "vllm", "sglang", "lmcache", "other"]


@pytest.mark.prometheus
def test_engine_frames_from_escaped_and_colon_names(engines_prom):
    from warmscope.app.dashboard.engine_view import hit_table

    url, t0, servers = engines_prom
    _Engine.frozen = True
    time.sleep(3)        # the last scrapes are in: every later scrape repeats the same values
    src = PrometheusSource(url, scrape_interval=1)
    end = time.time()
    pre = src.engine_frame("engine_prefix", t0 - 60, end)
    a, b, s, d = (f"127.0.0.1:{p}" for p in _Engine.ports)
    assert set(pre.instance) == {a, b, s, d}
    t = hit_table(pre, by=["instance", "engine_kind", "model"]).set_index("instance")
    # per scrape: 62/100 (A), 35/100 (B), (45+15)/100 (SGLang): every total is a whole number of scrapes
    assert t.loc[a, "hit_rate"] == pytest.approx(0.62) and t.loc[a, "queries"] % 100 == 0
    assert t.loc[b, "hit_rate"] == pytest.approx(0.35) and t.loc[b, "queries"] % 100 == 0
    assert t.loc[s, "hit_rate"] == pytest.approx(0.60) and t.loc[s, "engine_kind"] == "sglang"
    assert (t.loc[a, "engine_kind"], t.loc[a, "model"]) == ("vllm", "tiny")
    # A exports each counter under both names: counted once (hits/queries per scrape stay 62/100, not 124/200)
    scrapes_a = t.loc[a, "queries"] / 100
    assert t.loc[a, "hits"] == 62 * scrapes_a
    # the mix of A and B is not the mean of their ratios unless their tokens are equal: token-weighted
    both = hit_table(pre[pre.instance.isin([a, b])])
    assert both.hit_rate.iloc[0] == pytest.approx((t.loc[a, "hits"] + t.loc[b, "hits"])
                                                  / (t.loc[a, "queries"] + t.loc[b, "queries"]))
    src_df = src.engine_frame("engine_cached_by_source", t0 - 60, end)
    by = src_df.groupby(["instance", "source"]).tokens.sum()
    assert by[(s, "device")] / (by[(s, "device")] + by[(s, "host")]) == pytest.approx(0.75)   # 45 / 60
    assert by[(b, "device")] == t.loc[b, "hits"]
    kv = src.engine_frame("engine_kv_usage", t0 - 60, end)
    assert kv.groupby("instance").usage.max().to_dict() == {a: 0.25, s: 0.5}
    assert src.engine_frame("engine_ttft", t0 - 60, end).empty      # no histogram exported


@pytest.mark.prometheus
def test_a_target_that_went_down_keeps_its_last_counts(engines_prom):
    """Prometheus marks a target's series stale at its first failed scrape; a plain
    selector then stops seeing them, and the counts between the last point that
    saw them and the failure would be lost (up to one step)."""
    url, t0, servers = engines_prom
    port = _Engine.ports[3]
    d = f"127.0.0.1:{port}"
    server = servers[3]
    wait_until(lambda: _Engine.scrapes.get(port, 0) >= 12, 30, "a dozen scrapes of D")
    server.shutdown()               # serves no more scrapes: the next one is refused
    server.socket.close()
    _D_DOWN.append(True)
    served, last = _Engine.scrapes[port], _Engine.last_scrape[port]
    # the step is 15 s: ending 7.5 s after the last scrape, the point before it
    # (7.5 s before) misses about seven scrapes' counts unless the tail is kept
    wait_until(lambda: time.time() > last + 7.5, 20, "a few failed scrapes")
    assert not prom_query(url, f'vllm_prefix_cache_queries_total{{instance="{d}"}}')   # stale now
    src = PrometheusSource(url, scrape_interval=1)
    pre = src.engine_frame("engine_prefix", t0 - 60, last + 7.5)
    got = pre[pre.instance == d][["hits", "queries"]].sum()
    # every scrape served was 62 hit and 100 queried tokens
    assert (got.queries, got.hits) == (100 * served, 62 * served)
