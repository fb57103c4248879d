"""The CLI around the dashboard: `report ab` validates what it is given and lists what exists, `demo`
stops everything it started on SIGINT/SIGTERM, every option has help text, and the demo world puts its
runs and traps in the dashboard's default range."""

import argparse
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from warmscope.app.cli.main import demo_world
from warmscope.app.cli.main import main as cli_main
from warmscope.simulator import SimConfig

from tests.conftest import free_port, simulated_store, wait_until


@pytest.fixture(scope="module")
def ab_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "ab.sqlite"
    simulated_store(path, SimConfig.load(hours=0.5, rps=3.0, tenants=3, seed=4), [], workers=1)
    return path


def run(capsys, *argv):
    rc = cli_main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_report_ab_unknown_experiment_lists_the_known_ones(ab_store, tmp_path, capsys):
    rc, _, err = run(capsys, "--store", str(ab_store), "report", "ab", "--experiment", "nope",
                     "--out", str(tmp_path / "r.html"))
    assert rc == 2
    assert "no experiment 'nope'" in err and "known: warmup-strategy" in err
    assert "Traceback" not in err
    assert not (tmp_path / "r.html").exists()


def test_report_ab_unknown_variant_is_refused(ab_store, tmp_path, capsys):
    rc, out, err = run(capsys, "--store", str(ab_store), "report", "ab", "--treatment", "C",
                       "--out", str(tmp_path / "r.html"))
    assert rc == 2
    assert "--treatment 'C' is not a variant of 'warmup-strategy'; variants: A, B" in err
    assert out == ""  # no ratio-mismatch verdict printed for an arm that does not exist


def test_report_ab_unknown_primary_lists_the_metrics(ab_store, tmp_path, capsys):
    rc, _, err = run(capsys, "--store", str(ab_store), "report", "ab", "--primary", "hit rate",
                     "--out", str(tmp_path / "r.html"))
    assert rc == 2
    assert "--primary 'hit rate' is not a metric of this report" in err
    assert "'hit rate (prefix_kv)'" in err  # the valid names are listed
    assert not (tmp_path / "r.html").exists()


def test_report_ab_valid_primary_is_used(ab_store, tmp_path, capsys):
    rc, out, _ = run(capsys, "--store", str(ab_store), "report", "ab", "--primary", "hit rate (prefix_kv)",
                     "--out", str(tmp_path / "r.html"))
    assert rc == 0
    assert "hit rate (prefix_kv)" in out  # the verdict is about the chosen metric, not latency
    assert (tmp_path / "r.html").exists() and (tmp_path / "r.md").exists()


def test_report_ab_missing_store(tmp_path, capsys):
    rc, _, err = run(capsys, "--store", str(tmp_path / "none.sqlite"), "report", "ab")
    assert rc == 2 and "does not exist" in err and "--store" in err


def _parsers(p: argparse.ArgumentParser):
    yield p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sub in a.choices.values():
                yield from _parsers(sub)


def test_every_option_has_help(monkeypatch):
    seen = []

    def capture(self, *a, **kw):
        seen.append(self)
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    with pytest.raises(SystemExit):
        cli_main(["--help"])
    missing = [f"{p.prog} {a.dest}" for p in _parsers(seen[0]) for a in p._actions
               if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and not a.help]
    assert missing == []


def test_demo_world_puts_runs_and_traps_in_the_last_six_hours():
    now = 1_800_000_123.0
    cfg, faults = demo_world(24.0, now=now)
    end = cfg.start + cfg.hours * 3600
    assert end == 1_800_000_120.0  # the day ends at the current minute (123 s rounded down to 120)
    six = end - 6 * 3600
    assert six <= cfg.start + cfg.peak_warmup_at_h * 3600 < end  # the scheduled run: 18.5 h into the day
    assert cfg.peak_warmup_at_h == 18.5
    for f in faults:
        s, e = cfg.start + f.start, cfg.start + f.end
        assert six <= s < e <= end, f
    assert {f.trap for f in faults} == {"bypass", "tenant_isolation"}


def test_demo_imports_the_production_hour_read_beside_the_simulation(tmp_path):
    """`demo` imports the What if page's trace after it simulates (read meanwhile: the next test):
    every request of the file, its last aligned to the simulated day's last flush, and the messages
    in order."""
    from warmscope.app.cli.whatif import DEMO_TRACE

    store = tmp_path / "demo.sqlite"
    r = subprocess.run([sys.executable, "-m", "warmscope.app.cli", "--store", str(store), "demo", "--hours",
                        "0.5", "--no-dashboard"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in (r.stderr + r.stdout).splitlines() if ln.startswith(("wrote", "importing", "imported"))]
    assert [ln.split()[0] for ln in lines] == ["wrote", "importing", "imported"], lines
    requests_in_file = sum(1 for ln in DEMO_TRACE.read_text().splitlines() if ln.strip())
    import sqlite3

    con = sqlite3.connect(store)
    n, last = con.execute("SELECT count(*), max(ts) FROM block_trace").fetchone()
    end = con.execute("SELECT max(ts) FROM lookups").fetchone()[0]
    assert n == requests_in_file == 12_031
    assert last == pytest.approx(end, abs=1e-6)


def test_demo_reads_the_production_hour_after_its_workers_are_forked(tmp_path, capsys, monkeypatch):
    """In process: `demo` starts reading the trace once, while its simulation workers run (they were
    forked with no second thread), and hands that read to the import."""
    import multiprocessing

    from warmscope.app.cli import whatif
    from warmscope.simulator.run import _cores

    started, handed = [], []
    read, imp = whatif.read_demo_trace, whatif.import_demo_trace

    def read_spy():
        started.append(len(multiprocessing.active_children()))
        return read()

    def import_spy(path, pre_read=None):
        handed.append(pre_read)
        return imp(path, pre_read)

    monkeypatch.setattr(whatif, "read_demo_trace", read_spy)
    monkeypatch.setattr(whatif, "import_demo_trace", import_spy)
    rc, _, err = run(capsys, "--store", str(tmp_path / "d.sqlite"), "demo", "--hours", "0.25", "--no-dashboard")
    assert rc == 0, err
    cores = _cores()
    assert len(started) == 1 and started[0] == (min(3, cores) if cores > 1 else 0)  # its workers were running
    assert len(handed) == 1 and handed[0] is not None and handed[0].done()


def _children(pid: int) -> list[int]:
    p = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(x) for x in p.read_text().split()] if p.exists() else []


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.split(")")[-1].split()[0] != "Z"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.slow
def test_demo_stops_the_dashboard_on_a_signal(ab_store, sig):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "warmscope.app.cli", "--store", str(ab_store), "demo",
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/_stcore/health"
    try:
        wait_until(lambda: urllib.request.urlopen(url, timeout=2).status == 200, 60, "dashboard")
        kids = _children(proc.pid)
        assert kids, "the dashboard runs as a child process"
        os.kill(proc.pid, sig)
        assert proc.wait(30) == 128 + sig
        wait_until(lambda: not any(_alive(k) for k in kids), 15, "dashboard exit")
        with pytest.raises(OSError):
            urllib.request.urlopen(url, timeout=2)
        assert b"Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
