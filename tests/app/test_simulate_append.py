"""`warmscope simulate --append` next to another writer of the same store: it waits for the store's write
lock instead of failing after 5 s with "database is locked", its workers print no KeyboardInterrupt
tracebacks, and its rows are kept next to the other run's."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time

import pytest


def simulate(store, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "warmscope.app.cli", "--store", str(store), "simulate",
                             "--quiet", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def requests_in(store) -> int:
    con = sqlite3.connect(store)
    try:
        return int(con.execute("SELECT COALESCE(SUM(requests), 0) FROM requests").fetchone()[0])
    finally:
        con.close()


def finished(p: subprocess.Popen) -> tuple[int, dict, str]:
    out, err = p.communicate(timeout=600)
    return p.returncode, (json.loads(out) if p.returncode == 0 else {}), err


@pytest.mark.slow  # two simulations in child processes, one waiting 8 s for a lock
def test_an_append_waits_for_another_writers_lock_and_keeps_its_rows(tmp_path):
    store = tmp_path / "s.sqlite"
    rc, first, err = finished(simulate(store, "--hours", "0.5", "--seed", "1"))
    assert rc == 0, err
    other = sqlite3.connect(store, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the write lock, longer than SQLite's 5 s wait
    p = simulate(store, "--hours", "0.5", "--seed", "2", "--append")
    time.sleep(8)
    assert p.poll() is None  # still waiting, not failed
    other.execute("ROLLBACK")
    other.close()
    rc, second, err = finished(p)
    assert rc == 0, err
    assert "locked" not in err and "Traceback" not in err and "KeyboardInterrupt" not in err
    assert requests_in(store) == first["requests"] + second["requests"]


@pytest.mark.slow
def test_two_appends_at_once_both_keep_their_rows(tmp_path):
    # The case as it happened: two `simulate --append` on one store; before, one ended after 32-48 s with
    # "the store cannot be used: database is locked", its workers printed KeyboardInterrupt tracebacks, and
    # none of its rows were kept.
    store = tmp_path / "s.sqlite"
    rc, first, err = finished(simulate(store, "--hours", "0.5", "--seed", "1"))
    assert rc == 0, err
    runs = [simulate(store, "--hours", "4", "--seed", str(seed), "--append") for seed in (2, 3)]
    done = [finished(p) for p in runs]
    for rc, _, err in done:
        assert rc == 0, err
        assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert requests_in(store) == first["requests"] + sum(out["requests"] for _, out, _ in done)
