"""One definition per alert condition: the shipped rules are the ones
analysis/alert_defs.py writes, and the evaluator and Prometheus (promtool)
raise the same alerts on the same data."""

import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml
from warmscope.analysis import alert_defs
from warmscope.analysis.alerts import evaluate

from tests.conftest import need_binary

RULES = Path(__file__).resolve().parents[2] / "rules"
MIN = 60.0


def test_shipped_alert_rules_are_generated_from_the_definitions():
    assert (RULES / "warmscope.alerts.yml").read_text() == alert_defs.render_rules()
    rules = {r["alert"]: r for g in yaml.safe_load(alert_defs.render_rules())["groups"] for r in g["rules"]}
    assert {a.rule for a in alert_defs.ALERTS} == set(rules)
    assert rules["WarmscopeCrossTenantCacheRead"]["for"] == "0s"
    assert rules["WarmscopeCrossTenantCacheRead"]["labels"]["severity"] == "critical"
    # The hit-rate threshold is the evaluator's: a 20 % relative fall.
    expr = rules["WarmscopeHitRateRegressionShortTerm"]["expr"]
    assert "< 0.8 * (warmscope:layer_hit_ratio:rate5m offset 1h)" in expr


def _promtool(tmp_path: Path, tests: list[dict]) -> subprocess.CompletedProcess:
    promtool = need_binary("promtool")
    spec = {"rule_files": [str(RULES / "warmscope.rules.yml"), str(RULES / "warmscope.alerts.yml")],
            "evaluation_interval": "1m", "tests": tests}
    f = tmp_path / "agree.test.yml"
    f.write_text(yaml.safe_dump(spec, sort_keys=False))
    return subprocess.run([promtool, "test", "rules", str(f)], capture_output=True, text=True)


def _lookups(rate0: float, rate1: float, n: int = 100, before_min: int = 80, after_min: int = 40) -> pd.DataFrame:
    """Per-minute hits and misses of one layer: rate0 for ``before_min`` minutes, then rate1."""
    rows = []
    for m in range(before_min + after_min):
        r = rate0 if m < before_min else rate1
        ts = (m + 1) * MIN
        rows += [(ts, "prefix_kv", "hit", n * r), (ts, "prefix_kv", "miss", n * (1 - r))]
    return pd.DataFrame(rows, columns=["ts", "layer", "result", "count"])


def _counter_values(lk: pd.DataFrame, result: str) -> str:
    per_min = lk[lk.result == result]["count"].tolist()
    total, vals = 0.0, ["0"]
    for x in per_min:
        total += x
        vals.append(f"{total:g}")
    return " ".join(vals)


