"""When is the first sample of an engine counter an increment? Against a real
Prometheus (scrapes every second, ``--query.lookback-delta=10s``) and small
vLLM-shaped exporters whose counters advance by 100 query / 50 hit tokens per
scrape served and which export ``process_start_time_seconds``.

Prometheus' ``increase()`` never counts a series' first sample; the source
counts it only on evidence that the counter was 0 inside the range (the target
answered earlier scrapes without the series, or its process started in the
range). The matrix, each row a test below:

* an engine started inside the range: its whole count is the range's;
* a new label set on a running engine: counted from 0;
* an engine started (long) before Prometheus: only the increments Prometheus saw;
* Prometheus restarted after a gap: the lifetime count is not booked;
* a target removed and re-added: the lifetime count is not booked.
"""

from __future__ import annotations

import subprocess
import threading
import time
import urllib.request
from http.server import HTTPServer
from pathlib import Path

import pytest
from warmscope.sources.prometheus import PrometheusSource, counter_window

from tests.conftest import ExpositionHandler, free_port, need_binary, wait_until

pytestmark = pytest.mark.prometheus

LIFETIME = 1_000_000  # what a long-running engine counted before anyone scraped it
GAP_S = 50            # Prometheus down / target removed: longer than two steps plus the lookback


class Engine:
    def __init__(self, started: float, base: int) -> None:
        self.started, self.base, self.n, self.late_n = started, base, 0, 0
        self.frozen = False
        self.late = False   # a second label set appears on the running engine
        self.log: list[tuple[float, int]] = []   # (time served, queries value)
        self.port = free_port()
        self.server: HTTPServer | None = None

    @property
    def value(self) -> int:
        return self.base + 100 * self.n

    def body(self) -> bytes:
        if not self.frozen:
            self.n += 1
            self.late_n += self.late
        self.log.append((time.time(), self.value))
        lab = '{engine="0",model_name="tiny"}'
        lines = [f"vllm:prefix_cache_queries_total{lab} {self.value}",
                 f"vllm:prefix_cache_hits_total{lab} {self.value // 2}",
                 f"process_start_time_seconds {self.started}"]
        if self.late_n:
            late = '{engine="0",model_name="late"}'
            lines += [f"vllm:prefix_cache_queries_total{late} {100 * self.late_n}",
                      f"vllm:prefix_cache_hits_total{late} {50 * self.late_n}"]
        return ("\n".join(lines) + "\n").encode()

    def start(self) -> None:
        engine = self

        class Handler(ExpositionHandler):
            def exposition(self) -> bytes:
                return engine.body()

        self.server = HTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def first_value_after(self, t: float) -> int:
        return next(v for ts, v in self.log if ts > t)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


class Prom:
    def __init__(self, tmp: Path, targets_file: Path) -> None:
        self.bin = need_binary("prometheus")
        self.tmp, self.port = tmp, free_port()
        (tmp / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: engines\n"
            f"    file_sd_configs: [{{files: ['{targets_file}'], refresh_interval: 1s}}]\n")
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.bin, f"--config.file={self.tmp / 'prometheus.yml'}", f"--storage.tsdb.path={self.tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--query.lookback-delta=10s"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: urllib.request.urlopen(self.url + "/-/ready", timeout=2).status == 200, 60,
                   "prometheus")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)


