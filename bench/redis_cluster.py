"""A local Redis Cluster for tests and benchmarks: ``masters`` redis-server
processes with ``--cluster-enabled yes`` (and ``replicas`` per master) on free
127.0.0.1 ports, joined by ``redis-cli --cluster create``; stopped, their
folders removed, by :meth:`LocalCluster.stop`.

    with LocalCluster(masters=3, replicas=1) as c:
        c.url                       # redis://127.0.0.1:PORT/0 of one master
        c.kill_master_of("ws:{ab:exp:3}:mi")   # SIGKILL
        c.wait_failover("ws:{ab:exp:3}:mi")    # until a replica has taken over
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["LocalCluster", "ClusterUnavailable", "free_port"]


class ClusterUnavailable(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ports(n: int) -> list[int]:
    # A cluster node also listens on port + 10000 (the bus): both must be free.
    out: list[int] = []
    while len(out) < n:
        p = free_port()
        if p + 10000 > 65535 or p in out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 10000))
            except OSError:
                continue
        out.append(p)
    return out


class LocalCluster:
    def __init__(self, masters: int = 3, replicas: int = 0, node_timeout_ms: int = 1000,
                 maxmemory: str | None = None) -> None:
        server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if not server or not cli:
            raise ClusterUnavailable("redis-server / redis-cli are not installed; run scripts/test.sh (it installs "
                                     "them with apt-get)")
        self.dir = Path(tempfile.mkdtemp(prefix="ws-cluster-"))
        self.ports = _ports(masters * (1 + replicas))
        self.procs: dict[int, subprocess.Popen] = {}
        try:
            for p in self.ports:
                d = self.dir / str(p)
                d.mkdir()
                args = [server, "--port", str(p), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                        "--cluster-config-file", str(d / "nodes.conf"), "--cluster-node-timeout",
                        str(node_timeout_ms), "--save", "", "--appendonly", "no", "--dir", str(d),
                        "--repl-diskless-sync-delay", "0"]
                if maxmemory:
                    args += ["--maxmemory", maxmemory]
                self.procs[p] = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                                 start_new_session=True)
            for p in self.ports:
                self._wait(lambda p=p: self._cli(p, "ping") == "PONG", f"redis-server on {p}")
            out = subprocess.run([cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                                  "--cluster-replicas", str(replicas), "--cluster-yes"],
                                 capture_output=True, text=True, timeout=60)
            if out.returncode:
                raise ClusterUnavailable(f"redis-cli --cluster create failed: {out.stdout[-500:]} {out.stderr[-500:]}")
            # A replica that never finished its first sync cannot take over: wait for every link.
            self._wait(lambda: self._ready() and self._synced(), "cluster state ok and replicas in sync", timeout=60)
        except BaseException:
            self.stop()
            raise
        self.url = f"redis://127.0.0.1:{self.ports[0]}/0"

    def _cli(self, port: int, *args: str) -> str:
        r = subprocess.run([shutil.which("redis-cli"), "-h", "127.0.0.1", "-p", str(port), *args],
                           capture_output=True, text=True, timeout=10)
        return r.stdout.strip()

    def _ready(self) -> bool:
        alive = [p for p, pr in self.procs.items() if pr.poll() is None]
        return all("cluster_state:ok" in self._cli(p, "cluster", "info") for p in alive)

    def _synced(self) -> bool:
        for p, pr in self.procs.items():
            info = self._cli(p, "info", "replication")
            if pr.poll() is None and "role:slave" in info and "master_link_status:up" not in info:
                return False
        return True

    @staticmethod
    def _wait(check, what: str, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if check():
                    return
            except Exception:
                pass
            time.sleep(0.05)
        raise ClusterUnavailable(f"timed out waiting for {what}")

    def masters(self) -> list[int]:
        out = []
        for p, pr in self.procs.items():
            if pr.poll() is None and "role:master" in self._cli(p, "info", "replication"):
                out.append(p)
        return out

    @property
    def live_url(self) -> str:
        """The URL of a node still running (after a kill, ``url`` may name the dead one)."""
        return f"redis://127.0.0.1:{self.masters()[0]}/0"

    def master_of(self, key: str) -> int:
        slot = int(self._cli(self.masters()[0], "cluster", "keyslot", key))
        for line in self._cli(self.masters()[0], "cluster", "nodes").splitlines():
            f = line.split()
            if "master" in f[2] and "fail" not in f[2]:
                for r in f[8:]:
                    lo, _, hi = r.partition("-")
                    if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                        return int(f[1].split(":")[1].split("@")[0])
        raise ClusterUnavailable(f"no master holds slot {slot}")

    def kill(self, port: int) -> None:
        pr = self.procs[port]
        if pr.poll() is None:
            pr.send_signal(signal.SIGKILL)
            pr.wait(5)

    def kill_master_of(self, key: str) -> int:
        port = self.master_of(key)
        self.kill(port)
        return port

    def wait_failover(self, key: str, timeout: float = 30.0) -> int:
        """Wait until a live master serves ``key``'s slot and every live node says the cluster is ok;
        returns that master's port."""
        def done() -> bool:
            p = self.master_of(key)
            return self.procs[p].poll() is None and self._ready()

        self._wait(done, f"a replica to take over {key}'s slot", timeout)
        return self.master_of(key)

    def memory_used(self) -> int:
        total = 0
        for p in self.masters():
            for line in self._cli(p, "info", "memory").splitlines():
                if line.startswith("used_memory:"):
                    total += int(line.split(":")[1])
        return total

    def stop(self) -> None:
        for pr in self.procs.values():
            if pr.poll() is None:
                pr.terminate()
        for pr in self.procs.values():
            try:
                pr.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(pr.pid, signal.SIGKILL)
                pr.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