@pytest.mark.parametrize("fall", [0.0, 0.10, 0.15, 0.25, 0.40, 0.60])
@pytest.mark.prometheus
def test_hit_rate_regression_fires_on_both_sides_or_on_neither(tmp_path, fall):
    # 80 minutes at 80 % hit rate, then 40 minutes at 80 % × (1 − fall), 100 lookups a minute.
    lk = _lookups(0.8, 0.8 * (1 - fall))
    py = evaluate({"lookups": lk}, 0.0, 120 * MIN)
    py_fires = "HitRateRegression" in set(py.alert)
    assert py_fires == (fall >= alert_defs.HIT_RATE_DROP)  # the definition's threshold, on the evaluator's side
    now = 0.8 * (1 - fall)
    exp = [{"exp_labels": {"severity": "warning", "warmscope_cache_layer": "prefix_kv"},
            "exp_annotations": {"summary": "Hit rate of layer prefix_kv fell 20% within the hour",
                                "description": f"Now {now * 100:.4g}%.",
                                "runbook_url": "docs/runbooks.md#hit-rate-regression"}}] if py_fires else []
    series = [{"series": f'warmscope_cache_lookups_total{{warmscope_cache_layer="prefix_kv",'
                         f'warmscope_cache_result="{res}"}}', "values": _counter_values(lk, res)}
              for res in ("hit", "miss")]
    # At the range's end Prometheus compares the last 5 minutes with an hour before (the latest third vs
    # the third before it, for the evaluator); the fall has held 40 minutes, past the rule's `for`.
    out = _promtool(tmp_path, [{"name": f"fall {fall}", "interval": "1m", "input_series": series,
                                "alert_rule_test": [{"eval_time": "120m",
                                                     "alertname": "WarmscopeHitRateRegressionShortTerm",
                                                     "exp_alerts": exp}]}])
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("leak", [False, True])
@pytest.mark.prometheus
def test_cross_tenant_read_fires_on_both_sides_or_on_neither(tmp_path, leak):
    # Hot-key windows of 15 minutes; with a leak, one response key is read by acme and globex at 00:30.
    rows = [(1800.0, "acme", "response", "k1", "resp:*", 3, 0, 0),
            (1800.0, "globex", "response", "k1" if leak else "k2", "resp:*", 1, 0, 0)]
    hk = pd.DataFrame(rows, columns=["window", "tenant", "layer", "key_hash", "family", "hits", "misses", "err"])
    py = evaluate({"hot_keys": hk}, 0.0, 3600.0)
    py_fires = "CrossTenantCacheRead" in set(py.alert)
    assert py_fires == leak
    if py_fires:
        assert py[py.alert == "CrossTenantCacheRead"].severity.iloc[0] == "critical"
    # The collectors count the same shared key in warmscope_cache_cross_tenant_keys_total.
    values = "0x30 1x30" if leak else "0x60"
    exp = [{"exp_labels": {"severity": "critical", "warmscope_cache_layer": "response"},
            "exp_annotations": {
                "summary": "SECURITY: cache keys in response are read by more than one tenant",
                "description": "Keys read by two or more tenants appeared in the last hour: keys lack a tenant "
                               "scope (data leak).",
                "runbook_url": "docs/runbooks.md#cross-tenant-cache-read"}}] if py_fires else []
    out = _promtool(tmp_path, [{"name": f"leak {leak}", "interval": "1m", "input_series": [
        {"series": 'warmscope_cache_cross_tenant_keys_total{warmscope_cache_layer="response"}', "values": values}],
        "alert_rule_test": [{"eval_time": "31m", "alertname": "WarmscopeCrossTenantCacheRead", "exp_alerts": exp},
                            {"eval_time": "59m", "alertname": "WarmscopeCrossTenantCacheRead", "exp_alerts": exp}]}])
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("share", [0.03, 0.20])
@pytest.mark.prometheus
def test_bypass_spike_fires_on_both_sides_or_on_neither(tmp_path, share):
    # 100 lookups a minute, 1 % bypassing for 80 minutes, then ``share`` for 20 minutes.
    rows = []
    for m in range(100):
        b = 1 if m < 80 else round(100 * share)
        rows += [((m + 1) * MIN, "response", "bypass", b), ((m + 1) * MIN, "response", "miss", 100 - b)]
    lk = pd.DataFrame(rows, columns=["ts", "layer", "result", "count"])
    py = evaluate({"lookups": lk}, 0.0, 100 * MIN)
    py_fires = "CacheBypassSpike" in set(py.alert)
    assert py_fires == (share > alert_defs.BYPASS_SHARE)
    exp = [{"exp_labels": {"severity": "warning", "warmscope_cache_layer": "response"},
            "exp_annotations": {"summary": f"{share * 100:.4g}% of response lookups bypass the cache",
                                "description": "A middleware path (cache-control: no-cache, skip flags) started "
                                               "skipping the cache.",
                                "runbook_url": "docs/runbooks.md#bypass-spike"}}] if py_fires else []
    series = [{"series": f'warmscope_cache_lookups_total{{warmscope_cache_layer="response",'
                         f'warmscope_cache_result="{res}"}}', "values": _counter_values(lk, res)}
              for res in ("bypass", "miss")]
    out = _promtool(tmp_path, [{"name": f"bypass {share}", "interval": "1m", "input_series": series,
                                "alert_rule_test": [{"eval_time": "100m", "alertname": "WarmscopeBypassSpike",
                                                     "exp_alerts": exp}]}])
    assert out.returncode == 0, out.stdout + out.stderr


def test_engine_alert_rules_are_generated_from_the_definitions():
    # rules/engines.alerts.yml is written from ENGINE_ALERTS (engine metrics have no evaluator here); its
    # hit-rate conditions use the definitions' fall, its SLO the bucket engines.rules.yml counts misses above.
    assert (RULES / "engines.alerts.yml").read_text() == alert_defs.render_engine_rules()
    rules = {r["alert"]: r for g in yaml.safe_load((RULES / "engines.alerts.yml").read_text())["groups"]
             for r in g["rules"]}
    assert set(rules) == {a.rule for a in alert_defs.ENGINE_ALERTS}
    hit = [r for r in rules.values() if "HitRateRegression" in r["alert"]]
    assert len(hit) == 2
    for r in hit:
        assert f"< {1 - alert_defs.HIT_RATE_DROP:g} * (warmscope:engine_prefix_hit_ratio:rate5m offset" in r["expr"]
        assert f"{alert_defs.HIT_RATE_DROP:.0%}" in r["annotations"]["summary"]
    assert "> 0.95" in rules["WarmscopeEngineKVCacheSaturated"]["expr"]  # ENGINE_KV_SATURATED
    burn = rules["WarmscopeEngineTTFTSLOBurn"]
    # 14.4 × (1 − 0.99) = 0.144 of requests over the bound, on both windows
    assert burn["expr"].count("> 14.4 * 0.01") == 2 and burn["labels"]["severity"] == "critical"
    assert "over 1 s" in burn["annotations"]["description"]
    recording = (RULES / "engines.rules.yml").read_text()
    bound = f"{alert_defs.ENGINE_TTFT_SLO_S:g}"  # "1": the miss ratio counts requests above le="1" / le="1.0"
    assert f'le=~"{bound}(\\\\.0)?"' in recording