def targets(path: Path, *engines: Engine) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("[{targets: [" + ", ".join(f"'{e.target}'" for e in engines) + "]}]\n")
    tmp.replace(path)   # atomic: Prometheus never reads half a file


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """One timeline for the whole matrix (about 90 s):

    P1 scrapes ``old`` (running for an hour), ``new`` (configured, started 5 s
    later) and ``readd`` (running for an hour; removed from the targets for
    GAP_S, then added again). P2 scrapes ``restart`` (running for an hour) and
    is itself stopped for GAP_S and started again on the same TSDB."""
    tmp = tmp_path_factory.mktemp("booking")
    now = time.time()
    old, readd, restart = (Engine(now - 3600, LIFETIME) for _ in range(3))
    new = Engine(0.0, 0)
    for e in (old, readd, restart):
        e.start()
    (tmp / "p1").mkdir()
    (tmp / "p2").mkdir()
    t1, t2 = tmp / "p1" / "targets.yml", tmp / "p2" / "targets.yml"
    targets(t1, old, new, readd)
    targets(t2, restart)
    p1, p2 = Prom(tmp / "p1", t1), Prom(tmp / "p2", t2)
    try:
        p1.start()
        p2.start()
        t_prom = time.time()
        time.sleep(5)
        new.started = time.time()
        new.start()
        time.sleep(10)
        t_cut = time.time()      # readd leaves P1's targets; P2 stops
        targets(t1, old, new)
        p2.stop()
        # Prometheus applies a changed target file after its discovery throttle (about 5 s here,
        # longer on a busy machine: a run once went on scraping readd for most of the gap), so
        # readd's gap starts at its last scrape, not at the file's change, and ends at its next.
        wait_until(lambda: time.time() - readd.log[-1][0] > 3, 120, "P1 dropping the removed target")
        t_gone = readd.log[-1][0]
        time.sleep(max(0.0, t_cut + 5 - time.time()))
        old.late = True          # 20 s of scrapes of old before: up == 1 a step before it shows
        time.sleep(max(0.0, max(t_cut, t_gone) + GAP_S - time.time()))
        t_back = time.time()
        targets(t1, old, new, readd)
        p2.start()
        wait_until(lambda: readd.log[-1][0] > t_back, 120, "P1 scraping the re-added target")
        time.sleep(12)
        for e in (old, new, readd, restart):
            e.frozen = True      # every later scrape repeats the last values
        time.sleep(3)
        yield {"p1": p1.url, "p2": p2.url, "t_prom": t_prom, "t_cut": t_cut, "t_gone": t_gone, "t_back": t_back,
               "end": time.time(), "old": old, "new": new, "readd": readd, "restart": restart}
    finally:
        p1.stop()
        p2.stop()
        for e in (old, new, readd, restart):
            e.stop()


def booked(url: str, engine: Engine, start: float, end: float, model: str = "tiny",
           unseen_before: float | None = None) -> tuple[float, float]:
    src = PrometheusSource(url, scrape_interval=1, lookback_s=10)
    if unseen_before is not None:   # the range's first point must not reach the samples before the gap
        step, q0 = src._counter_grid(start, end)
        assert q0 - counter_window(step, 10) > unseen_before
    df = src.engine_frame("engine_prefix", start, end)
    got = df[(df.instance == engine.target) & (df.model == model)]
    return float(got.queries.sum()), float(got.hits.sum())


def test_engine_started_inside_the_range_counts_whole(world):
    new = world["new"]
    assert new.started > world["t_prom"]
    assert booked(world["p1"], new, world["t_prom"] - 30, world["end"]) == (new.value, new.value // 2)


def test_a_new_label_set_on_a_running_engine_counts_from_zero(world):
    old = world["old"]
    assert booked(world["p1"], old, world["t_prom"] - 30, world["end"], model="late") == \
        (100 * old.late_n, 50 * old.late_n)


def test_engine_started_before_prometheus_books_only_what_prometheus_saw(world):
    old = world["old"]
    seen = old.value - old.first_value_after(world["t_prom"] - 1)   # increments between scrapes
    assert booked(world["p1"], old, world["t_prom"] - 30, world["end"]) == (seen, seen // 2)


def test_prometheus_restarted_after_a_gap_does_not_book_the_lifetime(world):
    e = world["restart"]
    seen = e.value - e.first_value_after(world["t_back"])
    queries, _ = booked(world["p2"], e, world["t_back"], world["end"], unseen_before=world["t_cut"] + 1)
    assert queries == seen < 100 * 20


def test_a_target_re_added_does_not_book_the_lifetime(world):
    e = world["readd"]
    # the gap was one: no scrape of readd between its last before the removal and the re-adding
    assert not [ts for ts, _ in e.log if world["t_gone"] < ts < world["t_back"]]
    seen = e.value - e.first_value_after(world["t_back"])
    # (a sample is stamped when its scrape starts, at or before the time the engine served it)
    queries, _ = booked(world["p1"], e, world["t_back"], world["end"], unseen_before=world["t_gone"])
    assert queries == seen < 100 * 20
