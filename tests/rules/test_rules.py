"""Recording and alerting rules: promtool check and promtool unit tests, and
every alert's runbook anchor exists."""

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import need_binary

RULES = Path(__file__).resolve().parents[2] / "rules"
DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.prometheus
def test_promtool_checks_the_rule_files():
    promtool = need_binary("promtool")
    files = sorted(str(p) for p in RULES.glob("*.yml"))
    out = subprocess.run([promtool, "check", "rules", *files], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("SUCCESS") == len(files)


@pytest.mark.prometheus
def test_promtool_unit_tests_pass():
    promtool = need_binary("promtool")
    tests = sorted(str(p.name) for p in (RULES / "tests").glob("*.test.yml"))
    out = subprocess.run([promtool, "test", "rules", *tests], cwd=RULES / "tests", capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("SUCCESS") == len(tests)


def test_every_alert_has_for_severity_runbook_and_a_fire_and_quiet_test():
    alerts = [r for g in yaml.safe_load((RULES / "warmscope.alerts.yml").read_text())["groups"] for r in g["rules"]]
    tests = yaml.safe_load((RULES / "tests" / "alerts.test.yml").read_text())["tests"]
    runbooks = (DOCS / "runbooks.md").read_text()
    anchors = set(re.findall(r"^## (\S+)", runbooks, re.M))
    assert len(alerts) == 10  # 8, TokenUsageUnmeasured, KVEvictedShareHigh
    for a in alerts:
        assert a.get("for") and a["labels"]["severity"] in ("warning", "critical")
        assert {"summary", "description", "runbook_url"} <= set(a["annotations"])
        assert a["annotations"]["runbook_url"].split("#")[1] in anchors
        short = a["alert"].removeprefix("Warmscope")
        fires = [t for t in tests if t["name"].startswith(f"{short} fires when")]
        quiet = [t for t in tests if t["name"].startswith(f"{short} does not fire when")]
        assert fires and quiet, short
        assert any(c.get("exp_alerts") for t in fires for c in t["alert_rule_test"])
        assert all(not c.get("exp_alerts") for t in quiet for c in t["alert_rule_test"])
