"""The collectors and the CLI under injected faults: one row per case.

    python -m bench.bench_faults [--only NAME ...] [--json]

Each case runs in its own Python process (clean pipeline, its own peak RSS)
against real parts: a redis-server started here on a free loopback port
(killed, or stopped with SIGSTOP past the client timeout), a SQLite store held
under an exclusive lock by another connection, a local HTTP server that
accepts OTLP connections and never answers, a taken TCP port, a store on a file
system mounted read only (in a private mount namespace). Loads are scaled
down from a production day so the whole run takes about a minute:

* memory / stalls: 4 threads x 25k lookups (and 4 x 50k: the bound must not
  grow with the load), one A/B unit per request, flushing every 0.2 s (memory)
  or 1 s (stalls);
* exactly-once: 2,000 requests in 200 units, Redis stopped during one flush;
* secret: 1,000 units with no secret and an unwritable data directory.

Columns: host exceptions, counts lost / duplicated / dropped-and-counted, peak
RSS growth, P99 / P99.9 / max per lookup, close() time. A case that does not
apply leaves a cell empty.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    def __init__(self, tmp: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [shutil.which("redis-server") or "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", tmp],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.1).close()
                return
            except OSError:
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()


# Code run in a child process; prints one JSON object on its last line.
PRELUDE = """
import json, os, resource, sys, threading, time
def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
def out(**kw):
    print(json.dumps(kw))
"""

SETUP_CASE = PRELUDE + """
base = rss_mb()
errs = 0
worst = 0.0
from warmscope import collectors
def fn(x):
    return x * 2
for i in range(5):
    t = time.perf_counter()
    try:
        if os.environ.get("BENCH_SETUP_TWICE"):
            collectors.setup()
            collectors.setup()
        c = collectors.InstrumentedCache({}, layer="response")
        with collectors.request_context(tenant="t", unit=f"u{i}", experiment="e", variant="A"):
            c.get("k")
            collectors.cached(layer="memo")(fn)(i)
    except Exception as e:
        errs += 1
        last = f"{type(e).__name__}: {str(e)[:80]}"
    worst = max(worst, time.perf_counter() - t)
t = time.perf_counter()
try:
    collectors.shutdown()
except Exception as e:
    errs += 1
out(host_exceptions=f"{errs}/5", max_call_s=round(worst, 3), close_s=round(time.perf_counter() - t, 3),
    peak_mb=round(rss_mb() - base, 1))
"""

LOAD_CASE = PRELUDE + """
from warmscope.collectors import InstrumentedCache, request_context
from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.pipeline import Telemetry
N, T = int(os.environ["BENCH_N"]), 4
cfg = CollectorConfig.load(env={}, **json.loads(os.environ["BENCH_CFG"]))
base = rss_mb()
tel = Telemetry(cfg)
cache = InstrumentedCache({f"k{i}": 1 for i in range(0, 1000, 2)}, layer="response", telemetry=tel)
errs = [0]
lat = []
def work(j):
    mine = []
    pc = time.perf_counter_ns
    for i in range(N):
        try:
            with request_context(tenant="t", unit=f"u{j}-{i}", experiment="e", variant="AB"[i % 2],
                                 telemetry=tel):
                t0 = pc()
                cache.get(f"k{i % 1000}")
                mine.append(pc() - t0)
                tel.record_request(latency_s=0.1, gpu_s=0.01)
        except Exception:
            errs[0] += 1
    lat.extend(mine)
ths = [threading.Thread(target=work, args=(j,)) for j in range(T)]
t_start = time.perf_counter()
[t.start() for t in ths]
[t.join() for t in ths]
busy = time.perf_counter() - t_start
time.sleep(float(os.environ.get("BENCH_AFTER", "0")))
t = time.perf_counter()
tel.close()
close_s = time.perf_counter() - t
lat.sort()
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] / 1000
agg = tel.aggregator
dropped = agg.dropped_counts() if hasattr(agg, "dropped_counts") else None
out(host_exceptions=f"{errs[0]}/{N * T}", peak_mb=round(rss_mb() - base, 1), close_s=round(close_s, 2),
    p99_us=round(q(0.99), 1), p999_us=round(q(0.999), 1), max_us=round(lat[-1] / 1000, 1),
    errors=dict((k, v) for k, v in agg.errors.items() if v), dropped=dropped, busy_s=round(busy, 2))
