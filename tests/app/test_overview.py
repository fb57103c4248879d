import pytest
from streamlit.testing.v1 import AppTest

from collectors import EmbeddedStore
from simulator import SimConfig, simulate

from pathlib import Path

MAIN = str(Path(__file__).resolve().parents[2] / "app" / "main.py")


@pytest.fixture
def demo_store(tmp_path, monkeypatch):
    path = tmp_path / "demo.sqlite"
    simulate(SimConfig.load(hours=0.5, rps=3.0, tenants=3), path, workers=1)
    monkeypatch.setenv("WARMSCOPE_STORE", str(path))
    return path


def test_overview_headline_equals_the_store(demo_store):
    at = AppTest.from_file(MAIN, default_timeout=60).run()
    assert not at.exception
    df = EmbeddedStore(demo_store).frame("lookups")
    hm = df[df.result.isin(["hit", "miss"])]
    rate = hm.loc[hm.result == "hit", "count"].sum() / hm["count"].sum()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Lookups"] == f"{hm['count'].sum():,}"
    assert metrics["Hit rate"] == f"{rate:.1%}"


def test_missing_store_shows_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("WARMSCOPE_STORE", str(tmp_path / "none.sqlite"))
    at = AppTest.from_file(MAIN, default_timeout=60).run()
    assert not at.exception
    assert "warmscope simulate" in at.error[0].value or "warmscope demo" in at.error[0].value


def test_empty_store_says_no_data(tmp_path, monkeypatch):
    path = tmp_path / "empty.sqlite"
    EmbeddedStore(path).close()
    monkeypatch.setenv("WARMSCOPE_STORE", str(path))
    at = AppTest.from_file(MAIN, default_timeout=60).run()
    assert not at.exception
    assert "No lookups recorded yet" in at.info[0].value


def test_cli_demo_fills_an_empty_store_once(tmp_path):
    from app import cli

    path = tmp_path / "cli.sqlite"
    assert cli.main(["--store", str(path), "demo", "--no-dashboard", "--hours", "0.25"]) == 0
    n = EmbeddedStore(path).counts()["lookups"]
    assert n > 0
    assert cli.main(["--store", str(path), "demo", "--no-dashboard", "--hours", "0.25"]) == 0
    assert EmbeddedStore(path).counts()["lookups"] == n
