"""Issue 30 item 10: bad input to the CLI and the collectors gets one clear line."""

from __future__ import annotations

import subprocess
import sys

import pytest
from warmscope.app.cli.main import main
from warmscope.collectors.store import EmbeddedStore, StoreError


@pytest.fixture
def captured_sim(monkeypatch):
    import warmscope.simulator as sim

    got = []

    def fake(cfg, path, faults, **kw):
        got.append(cfg)
        raise SystemExit(0)  # stop before any work: only the configuration is checked

    monkeypatch.setattr(sim, "simulate", fake)
    return got


@pytest.mark.parametrize("value, expect", [
    ("30", 30),
    ("0", "simulator.tenants must be > 0 and <= 676, got 0"),
    ('"eight"', "simulator.tenants must be a whole number, got 'eight'"),
])
def test_simulator_tenants_in_the_toml_are_honoured_or_rejected(tmp_path, monkeypatch, capsys, captured_sim,
                                                                value, expect):
    toml = tmp_path / "w.toml"
    toml.write_text(f"[simulator]\ntenants = {value}\nhours = 3\n")
    monkeypatch.setenv("WARMSCOPE_CONFIG", str(toml))
    argv = ["--store", str(tmp_path / "s.sqlite"), "simulate"]
    if isinstance(expect, int):
        with pytest.raises(SystemExit):
            main(argv)
        assert (captured_sim[0].tenants, captured_sim[0].hours) == (30, 3.0)
        with pytest.raises(SystemExit):
            main(argv + ["--tenants", "5"])       # a flag given still wins over the file
        assert captured_sim[1].tenants == 5
    else:
        assert main(argv) == 2 and not captured_sim
        err = capsys.readouterr().err
        assert expect in err and len(err.strip().splitlines()) == 1


def test_dashboard_on_an_impossible_address_is_one_line(tmp_path):
    p = subprocess.run([sys.executable, "-m", "warmscope.app.cli", "--store", str(tmp_path / "s.sqlite"),
                        "dashboard", "--address", "999.1.1.1", "--port", "8599"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().startswith("warmscope dashboard: cannot listen on 999.1.1.1:8599")
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_a_store_path_that_is_a_directory_says_so(tmp_path, capsys):
    for readonly in (True, False):
        with pytest.raises(StoreError, match="is a directory"):
            EmbeddedStore(tmp_path, readonly=readonly)
    assert main(["--store", str(tmp_path), "report", "ab"]) != 0
    err = capsys.readouterr().err
    assert "is a directory" in err and "disk I/O" not in err


@pytest.mark.parametrize("exporter", ["otlp", "prometheus"])
def test_no_second_shutdown_message_at_exit(tmp_path, exporter):
    code = ("from warmscope import collectors\n"
            f"collectors.setup(exporter={exporter!r}, store_path={str(tmp_path / 's.sqlite')!r}, "
            "key_secret='x', prometheus_port=0, otlp_endpoint='http://127.0.0.1:9', close_timeout_s=2,"
            " export_timeout_s=1)\n"
            "print('up')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert p.returncode == 0 and "up" in p.stdout
    assert "shutdown can only be called once" not in p.stderr + p.stdout
