"""Bad input to `warmscope demo / simulate / dashboard`: one line naming the
problem, a non-zero exit, no traceback, and the store left as it was.

The CLI runs in a subprocess (what a user sees); a real store held under an
exclusive lock by another connection stands in for a busy writer.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from warmscope.collectors.store import EmbeddedStore

pytestmark = pytest.mark.timeout(300)


def run(tmp: Path, *argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, WARMSCOPE_DATA_DIR=str(tmp / "data"))
    env.pop("WARMSCOPE_STORE", None)
    return subprocess.run([sys.executable, "-m", "warmscope.app.cli", *argv], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp)


def one_line(p: subprocess.CompletedProcess, *words: str) -> str:
    assert p.returncode != 0, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


SIM = ["simulate", "--hours", "0.02", "--rps", "1", "--quiet", "--workers", "1"]


def _bad_stores(tmp: Path) -> dict[str, Path]:
    corrupt = tmp / "corrupt.sqlite"
    corrupt.write_bytes(b"not a database" * 100)
    newer = tmp / "newer.sqlite"
    con = sqlite3.connect(newer)
    con.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT)")
    con.execute("INSERT INTO meta VALUES('schema_version', '99')")
    con.commit()
    con.close()
    adir = tmp / "adir.sqlite"
    adir.mkdir()
    return {"corrupt": corrupt, "newer": newer, "directory": adir}


@pytest.mark.parametrize("kind,word", [("corrupt", "not a warmscope store"), ("newer", "schema version 99"),
                                       ("directory", "directory")])
@pytest.mark.parametrize("cmd", ["demo", "simulate"])
def test_unusable_store_one_line_and_left_intact(tmp_path, cmd, kind, word):
    path = _bad_stores(tmp_path)[kind]
    before = path.read_bytes() if path.is_file() else None
    argv = ["--store", str(path), "demo", "--no-dashboard", "--hours", "0.02"] if cmd == "demo" else \
        SIM + ["--out", str(path)]
    one_line(run(tmp_path, *argv), word)
    if before is not None:
        assert path.read_bytes() == before
    else:
        assert path.is_dir() and not any(path.iterdir())


@pytest.mark.slow  # a child process that waits out SQLite's 5 s lock wait
def test_locked_store_one_line(tmp_path):
    path = tmp_path / "locked.sqlite"
    EmbeddedStore(path).close()
    held = sqlite3.connect(path, isolation_level=None)
    held.execute("BEGIN EXCLUSIVE")
    try:
        one_line(run(tmp_path, "--store", str(path), "demo", "--no-dashboard", "--hours", "0.02"), "locked")
    finally:
        held.rollback()
        held.close()
    assert EmbeddedStore(path, readonly=True).counts()["lookups"] == 0


@pytest.mark.parametrize("args,word", [
    (["--fault", "kv_fixed_len:replica=a-0@00:00-01:00;min_tokens=abc"], "min_tokens"),
    (["--fault", "bypass@25:00-26:00"], "time of day"),
    (["--fault", "bypass@10-11"], "HH:MM"),
    (["--fault", "bypass@9:99-10:00"], "minute 99"),
    (["--fault", "bypass@10:00"], "must be HH:MM-HH:MM (a start and an end)"),
    (["--fault", "bypass@10:00-10:00"], "must end after it starts"),
    (["--fault", "bypass;nope=1"], "unknown parameter 'nope'"),
    (["--fault", "kv_fixed_len:layer=nolayer"], "unknown layer 'nolayer'"),
    (["--fault", "bypass:tenant=acme,tenant=globex"], "given twice"),
    (["--hours", "nan"], "--hours"),
    (["--speed", "0", "--realtime"], "--speed"),
    (["--seed", "-1"], "--seed"),
    (["--redis-url", "garbage"], "--redis-url"),
    (["--workers", "0"], "--workers"),
    (["--b-kv-capacity", "-5"], "--b-kv-capacity"),
    (["--b-response-ttl", "-5"], "--b-response-ttl"),
])
def test_simulate_bad_arguments_one_line_nothing_written(tmp_path, args, word):
    out = tmp_path / "s.sqlite"
    one_line(run(tmp_path, *SIM, "--out", str(out), *args), word)
    assert not out.exists()


def test_faults_out_unwritable_fails_before_the_run(tmp_path):
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "s.sqlite"
    one_line(run(tmp_path, *SIM, "--out", str(out), "--faults-out", str(tmp_path / "afile" / "t.json")),
             "--faults-out")
    assert not out.exists()  # nothing simulated first


def test_dashboard_port_out_of_range(tmp_path):
    one_line(run(tmp_path, "dashboard", "--port", "99999"), "--port", "65535")


def test_fresh_removes_only_the_store_files(tmp_path):
    store = tmp_path / "prod.sqlite"
    EmbeddedStore(store).close()
    keep = [tmp_path / "prod.sqlite.backup-2026", tmp_path / "prod.sqlite-old", tmp_path / "prod.sqlite.bak"]
    for k in keep:
        k.write_text("precious")
    p = run(tmp_path, "--store", str(store), "demo", "--no-dashboard", "--fresh", "--hours", "0.02")
    assert p.returncode == 0, p.stderr
    assert all(k.read_text() == "precious" for k in keep)
    assert EmbeddedStore(store, readonly=True).counts()["lookups"] > 0


def test_fresh_refuses_a_file_that_is_not_a_store(tmp_path):
    other = tmp_path / "app.db"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE users(name TEXT)")
    con.commit()
    con.close()
    before = other.read_bytes()
    one_line(run(tmp_path, "--store", str(other), "demo", "--no-dashboard", "--fresh", "--hours", "0.02"),
             "not a warmscope store")
    assert other.read_bytes() == before