"""

STALL_DUP_CASE = PRELUDE + """
import signal
from warmscope.collectors import request_context
from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.pipeline import Telemetry
import redis
pid = int(os.environ["BENCH_REDIS_PID"])
cfg = CollectorConfig.load(env={}, exporter="none", redis_url=os.environ["BENCH_REDIS_URL"], key_secret="s")
tel = Telemetry(cfg, background=False)
def traffic(lo, hi):
    for i in range(lo, hi):
        with request_context(tenant="t", unit=f"u{i % 200}", experiment="e", variant="AB"[i % 2], telemetry=tel):
            tel.record_request(latency_s=0.1)
traffic(0, 1000)
tel.flush()                # an open connection, as in a running service
traffic(1000, 2000)
errs = 0
os.kill(pid, signal.SIGSTOP)
t = time.perf_counter()
try:
    tel.flush()            # times out: Redis applies the batch when it resumes
except Exception:
    errs += 1
stalled = time.perf_counter() - t
os.kill(pid, signal.SIGCONT)
time.sleep(0.5)
try:
    tel.flush()            # the retry
except Exception:
    errs += 1
t = time.perf_counter()
tel.close()
close_s = time.perf_counter() - t
r = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
from warmscope.sources.redis_source import RedisSource
got = int(RedisSource(os.environ["BENCH_REDIS_URL"]).units("e")["requests"].sum())
out(host_exceptions=f"{errs}/3", requests_in_redis=got, duplicated=max(0, got - 2000), lost=max(0, 2000 - got),
    stalled_flush_s=round(stalled, 2), close_s=round(close_s, 2))
"""

OTLP_CASE = PRELUDE + """
import socket
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(64)
held = []
def accept():
    while True:
        try:
            c, _ = srv.accept()
            held.append(c)          # accept, read nothing, never answer
        except OSError:
            return
threading.Thread(target=accept, daemon=True).start()
port = srv.getsockname()[1]
from warmscope.collectors import InstrumentedCache
from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.pipeline import Telemetry
cfg = CollectorConfig.load(env={}, exporter="otlp", otlp_endpoint=f"http://127.0.0.1:{port}", key_secret="s",
                           flush_interval_s=0.5, store_path=os.environ["BENCH_TMP"] + "/o.sqlite")
tel = Telemetry(cfg)
c = InstrumentedCache({}, layer="response", telemetry=tel)
for i in range(1000):
    c.get(f"k{i}")
time.sleep(float(os.environ.get("BENCH_WAIT", "1.5")))
t = time.perf_counter()
tel.close()
close_s = time.perf_counter() - t
out(host_exceptions="0/1000", export_errors=tel.aggregator.errors.get("export", 0), close_s=round(close_s, 2))
"""

SECRET_CASE = PRELUDE + """
from warmscope.collectors import request_context
from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.pipeline import Telemetry
import redis
tmp = os.environ["BENCH_TMP"]
open(tmp + "/blocker", "w").close()           # a file where the data directory should be
cfg = CollectorConfig.load(env={}, exporter="none", redis_url=os.environ["BENCH_REDIS_URL"],
                           store_path=tmp + "/blocker/data/warmscope.sqlite")
errs = 0
try:
    tel = Telemetry(cfg, background=False)
    for i in range(1000):
        with request_context(tenant="t", unit=f"u{i}", experiment="sec", variant="A", telemetry=tel):
            tel.record_request(latency_s=0.1)
    tel.flush()
    os.remove(tmp + "/blocker")                  # the directory becomes writable
    tel.flush()
    tel.close()
except Exception as e:
    errs += 1
r = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
from warmscope.sources.redis_source import RedisSource
got = len(RedisSource(os.environ["BENCH_REDIS_URL"]).units("sec"))
cwd_secret = any(p.name == "key-secret" for p in __import__("pathlib").Path(".").rglob("key-secret"))
# where does a pipeline with no data directory put its secret?
os.chdir(tmp)
os.makedirs("hostcwd", exist_ok=True); os.chdir("hostcwd")
try:
    t2 = Telemetry(CollectorConfig.load(env={}, exporter="none"), background=False)
    t2.hasher.hash("x")
except Exception:
    pass
in_cwd = os.path.exists("var/key-secret")
agg = tel.aggregator
out(host_exceptions=f"{errs}/1", units_lost=1000 - got, errors=agg.errors.get("flush", 0) +
    agg.errors.get("redis", 0) + agg.errors.get("config", 0), secret_in_cwd=in_cwd,
    dropped_counted=agg.dropped_counts() if hasattr(agg, "dropped_counts") else None)
"""

SECRET_RETRY_CASE = PRELUDE + """
from warmscope.collectors import request_context
from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.pipeline import Telemetry
from warmscope.collectors.store import EmbeddedStore
tmp = os.environ["BENCH_TMP"]
open(tmp + "/blocker", "w").close()           # a file where the data directory should be
os.environ["WARMSCOPE_DATA_DIR"] = tmp + "/blocker/data"
cfg = CollectorConfig.load(env={}, exporter="embedded", store_path=tmp + "/s.sqlite")
tel = Telemetry(cfg, background=False)
for i in range(1000):
    with request_context(tenant="t", unit=f"u{i}", experiment="sec", variant="A", telemetry=tel):
        tel.record_request(latency_s=0.1)
tel.flush()
os.remove(tmp + "/blocker")                  # the data directory becomes writable
tel.flush()
tel.close()
got = len(EmbeddedStore(tmp + "/s.sqlite", readonly=True).frame("ab_units"))
out(host_exceptions="0/1", units_lost=1000 - got, errors=tel.aggregator.errors.get("config", 0))
"""

# The store's file system is read only (as after a remount on a disk error) while the host records:
# the writer cannot write it; rows wait in memory (bounded) and the store is retried at every flush;
# once the file system is writable again, everything lands. Run in a private mount namespace (unshare
# -m) on a tmpfs bind-mounted read only. (A file system cannot be switched to read only under a
# store that is open for writing: the kernel refuses the remount, and chmod does not stop root.)
READONLY_FS_CASE = PRELUDE + """
import subprocess
from warmscope.collectors import request_context
from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.pipeline import Telemetry
from warmscope.collectors.store import EmbeddedStore
d = os.environ["BENCH_MNT"]
sh = lambda *a: subprocess.run(a, check=True, capture_output=True)
sh("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", d)
path = d + "/s.sqlite"
EmbeddedStore(path).close()                  # the store exists, with its schema
sh("mount", "--bind", d, d)
sh("mount", "-o", "remount,bind,ro", d)      # now its file system is read only
try:
    EmbeddedStore(path, readonly=True)
    reader = "read"
except Exception as e:                       # what the dashboard would say
    reader = str(e)
cfg = CollectorConfig.load(env={}, exporter="embedded", store_path=path, key_secret="s")
errs = 0
try:
    tel = Telemetry(cfg, background=False)
    for i in range(1000):
        with request_context(tenant="t", unit=f"u{i}", experiment="ro", variant="A", telemetry=tel):
            tel.record_request(latency_s=0.1)
    tel.flush()
    failed = tel.aggregator.errors.get("store", 0)
    pending = tel.pending_rows("store")
    sh("mount", "-o", "remount,bind,rw", d)  # writable again
    tel.flush()
    tel.close()
except Exception as e:
    errs, failed, pending = 1, None, None
    print(repr(e), file=sys.stderr)
got = len(EmbeddedStore(path, readonly=True).frame("ab_units"))
out(host_exceptions=f"{errs}/1", store_errors_while_read_only=failed, rows_kept_while_read_only=pending,
    units_lost=1000 - got, dropped_counted=tel.aggregator.dropped_counts() if not errs else None,
    reader_while_read_only=reader[:160])
