"""Engine alerts: structure, absolute runbook links to anchors that exist, fire
and quiet promtool tests (escaped names among the inputs), and `warmscope rules`
moving the links to another base without breaking the files."""

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from warmscope.app.cli.main import main
from warmscope.app.cli.rules import DEFAULT_RUNBOOK_BASE, render

from tests.conftest import need_binary

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "rules"
ANCHORS = set(re.findall(r"^## (\S+)", (ROOT / "docs" / "runbooks.md").read_text(), re.M))


def _alerts(path: Path) -> list[dict]:
    return [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"] if "alert" in r]


@pytest.mark.prometheus
def test_engine_alerts_have_absolute_runbooks_and_fire_and_quiet_tests_with_escaped_input():
    alerts = _alerts(RULES / "engines.alerts.yml")
    tests = yaml.safe_load((RULES / "tests" / "engines_alerts.test.yml").read_text())["tests"]
    assert {a["alert"] for a in alerts} == {"WarmscopeEngineHitRateRegressionShortTerm",
                                            "WarmscopeEngineHitRateRegressionDaily",
                                            "WarmscopeEngineKVCacheSaturated", "WarmscopeEngineTTFTSLOBurn"}
    for a in alerts:
        assert a.get("for") and a["labels"]["severity"] in ("warning", "critical")
        url = a["annotations"]["runbook_url"]
        assert url.startswith(DEFAULT_RUNBOOK_BASE + "#") and url.split("#")[1] in ANCHORS, url
        short = a["alert"].removeprefix("Warmscope")
        fires = [t for t in tests if t["name"].startswith(f"{short} fires when")]
        quiet = [t for t in tests if t["name"].startswith(f"{short} does not fire when")]
        assert fires and quiet, short
        assert all(any(c.get("exp_alerts") for c in t["alert_rule_test"]) for t in fires)
        assert all(not c.get("exp_alerts") for t in quiet for c in t["alert_rule_test"])
        # every fire test feeds escaped names (Prometheus 2.x scraping OpenMetrics)
        assert all(any(re.match(r"^(vllm|sglang|lmcache)_", s["series"]) for s in t["input_series"]) for t in fires)


@pytest.mark.prometheus
def test_rules_command_moves_runbook_links_to_another_base(tmp_path, capsys):
    promtool = need_binary("promtool")
    assert main(["rules", "--runbook-base", "https://wiki.example.org/ops/runbooks", "--out", str(tmp_path)]) == 0
    files = sorted(tmp_path.glob("*.yml"))
    assert {f.name for f in files} == {p.name for p in RULES.glob("*.yml")}
    urls = [a["annotations"]["runbook_url"] for f in files for a in _alerts(f)]
    assert len(urls) == len([a for p in RULES.glob("*.yml") for a in _alerts(p)]) > 4
    for u in urls:
        base, anchor = u.split("#")
        assert base == "https://wiki.example.org/ops/runbooks" and anchor in ANCHORS, u
    out = subprocess.run([promtool, "check", "rules", *map(str, files)], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.count("SUCCESS") == len(files), out.stdout + out.stderr
    assert render('runbook_url: "docs/runbooks.md#x"', "https://h/r.md/") == 'runbook_url: "https://h/r.md#x"'
    assert main(["rules", "--runbook-base", "wiki page", "--out", str(tmp_path)]) == 2
    assert "absolute http(s) URL" in capsys.readouterr().err
