"""Long-term metrics on a PromQL store: a real Prometheus scrapes the collectors
while the simulator runs in real time, evaluates warmscope's recording rules and
remote-writes everything to a real VictoriaMetrics; the app's Prometheus source
pointed at VictoriaMetrics gives the same frames as pointed at Prometheus."""

from __future__ import annotations

import json
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from warmscope.sources.prometheus import PrometheusSource

from tests.conftest import free_port, need_binary, prom_query, wait_until
from tests.production.conftest import live_simulation

pytestmark = pytest.mark.prometheus

ROOT = Path(__file__).resolve().parents[2]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    vm_bin = need_binary("victoria-metrics")
    tmp = tmp_path_factory.mktemp("vm")
    vm_port = free_port()
    vm_url = f"http://127.0.0.1:{vm_port}"
    rules = tmp / "rules"
    rules.mkdir()
    (rules / "warmscope.rules.yml").write_text((ROOT / "rules" / "warmscope.rules.yml").read_text())
    # serve the newest samples within a second (by default range queries hold back the last 30 s)
    vm = subprocess.Popen([vm_bin, f"-storageDataPath={tmp / 'vmdata'}", f"-httpListenAddr=127.0.0.1:{vm_port}",
                           "-retentionPeriod=1", "-search.latencyOffset=1s", "-search.maxStepForPointsAdjustment=1ms",
                           "-search.disableCache"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: urllib.request.urlopen(vm_url + "/health", timeout=2).status == 200, 60, "victoria-metrics")
        extra = (f"rule_files: ['{rules}/*.yml']\n"
                 "remote_write:\n"
                 f"  - url: {vm_url}/api/v1/write\n"
                 "    queue_config: {batch_send_deadline: 1s, min_backoff: 100ms, max_backoff: 1s}\n")
        with live_simulation(tmp, extra) as (prom_url, store, t0, t1):
            q = "sum(warmscope_cache_lookups_total)"

            def caught_up() -> bool:  # VictoriaMetrics holds what Prometheus holds
                a, b = prom_query(prom_url, q), prom_query(vm_url, q)
                return bool(a and b) and float(a[0]["value"][1]) == float(b[0]["value"][1])

            wait_until(caught_up, 60, "remote write to catch up")

            def range_caught_up() -> bool:  # and serves it in range queries up to t1
                a = PrometheusSource(prom_url).frame("lookups", t0 - 30, t1)["count"].sum()
                b = PrometheusSource(vm_url).frame("lookups", t0 - 30, t1)["count"].sum()
                return a == b > 0

            wait_until(range_caught_up, 90, "range queries to see the newest samples")
            yield prom_url, vm_url, store, t0, t1
    finally:
        vm.terminate()
        vm.wait(15)


def test_victoria_metrics_serves_the_same_frames_as_prometheus(stack):
    prom_url, vm_url, store, t0, t1 = stack
    from_prom = PrometheusSource(prom_url).frame("lookups", t0 - 30, t1)
    from_vm = PrometheusSource(vm_url).frame("lookups", t0 - 30, t1)
    assert len(from_prom) > 0
    keys = ["layer", "result"]
    a = from_prom.groupby(keys)["count"].sum()
    b = from_vm.groupby(keys)["count"].sum()
    assert a.index.equals(b.index) and (a == b).all(), (a, b)
    # and both agree with the store within one scrape interval of traffic (1 s)
    lk = store.frame("lookups")
    rate = lk.groupby("layer")["count"].sum() / max(lk.ts.max() - lk.ts.min(), 1)
    for layer, n in lk.groupby("layer")["count"].sum().items():
        got = from_vm[from_vm.layer == layer]["count"].sum()
        assert abs(got - n) <= 2 * rate[layer] + 1, (layer, got, n)
    req_p = PrometheusSource(prom_url).frame("requests", t0 - 30, t1)
    req_v = PrometheusSource(vm_url).frame("requests", t0 - 30, t1)
    assert req_p["requests"].sum() == req_v["requests"].sum() > 0


def test_recorded_rules_reach_the_long_term_store(stack):
    prom_url, vm_url, *_ = stack
    name = "warmscope:layer_hit_ratio:rate5m"
    wait_until(lambda: bool(prom_query(vm_url, name)), 30, f"{name} in VictoriaMetrics")
    from_prom = {r["metric"].get("warmscope_cache_layer"): float(r["value"][1]) for r in prom_query(prom_url, name)}
    from_vm = {r["metric"].get("warmscope_cache_layer"): float(r["value"][1]) for r in prom_query(vm_url, name)}
    assert set(from_vm) == set(from_prom) and from_vm
    for layer, v in from_vm.items():  # rule evaluations one interval apart at most
        assert 0.0 <= v <= 1.0 and abs(v - from_prom[layer]) < 0.1, (layer, v, from_prom[layer])

