"""Prometheus and VictoriaMetrics sizing: series, samples and bytes on disk.

    python -m bench.bench_metrics_store [--seconds 120] [--scrape-s 2] [--rps 20] [--tenants 8]

A real Prometheus scrapes the collectors' exporter while the simulator runs in
real time (three pools of two replicas, the demo's label sets) and remote-writes
every sample to a real VictoriaMetrics, as ``docker-compose.yml`` does. At the
end: the series count and samples ingested (each server's own counters), and
the bytes on disk — Prometheus's data written as a block by a TSDB snapshot
(its compressed on-disk form; the write-ahead log is reported apart), and
VictoriaMetrics's storage folder after a forced flush (its compressed parts).
From these: bytes per sample, bytes per series-day at a 15 s scrape interval,
and per million requests.

Series depend on label sets, not traffic: a million more requests over the same
tenants, layers, families, variants and models add samples to the same series
(as many as the scrape interval gives), no series. Loopback only, bounded in
time (``--seconds`` of traffic plus start-up and flushes).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.otel import build_provider, stop_server
from warmscope.simulator import SimConfig, Simulation

from bench.redis_cluster import free_port


def _get(url: str, method: str = "GET") -> Any:
    req = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(req, timeout=30) as r:
        body = r.read()
    try:
        return json.loads(body)
    except ValueError:
        return body.decode()


def _wait(check: Any, what: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{what} did not come up within {timeout:.0f} s")


def _samples(url: str, window_s: float) -> int:
    """Samples of the job's series over the last ``window_s`` (a range selector, counted here: a
    count_over_time over many metric names would collide once their names are dropped)."""
    sel = urllib.parse.quote(f'{{job="warmscope"}}[{int(window_s)}s]')
    return sum(len(r["values"]) for r in _get(f"{url}/api/v1/query?query={sel}")["data"]["result"])


def _series(url: str, start: float, end: float) -> list[dict[str, str]]:
    """The job's series (label sets) seen in [start, end]."""
    sel = urllib.parse.quote('{job="warmscope"}')
    return list(_get(f"{url}/api/v1/series?match[]={sel}&start={start:.0f}&end={end:.0f}")["data"])


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description="Series, samples and bytes on disk in Prometheus and VictoriaMetrics "
                                             "for the collectors' metrics.")
    ap.add_argument("--seconds", type=float, default=120.0, help="seconds of real-time simulated traffic")
    ap.add_argument("--scrape-s", type=float, default=2.0, help="scrape interval (s)")
    ap.add_argument("--rps", type=float, default=20.0, help="simulated requests per second (mean)")
    ap.add_argument("--tenants", type=int, default=8, help="simulated tenants")
    args = ap.parse_args()
    prom_bin, vm_bin = shutil.which("prometheus"), shutil.which("victoria-metrics") or shutil.which(
        "victoria-metrics-prod")
    if not prom_bin:
        raise SystemExit("prometheus is not installed; run scripts/test.sh (it installs it with apt-get)")
    tmp = Path(tempfile.mkdtemp(prefix="ws-bench-metrics-"))
    exporter_port, prom_port, vm_port = free_port(), free_port(), free_port()
    prom_url, vm_url = f"http://127.0.0.1:{prom_port}", f"http://127.0.0.1:{vm_port}"
    procs: list[subprocess.Popen[bytes]] = []
    provider = server = None
    print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    t_start = time.time()
    try:
        if vm_bin:
            procs.append(subprocess.Popen([vm_bin, f"-storageDataPath={tmp / 'vmdata'}",
                                           f"-httpListenAddr=127.0.0.1:{vm_port}", "-retentionPeriod=1"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
            _wait(lambda: urllib.request.urlopen(vm_url + "/health", timeout=2).status == 200, "victoria-metrics")
        remote = (f"remote_write:\n  - url: {vm_url}/api/v1/write\n"
                  "    queue_config: {batch_send_deadline: 1s}\n") if vm_bin else ""
        (tmp / "prometheus.yml").write_text(
            f"global: {{scrape_interval: {args.scrape_s:g}s}}\n"
            f"scrape_configs:\n  - job_name: warmscope\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{exporter_port}']}}]\n" + remote)
        procs.append(subprocess.Popen([prom_bin, f"--config.file={tmp / 'prometheus.yml'}",
                                       f"--storage.tsdb.path={tmp / 'tsdb'}", "--web.enable-admin-api",
                                       f"--web.listen-address=127.0.0.1:{prom_port}"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        _wait(lambda: urllib.request.urlopen(prom_url + "/-/ready", timeout=2).status == 200, "prometheus")
        provider, server = build_provider(CollectorConfig.load(env={}, exporter="prometheus",
                                                               prometheus_port=exporter_port))
        cfg = SimConfig.load(hours=args.seconds / 3600, rps=args.rps, tenants=args.tenants, tick_s=2.0,
                             peak_warmup_at_h=-1)
        sim = Simulation(cfg, tmp / "sim.sqlite", meter_provider=provider, realtime=True, speed=1.0)
        summary = sim.run()
        time.sleep(3 * args.scrape_s)  # the last values get scraped
        t_end = time.time()
        labelsets = _series(prom_url, t_start - 60, t_end)
        series = len(labelsets)
        window = time.time() - t_start + 60  # everything since the servers started
        samples = _samples(prom_url, window)
        wal = _du(tmp / "tsdb" / "wal")
        snap = _get(f"{prom_url}/api/v1/admin/tsdb/snapshot", method="POST")["data"]["name"]
        block = _du(tmp / "tsdb" / "snapshots" / snap)
        reqs = summary.requests
        span_s = args.seconds
        print(f"traffic: {reqs:,} requests in {span_s:.0f} s ({cfg.tenants} tenants, pools {', '.join(cfg.arms)}, "
              f"{cfg.replicas} replicas each), scraped every {args.scrape_s:g} s", flush=True)

        def report(name: str, n_series: float, n_samples: float, nbytes: int, extra: str) -> None:
            per_sample = nbytes / n_samples if n_samples else float("nan")
            series_day = per_sample * 86400 / 15
            print(f"{name}: {n_series:,.0f} series, {n_samples:,.0f} samples, {nbytes / 2**20:.2f} MiB on disk "
                  f"= {per_sample:.2f} bytes/sample{extra}; at a 15 s scrape: {series_day / 1024:.1f} KiB per "
                  f"series-day, {series_day * n_series / 2**20:.1f} MiB per day for these series "
                  f"(a day of this traffic shape at 12 rps is about 1M requests)", flush=True)

        report("Prometheus", series, samples, block, f" (TSDB block written by a snapshot; WAL {wal / 2**20:.2f} MiB)")
        if vm_bin:
            def caught_up() -> bool:
                return len(_series(vm_url, t_start - 60, t_end)) >= series
            _wait(caught_up, "remote write to VictoriaMetrics", 60)
            time.sleep(2)
            _get(f"{vm_url}/internal/force_flush")
            time.sleep(2)
            vm_text = _get(f"{vm_url}/metrics")
            inserted = sum(float(line.rsplit(" ", 1)[1]) for line in vm_text.splitlines()
                           if line.startswith('vm_rows_inserted_total{type="promremotewrite"}'))
            print(f"  VictoriaMetrics received {inserted:,.0f} rows by remote write (all of Prometheus's series)")
            vm_series = len(_series(vm_url, t_start - 60, t_end))
            report("VictoriaMetrics", vm_series, _samples(vm_url, window), _du(tmp / "vmdata" / "data"),
                   " (storage parts after a forced flush; indexes apart: "
                   f"{_du(tmp / 'vmdata' / 'indexdb') / 2**20:.2f} MiB)")
        else:
            print("VictoriaMetrics: not installed (victoria-metrics); skipped")
        # Series per label: what multiplies the count.
        for label in ("warmscope_tenant", "warmscope_cache_layer", "warmscope_key_family", "warmscope_replica",
                      "warmscope_variant", "gen_ai_request_model"):
            print(f"  distinct {label}: {len({ls.get(label) for ls in labelsets if label in ls})}")
        names = Counter(ls["__name__"] for ls in labelsets)
        print("  most series: " + ", ".join(f"{n} {c:,}" for n, c in names.most_common(5)))
    finally:
        if provider is not None:
            provider.shutdown()
            stop_server(server)
        for p in procs:
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