"""


def run_readonly_fs_case(tmp: str) -> dict:
    """READONLY_FS_CASE in a private mount namespace; {"skipped": why} where one cannot be made."""
    unshare = shutil.which("unshare")
    mnt = tempfile.mkdtemp(dir=tmp)
    if not unshare or subprocess.run([unshare, "-m", "true"], capture_output=True).returncode:
        return {"skipped": "unshare -m is not available (needs root or user namespaces)"}
    return run_py(READONLY_FS_CASE, {"BENCH_MNT": mnt}, prefix=[unshare, "-m"])


PRIVACY_CASE = PRELUDE + """
from warmscope.collectors.keys import FamilyNormaliser
import random
f = FamilyNormaliser(max_families=10**9)
examples = ["user:alicesmith:chat", "email/john.doe/example.com", "session:JohnDoe:passport",
            "prompt:Tell-me-about-my-diagnosis:y"]
fams = [f.family(k) for k in examples]
rnd = random.Random(1)
first = ["alice", "John", "maria", "Li", "oluwaseun", "Zoe", "ahmed"]
last = ["smith", "Doe", "garcia", "Nguyen", "okafor"]
words = ["tell", "me", "about", "my", "diagnosis", "salary", "divorce", "hiv", "pregnant"]
leaks = 0
N = 2000
for i in range(N):
    fn, ln = rnd.choice(first), rnd.choice(last)
    pii = rnd.choice([fn + ln, fn + "." + ln, fn + "_" + ln, "-".join(rnd.sample(words, 3)), fn, ln.lower()])
    key = rnd.choice(["user:{}:chat", "email/{}/example.com", "session:{}:profile", "prompt:{}:v"]).format(pii)
    fam = f.family(key)
    leaks += any(p.lower() in fam.lower() for p in pii.replace(".", " ").replace("_", " ").replace("-", " ").split())
out(examples=dict(zip(examples, fams)), leaking_keys=f"{leaks}/{N}")
"""

LABELS_CASE = PRELUDE + """
from warmscope.collectors import InstrumentedCache, request_context
from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.pipeline import Telemetry
tel = Telemetry(CollectorConfig.load(env={}, exporter="none", key_secret="s", store_path=os.environ["BENCH_TMP"] +
                "/l.sqlite"), background=False)
c = InstrumentedCache({}, layer="response", telemetry=tel)
for i in range(1000):
    with request_context(tenant="t", model=f"m{i}", experiment=f"x{i}", variant=f"v{i}", telemetry=tel):
        c.get("k")
series = len(tel.aggregator.lookup_totals())
caches = [InstrumentedCache({}, layer=f"L{i}", telemetry=tel) for i in range(4100)]
with request_context(tenant="t", telemetry=tel):
    for _ in range(2):
        caches[4099].get("hot")
        caches[0].get("cold")
hot, _ = tel.aggregator.take_buffers(True)
agg = tel.aggregator
wrong = sum(1 for hk, sk in hot.items() if "hot" in sk and agg.hot_scope(hk) != ("t", "L4099")
            and agg.hot_scope(hk) != ("t", "other"))
out(lookup_series_1000_labels=series, hot_keys_wrong_scope=wrong,
    overflow_counted=agg.label_overflow() if hasattr(agg, "label_overflow") else None)
