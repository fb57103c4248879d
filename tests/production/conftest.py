"""The live stack the production tests share: the simulator in real time,
its collectors exporting on a scrape endpoint that a real Prometheus scrapes
every second."""

from __future__ import annotations

import contextlib
import subprocess
import time
import urllib.request
from pathlib import Path

from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.otel import build_provider, stop_server
from warmscope.collectors.store import EmbeddedStore
from warmscope.simulator import SimConfig, Simulation

from tests.conftest import free_port, need_binary, wait_until


@contextlib.contextmanager
def live_simulation(tmp: Path, prometheus_extra: str = ""):
    """Prometheus (``prometheus_extra``: more of its YAML config, e.g. rule
    files or remote_write) scraping the simulator's 20 s real-time run. Yields
    (Prometheus URL, the run's embedded store, start, end) with the exporter
    still up — a down target's series would go stale — and stops everything
    after."""
    prom_bin = need_binary("prometheus")
    exporter_port, prom_port = free_port(), free_port()
    (tmp / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: warmscope\n    static_configs: [{{targets: ['127.0.0.1:{exporter_port}']}}]\n"
        + prometheus_extra)
    prom = subprocess.Popen([prom_bin, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{prom_port}"
    provider = server = None
    try:
        wait_until(lambda: urllib.request.urlopen(url + "/-/ready", timeout=2).status == 200, 60, "prometheus")
        provider, server = build_provider(CollectorConfig.load(env={}, exporter="prometheus",
                                                               prometheus_port=exporter_port))
        cfg = SimConfig.load(hours=20 / 3600, rps=20.0, tenants=3, replicas=1, tick_s=2.0, peak_warmup_at_h=-1)
        t0 = time.time()
        Simulation(cfg, tmp / "live.sqlite", meter_provider=provider, realtime=True, speed=1.0).run()
        time.sleep(3)  # the last points get scraped
        yield url, EmbeddedStore(tmp / "live.sqlite", readonly=True), t0, time.time()
    finally:
        if provider is not None:
            provider.shutdown()
            stop_server(server)
        prom.terminate()
        prom.wait(10)
