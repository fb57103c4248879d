"""The Advisor page on a gateway's recording (an engine's prefix cache only): it gives the same
warm-set size and lead time as `warmscope advise`, instead of refusing the store for having one
layer and minutes of traffic."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from streamlit.testing.v1 import AppTest
from warmscope.collectors.gateway import make_app, serve

from tests.collectors.llm_upstream import make_upstream

pytestmark = pytest.mark.slow  # a recording through the gateway, then the page twice: ~40 s

MAIN = str(Path(__file__).resolve().parents[2] / "app" / "dashboard" / "main.py")
# three tenants, six system prompts each, read 8, 5, 3, 2, 2 and 2 times: every prefix is read at
# least twice, so each is a hot key (a prefix read once in a hot-key window is not one)
READS = (8, 5, 3, 2, 2, 2)
TENANTS = ("acme", "globex", "initech")
SLO = ("--objective", "slo", "--slo-ttft-s", "0.02", "--slo-penalty", "0.01")


def _system(tenant: str, j: int) -> str:
    # ~800 characters: 200 tokens at the upstream's 4 characters a token, 192 of them cacheable
    return f"You are {tenant}'s assistant number {j}. " + "Answer briefly and politely. " * 27


@pytest.fixture(scope="module")
def gateway_store(tmp_path_factory):
    from warmscope.collectors import Telemetry
    from warmscope.collectors.config import CollectorConfig

    path = tmp_path_factory.mktemp("prefix") / "gateway.sqlite"
    cfg = CollectorConfig.load(
        env={}, store_path=str(path), key_secret="s", exporter="embedded", replica="a-0"
    )
    tel = Telemetry(cfg, background=False)
    # the upstream waits 0.1 ms per prompt token it did not cache, as a prefill does
    with serve(make_upstream(prefill_s_per_token=1e-4)) as up:
        app = make_app(up, telemetry=tel, experiment="prefix", variant="A")
        with serve(app) as gw, httpx.Client(base_url=gw, timeout=30) as http:
            n = 0
            for rnd in range(max(READS)):
                for t in TENANTS:
                    for j, reads in enumerate(READS):
                        if rnd >= reads:
                            continue
                        n += 1
                        msgs = [
                            {"role": "system", "content": _system(t, j)},
                            {"role": "user", "content": f"question {n}"},
                        ]
                        r = http.post(
                            "/v1/chat/completions",
                            json={"model": "tiny", "messages": msgs, "stream": True},
                            headers={"x-warmscope-tenant": t, "x-warmscope-session": f"s{n}"},
                        )
                        assert r.status_code == 200
    tel.flush()
    tel.close()
    return path


def _cli(path: Path, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "warmscope.app.cli", "--store", str(path), "advise", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_page_recommends_what_the_cli_recommends(gateway_store, monkeypatch):
    cli = _cli(gateway_store, *SLO, "--json", "-")
    # 3 tenants x 6 prefixes recorded; the SLO prices a missed prefix above its prefill cost
    assert cli["keys"] == 18 and 0 < cli["warm_keys"] <= 18, cli
    monkeypatch.setenv("WARMSCOPE_STORE", str(gateway_store))
    at = AppTest.from_file(MAIN, default_timeout=180).run()
    at.switch_page("entries/advisor.py").run()
    assert not at.exception, at.exception
    text = " ".join(i.value for i in at.info)
    assert "one cache layer, an engine's prefix cache" in text
    assert "at least 2 hours" not in text  # not refused for its short span
    at.selectbox(key="adv_prefix_objective").set_value("SLO").run()
    at.number_input(key="adv_prefix_slo").set_value(0.02).run()
    at.number_input(key="adv_prefix_penalty").set_value(0.01).run()
    assert not at.exception, at.exception
    got = {m.label: m.value for m in at.metric}
    assert "Warm set (prefixes)" in got, [w.value for w in at.warning]
    assert got["Warm set (prefixes)"] == f"{cli['warm_keys']} of 18", got
    assert got["Lead time"] == f"{cli['lead_s']:.1f} s", got
    assert not [w.value for w in at.warning], [w.value for w in at.warning]


def test_without_a_price_for_latency_the_page_says_what_is_missing(gateway_store, monkeypatch):
    monkeypatch.setenv("WARMSCOPE_STORE", str(gateway_store))
    at = AppTest.from_file(MAIN, default_timeout=180).run()
    at.switch_page("entries/advisor.py").run()
    at.selectbox(key="adv_prefix_objective").set_value("value").run()
    assert not at.exception, at.exception
    warn = [w.value for w in at.warning]
    # no A/B unit records a conversion: one sentence, no recommendation
    assert len(warn) == 1 and warn[0].startswith("No recommendation. No conversion data"), warn
    assert "Warm set (prefixes)" not in {m.label for m in at.metric}