"""


def run_py(code: str, env: dict, timeout: float = 300, prefix: list[str] | None = None) -> dict:
    e = dict(os.environ, **env)
    t = time.perf_counter()
    try:
        p = subprocess.run([*(prefix or []), sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True,
                           text=True,
                           timeout=timeout, cwd=env.get("BENCH_CWD", tempfile.gettempdir()))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout}s"}
    lines = [ln for ln in p.stdout.strip().splitlines() if ln.startswith("{")]
    res = json.loads(lines[-1]) if lines else {"error": (p.stderr.strip().splitlines() or ["?"])[-1][:160]}
    res["wall_s"] = round(time.perf_counter() - t, 2)
    return res


def setup_cases(tmp: str) -> dict[str, dict]:
    import sqlite3

    out = {}
    d = Path(tmp)
    base = {"WARMSCOPE_KEY_SECRET": "s", "WARMSCOPE_EXPORTER": "embedded"}

    def store(name: str) -> str:
        return str(d / name)

    out["setup: WARMSCOPE_FLUSH_INTERVAL=abc"] = dict(base, WARMSCOPE_FLUSH_INTERVAL="abc",
                                                     WARMSCOPE_STORE=store("a.sqlite"))
    Path(store("corrupt.sqlite")).write_bytes(b"this is not a database" * 100)
    out["setup: corrupt store"] = dict(base, WARMSCOPE_STORE=store("corrupt.sqlite"))
    con = sqlite3.connect(store("newer.sqlite"))
    con.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT)")
    con.execute("INSERT INTO meta VALUES('schema_version', '99')")
    con.commit()
    con.close()
    out["setup: store from a newer schema"] = dict(base, WARMSCOPE_STORE=store("newer.sqlite"))
    Path(store("afile")).write_text("x")
    out["setup: unwritable store"] = dict(base, WARMSCOPE_STORE=store("afile/sub/w.sqlite"))
    out["setup: locked store"] = dict(base, WARMSCOPE_STORE=store("locked.sqlite"), BENCH_LOCK="1")
    out["setup: garbage Redis URL"] = dict(base, WARMSCOPE_REDIS_URL="garbage://", WARMSCOPE_EXPORTER="none")
    out["setup: Prometheus port taken"] = dict(base, WARMSCOPE_EXPORTER="prometheus",
                                               WARMSCOPE_STORE=store("p.sqlite"), BENCH_TAKE_PORT="1")
    out["setup: setup() twice (prometheus)"] = dict(base, WARMSCOPE_EXPORTER="prometheus",
                                                    WARMSCOPE_STORE=store("p2.sqlite"), BENCH_SETUP_TWICE="1",
                                                    WARMSCOPE_PROMETHEUS_PORT=str(free_port()))
    return out


def run_setup_case(env: dict, tmp: str) -> dict:
    import sqlite3

    held = None
    sock = None
    if env.pop("BENCH_LOCK", None):
        from warmscope.collectors.store import EmbeddedStore

        EmbeddedStore(env["WARMSCOPE_STORE"]).close()
        held = sqlite3.connect(env["WARMSCOPE_STORE"], isolation_level=None)
        held.execute("BEGIN EXCLUSIVE")
    if env.pop("BENCH_TAKE_PORT", None):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        env["WARMSCOPE_PROMETHEUS_PORT"] = str(sock.getsockname()[1])
    try:
        return run_py(SETUP_CASE, env)
    finally:
        if held is not None:
            held.rollback() if held.in_transaction else None
            held.close()
        if sock is not None:
            sock.close()


def cli_cases(tmp: str) -> list[tuple[str, list[str], str | None]]:
    """(name, argv, file that must survive)."""
    import sqlite3

    d = Path(tmp) / "cli"
    d.mkdir(exist_ok=True)
    (d / "corrupt.sqlite").write_bytes(b"garbage" * 200)
    con = sqlite3.connect(d / "newer.sqlite")
    con.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT)")
    con.execute("INSERT INTO meta VALUES('schema_version', '99')")
    con.commit()
    con.close()
    (d / "adir.sqlite").mkdir(exist_ok=True)
    (d / "ro").write_text("a file, not a directory")
    sim = ["simulate", "--hours", "0.05", "--rps", "2", "--quiet", "--workers", "1"]
    n = iter(range(1000))

    def g() -> str:
        return str(d / f"g{next(n)}.sqlite")

    return [
        ("demo: corrupt store", ["--store", str(d / "corrupt.sqlite"), "demo", "--no-dashboard", "--hours", "0.05"],
         str(d / "corrupt.sqlite")),
        ("demo: newer store", ["--store", str(d / "newer.sqlite"), "demo", "--no-dashboard", "--hours", "0.05"],
         str(d / "newer.sqlite")),
        ("demo: locked store", ["--store", str(d / "locked.sqlite"), "demo", "--no-dashboard", "--hours", "0.05"],
         "LOCK"),
        ("demo: store is a directory", ["--store", str(d / "adir.sqlite"), "demo", "--no-dashboard", "--hours",
                                        "0.05"], str(d / "adir.sqlite")),
        ("simulate: corrupt store", sim + ["--out", str(d / "corrupt.sqlite")], str(d / "corrupt.sqlite")),
        ("simulate: --faults-out unwritable", sim + ["--out", str(d / "f.sqlite"), "--faults-out",
                                                     str(d / "ro/x.json")], None),
        ("simulate: min_tokens=abc", sim + ["--out", g(), "--fault",
                                            "kv_fixed_len:replica=a-0@00:00-01:00;min_tokens=abc"], None),
        ("simulate: --hours nan", sim[:1] + ["--hours", "nan", "--out", g()], None),
        ("simulate: --speed 0", sim + ["--realtime", "--speed", "0", "--out", g()], None),
        ("simulate: --seed -1", sim + ["--seed", "-1", "--out", g()], None),
        ("simulate: --redis-url garbage", sim + ["--redis-url", "garbage", "--out", g()], None),
        ("simulate: window @25:00-26:00", sim + ["--fault", "bypass@25:00-26:00", "--out", g()],
         None),
        ("simulate: window @10-11", sim + ["--fault", "bypass@10-11", "--out", g()], None),
        ("simulate: window @9:99-10:00", sim + ["--fault", "bypass@9:99-10:00", "--out", g()],
         None),
        ("simulate: --workers 0", sim[:-2] + ["--workers", "0", "--out", g()], None),
        ("simulate: negative capacity", sim + ["--b-kv-capacity", "-5", "--out", g()], None),
        ("simulate: negative TTL", sim + ["--b-response-ttl", "-5", "--out", g()], None),
        ("dashboard: --port 99999", ["--store", str(d / "x.sqlite"), "dashboard", "--port", "99999"], None),
        ("demo --fresh keeps prod.sqlite.backup-2026", ["--store", str(d / "prod.sqlite"), "demo", "--no-dashboard",
                                                        "--fresh", "--hours", "0.02"],
         str(d / "prod.sqlite.backup-2026")),
    ]


def run_cli_case(argv: list[str], keep: str | None, tmp: str) -> dict:
    import sqlite3

    held = None
    if keep == "LOCK":
        p = Path(tmp) / "cli" / "locked.sqlite"
        from warmscope.collectors.store import EmbeddedStore

        EmbeddedStore(p).close()
        held = sqlite3.connect(p, isolation_level=None)
        held.execute("BEGIN EXCLUSIVE")
        keep = str(p)
    if keep and keep.endswith("backup-2026"):
        Path(keep).write_text("precious")
        sqlite3.connect(keep.replace(".backup-2026", "")).close()  # the store exists: --fresh replaces it
    before = Path(keep).stat().st_size if keep and Path(keep).is_file() else None
    env = dict(os.environ, WARMSCOPE_DATA_DIR=str(Path(tmp) / "cli-data"))
    t = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-m", "warmscope.app.cli", *argv], capture_output=True, text=True,
                           timeout=120, env=env, cwd=tmp)
        rc, err = p.returncode, p.stderr
    except subprocess.TimeoutExpired:
        rc, err = None, "timeout"
    finally:
        if held is not None:
            held.rollback()
            held.close()
    intact = None
    if keep:
        intact = Path(keep).exists() and (before is None or Path(keep).stat().st_size == before)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    return {"exit": rc, "traceback": "Traceback" in err, "stderr_lines": len(lines),
            "message": (lines[-1][:150] if lines else ""), "kept": intact, "wall_s": round(time.perf_counter() - t, 1)}


def deploy_checks() -> dict:
    import re

    df = (ROOT / "Dockerfile").read_text()
    comp = (ROOT / "docker-compose.yml").read_text()
    ports = re.findall(r'"([0-9.:]*\d+:\d+)"', comp)
    open_ports = [p for p in ports if not p.startswith("127.0.0.1:")]
    prom_src = "".join(p.read_text() for p in (ROOT / "analysis").glob("*.py"))
    return {
        "dockerfile binds 0.0.0.0": "0.0.0.0" in df.split("CMD", 1)[-1] if "CMD [" in df else "0.0.0.0" in df,
        "compose ports on all interfaces": len(open_ports),
        "compose default secret": "change-me" in comp,
        "PrometheusConnect disable_ssl=True": "disable_ssl=True" in prom_src,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="substrings of case names to run")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ws-faults-")
    results: dict[str, dict] = {}

    def want(name: str) -> bool:
        return not args.only or any(s in name for s in args.only)

    for name, env in setup_cases(tmp).items():
        if want(name):
            results[name] = run_setup_case(env, tmp)
            print(name, results[name], flush=True)
    red = Redis(tmp)
    try:
        dead = f"redis://127.0.0.1:{free_port()}/0"
        loads = {
            "memory: Redis down, 4x25k lookups, 1 unit/request": (
                dict(exporter="none", redis_url=dead, key_secret="s", flush_interval_s=0.2, side_flush_s=0), "0"),
            "stalls: store + Redis, 1 s flushes": (
                dict(exporter="embedded", redis_url=red.url, key_secret="s", flush_interval_s=1.0, side_flush_s=1,
                     store_path=f"{tmp}/stall.sqlite"), "0"),
            "stalls: store only, 1 s flushes": (
                dict(exporter="embedded", key_secret="s", flush_interval_s=1.0, side_flush_s=1,
                     store_path=f"{tmp}/stall2.sqlite"), "0"),
        }
        loads["memory: Redis down, 4x50k lookups, 1 unit/request"] = loads[
            "memory: Redis down, 4x25k lookups, 1 unit/request"]
        for name, (cfg, after) in loads.items():
            if want(name):
                n = "50000" if "4x50k" in name else "25000"
                results[name] = run_py(LOAD_CASE, {"BENCH_CFG": json.dumps(cfg), "BENCH_N": n,
                                                   "BENCH_AFTER": after})
                print(name, results[name], flush=True)
        name = "exactly-once: Redis SIGSTOP past the timeout"
        if want(name):
            import redis as _r

            _r.Redis.from_url(red.url).flushdb()
            results[name] = run_py(STALL_DUP_CASE, {"BENCH_REDIS_URL": red.url, "BENCH_REDIS_PID": str(red.proc.pid)})
            print(name, results[name], flush=True)
        name = "secret: none set, data dir unwritable"
        if want(name):
            import redis as _r

            _r.Redis.from_url(red.url).flushdb()
            results[name] = run_py(SECRET_CASE, {"BENCH_REDIS_URL": red.url, "BENCH_TMP": tempfile.mkdtemp(dir=tmp)})
            print(name, results[name], flush=True)
    finally:
        red.stop()
    name = "secret: embedded, data dir unwritable, then writable"
    if want(name):
        results[name] = run_py(SECRET_RETRY_CASE, {"BENCH_TMP": tempfile.mkdtemp(dir=tmp)})
        print(name, results[name], flush=True)
    name = "store: file system read only, then writable"
    if want(name):
        results[name] = run_readonly_fs_case(tmp)
        print(name, results[name], flush=True)
    name = "otlp: hanging receiver"
    if want(name):
        results[name] = run_py(OTLP_CASE, {"BENCH_TMP": tmp})
        print(name, results[name], flush=True)
    name = "privacy: personal-data-like keys"
    if want(name):
        results[name] = run_py(PRIVACY_CASE, {})
        print(name, results[name], flush=True)
    name = "labels: 1,000 models/experiments/variants, 4,100 layers"
    if want(name):
        results[name] = run_py(LABELS_CASE, {"BENCH_TMP": tmp})
        print(name, results[name], flush=True)
    for name, argv, keep in cli_cases(tmp):
        name = "cli " + name
        if want(name):
            results[name] = run_cli_case(argv, keep, tmp)
            print(name, results[name], flush=True)
    if want("deploy"):
        results["deploy defaults"] = deploy_checks()
        print("deploy defaults", results["deploy defaults"], flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
