"""`warmscope dashboard` and its Streamlit child: the child ends with the CLI even when the CLI is killed
with SIGKILL (as `subprocess.run(timeout=...)` does) and its output is piped to a reader that stopped
reading; and a SIGTERM to the child ends it (Streamlit's stop, then the watchdog within its grace)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request

import pytest
from warmscope.app.dashboard.serve import STOP_GRACE_S
from warmscope.simulator import SimConfig, simulate

from tests.conftest import free_port, wait_until


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("orphan") / "s.sqlite"
    simulate(SimConfig.load(hours=0.5, rps=3.0, tenants=3, seed=4), path, [], workers=1)
    return path


def healthy(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1).status == 200
    except Exception:
        return False


def streamlit_pids(port: int) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"server.port {port}"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not open(f"/proc/{pid}/stat").read().split(") ")[1].startswith("Z")


def start(store, port: int) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "warmscope.app.cli", "--store", str(store), "dashboard", "--port",
                          str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # piped, never read
    wait_until(lambda: healthy(port) or p.poll() is not None, 120, "the dashboard")
    if p.poll() is not None:  # it ended instead: say why (its stderr), not "did not become ready"
        raise RuntimeError(f"the dashboard exited with {p.returncode}: {p.stderr.read()[-2000:]!r}")
    return p


def kill_all(port: int) -> None:
    for pid in streamlit_pids(port):
        os.kill(pid, signal.SIGKILL)


def test_the_dashboard_ends_with_a_cli_killed_by_sigkill(store):
    port = free_port()
    p = start(store, port)
    try:
        (child,) = streamlit_pids(port)
        p.kill()  # SIGKILL: no handler of the CLI runs
        p.wait()
        wait_until(lambda: not alive(child), 10, "the orphaned dashboard gone")
        assert not healthy(port)
    finally:
        kill_all(port)
        p.stdout.close()
        p.stderr.close()


def test_a_sigterm_ends_the_dashboard_within_the_grace(store):
    port = free_port()
    p = start(store, port)
    try:
        (child,) = streamlit_pids(port)
        os.kill(child, signal.SIGTERM)
        wait_until(lambda: not alive(child), STOP_GRACE_S + 10, "the dashboard stopped")
        assert p.wait(timeout=10) is not None  # and the CLI with it
    finally:
        kill_all(port)
        p.stdout.close()
        p.stderr.close()
