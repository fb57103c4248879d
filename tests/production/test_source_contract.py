"""One contract for every Source: the embedded store, Redis (real redis-server),
Prometheus (real prometheus scraping the collectors) and the composite the
app builds from WARMSCOPE_* settings answer the same questions with the same
figures for the same traffic.

The same requests go through two pipelines: one writes everything to a
reference store; the other sends metric points to a Prometheus scrape
endpoint and hot keys, A/B units and warm-up runs to Redis. Every source is
then compared with the reference store on the frames it holds, its time
bounds, experiments, A/B units and newest warm-up run."""

from __future__ import annotations

import subprocess
import time
import urllib.parse
import urllib.request

import pandas as pd
import pytest
from warmscope.collectors import InstrumentedCache, request_context
from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.otel import build_provider, stop_server
from warmscope.collectors.pipeline import Telemetry
from warmscope.sources import (
    CompositeSource,
    EmbeddedSource,
    RedisRecords,
    Source,
    SourceError,
    columns,
    from_env,
)
from warmscope.sources.alertmanager import AlertmanagerSource
from warmscope.sources.prometheus import PrometheusSource

from tests.conftest import free_port, need_binary, prom_query, wait_until

pytestmark = [pytest.mark.redis, pytest.mark.prometheus]

KINDS = ["embedded", "redis", "prometheus", "composite"]


def _traffic(tel: Telemetry) -> None:
    """Two tenants, two layers, an experiment with six units, and one warm-up run."""
    kv = InstrumentedCache({"k:1": 1, "k:2": 1}, layer="prefix_kv", telemetry=tel)
    resp = InstrumentedCache({"r:1": 1}, layer="response", telemetry=tel)
    for u in range(6):
        with request_context(tenant="t1" if u < 4 else "t2", unit=f"u{u}", experiment="exp", variant="AB"[u % 2],
                             telemetry=tel):
            for _ in range(4):
                kv.get("k:1")
            kv.get("k:2")
            kv.get(f"k:{u + 10}")
            resp.get("r:1" if u % 2 else f"r:{u}")
            tel.record_request(latency_s=0.2 + u / 10, ttft_s=0.05, gpu_s=0.1, conversion=u % 3 == 0, value=2.0,
                               sla_met=True)
    with tel.warmup("static_topk", layer="prefix_kv", tenant="t1") as run:
        run.warmed("k:1", gpu_s=0.5)
        run.warmed("k:99", gpu_s=0.5)
    tel.record_misses(tenant="t1", engine="r0", family="k:*", classes={"cold": 30, "evicted": 12})
    tel.record_misses(tenant="t2", engine="r0", family="k:*", classes={"elsewhere": 5})
    tel.record_kv_stats(engine="r0", salt="s1", stored=4, reused=9, evicted=2, resident=17)


@pytest.fixture(scope="module")
def world(tmp_path_factory, redis_server):
    tmp = tmp_path_factory.mktemp("contract")
    client = redis_server.client()
    client.flushdb()
    exporter_port, prom_port = free_port(), free_port()
    (tmp / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: warmscope\n    static_configs: [{{targets: ['127.0.0.1:{exporter_port}']}}]\n")
    prom = subprocess.Popen([need_binary("prometheus"), f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{prom_port}"
    made: list[Telemetry] = []
    try:
        wait_until(lambda: urllib.request.urlopen(url + "/-/ready", timeout=2).status == 200, 60, "prometheus")
        provider, server = build_provider(CollectorConfig.load(env={}, exporter="prometheus",
                                                               prometheus_port=exporter_port, replica="r0"))
        common = dict(key_secret="contract-secret", replica="r0", exporter="embedded")
        # Remote: points to the scrape endpoint (and a store of its own, left out below), records to Redis.
        remote = Telemetry(CollectorConfig.load(env={}, store_path=str(tmp / "remote.sqlite"), **common),
                           meter_provider=provider, background=False, redis_client=client)
        ref = Telemetry(CollectorConfig.load(env={}, store_path=str(tmp / "ref.sqlite"), **common),
                        background=False)
        made += [remote, ref]
        t0 = time.time()
        for tel in (remote, ref):
            _traffic(tel)
        now = time.time()
        for tel in (remote, ref):
            tel.flush(now=now)
        want = sum(ref.store.frame("lookups")["count"])

        def scraped() -> bool:
            got = prom_query(url, "sum(warmscope_cache_lookups_total)")
            return bool(got) and float(got[0]["value"][1]) == want

        wait_until(scraped, 30, "prometheus to scrape the lookups")
        (tmp / "remote.sqlite").unlink()  # the composite's store: absent, as in a Prometheus + Redis deployment
        for suffix in ("-wal", "-shm"):
            (tmp / f"remote.sqlite{suffix}").unlink(missing_ok=True)
        sources = {
            "embedded": EmbeddedSource(tmp / "ref.sqlite"),
            "redis": RedisRecords(redis_server.url),
            "prometheus": PrometheusSource(url),
            "composite": from_env({"WARMSCOPE_PROMETHEUS_URL": url, "WARMSCOPE_REDIS_URL": redis_server.url},
                                  store_path=tmp / "remote.sqlite"),
        }
        yield {"sources": sources, "ref": EmbeddedSource(tmp / "ref.sqlite"), "window": (t0 - 60, time.time() + 5),
               "flushed": now}
        provider.shutdown()
        stop_server(server)
    finally:
        for tel in made:
            tel.close()
        client.close()
        prom.terminate()
        prom.wait(10)


def _summary(name: str, df: pd.DataFrame) -> object:
    """What every backend must agree on for a frame (time resolution differs: Prometheus has steps)."""
    if name == "lookups":
        g = df.groupby(["tenant", "layer", "result", "experiment", "variant"])["count"].sum()
        return {k: float(v) for k, v in g.items() if v}
    if name == "requests":
        g = df.groupby(["tenant", "experiment", "variant"])[["requests", "gpu_s", "conversions", "value"]].sum()
        return {k: tuple(round(float(x), 9) for x in row) for k, row in g.iterrows()}
    if name == "hot_keys":
        return sorted(map(tuple, df[["tenant", "layer", "key_hash", "hits", "misses"]].astype(str).values))
    if name == "warmup_runs":
        return sorted(map(tuple, df[["tenant", "layer", "strategy", "status", "keys", "gpu_s"]].astype(str).values))
    if name in ("warmed_keys", "early_keys"):
        return sorted(df["key_hash"])
    if name == "misses":  # no family or request counts in Prometheus
        g = df.groupby(["tenant", "engine", "miss_class"])["tokens"].sum()
        return {k: float(v) for k, v in g.items() if v}
    if name == "kv_blocks":
        g = df.groupby(["engine", "salt"]).agg(
            stored=("stored", "sum"), reused=("reused", "sum"), evicted=("evicted", "sum"),
            resident=("resident", "max"))
        return {k: tuple(float(x) for x in row) for k, row in g.iterrows()}
    raise AssertionError(name)


COMPARED = ("lookups", "requests", "hot_keys", "warmup_runs", "warmed_keys", "misses",
            "kv_blocks")  # early keys: 15 min after a run
HOLDS = {  # what each backend must hold, at least
    "embedded": set(COMPARED),
    "redis": {"hot_keys", "warmup_runs", "warmed_keys"},
    "prometheus": {"lookups", "requests", "misses", "kv_blocks"},
    "composite": set(COMPARED),
}


@pytest.mark.parametrize("kind", KINDS)
def test_every_source_gives_the_reference_figures(world, kind):
    src, ref = world["sources"][kind], world["ref"]
    start, end = world["window"]
    assert isinstance(src, Source)
    assert src.health() is None
    assert HOLDS[kind] <= set(src.provides())
    for name in sorted(HOLDS[kind]):
        lo = start - 3600 if name == "hot_keys" else start  # hot-key windows are stamped with their hour's start
        got, want = src.frame(name, lo, end), ref.frame(name, lo, end)
        assert set(want.columns) <= set(got.columns), (kind, name)
        assert len(want) > 0, name  # the traffic reaches every compared frame
        assert _summary(name, got) == _summary(name, want), (kind, name)


@pytest.mark.parametrize("kind", KINDS)
def test_every_source_gives_the_same_bounds_runs_and_experiments(world, kind):
    src, ref = world["sources"][kind], world["ref"]
    bounds = src.time_bounds()
    assert bounds is not None and bounds[0] <= bounds[1]
    if "lookups" in src.provides():  # the data's time lies inside the bounds
        assert bounds[0] <= world["flushed"] <= bounds[1] + 1e-6
    if "warmup_runs" in src.provides():
        assert src.last_run_start() == pytest.approx(ref.last_run_start())
        assert bounds[0] <= src.last_run_start() <= bounds[1] + 1e-6
    holds_ab = kind != "prometheus"
    assert src.experiments() == (["exp"] if holds_ab else [])
    units, want = src.units("exp"), ref.units("exp")
    if holds_ab:
        cols = ["variant", "unit_hash", "requests", "latency_sum", "conversions", "lookups_prefix_kv",
                "hits_prefix_kv", "lookups_response", "hits_response"]
        key = ["variant", "unit_hash"]
        pd.testing.assert_frame_equal(units[cols].sort_values(key, ignore_index=True),
                                      want[cols].sort_values(key, ignore_index=True), check_dtype=False)
        assert len(want) == 6
    else:
        assert units.empty


def test_the_composite_routes_each_frame_to_its_backend(world):
    comp = world["sources"]["composite"]
    assert isinstance(comp, CompositeSource) and comp.store is None
    assert comp.route("lookups").kind == "prometheus" and comp.route("hot_keys").kind == "redis"
    faults = comp.frame("faults")  # not collected in this deployment: empty, with the canonical columns
    assert comp.route("faults") is None and faults.empty and list(faults.columns) == columns("faults")
    assert comp.describe().startswith("Prometheus · http://127.0.0.1:") and " + Redis · redis://" in comp.describe()


@pytest.mark.parametrize("make, needle", [
    (lambda tmp: EmbeddedSource(tmp / "missing.sqlite"), "does not exist"),
    (lambda tmp: RedisRecords(f"redis://127.0.0.1:{free_port()}/0").experiments(), "is unreachable"),
    (lambda tmp: PrometheusSource(f"http://127.0.0.1:{free_port()}", timeout=2).frame("lookups", 0, 60),
     "is unreachable"),
    (lambda tmp: AlertmanagerSource(f"http://127.0.0.1:{free_port()}", timeout=2).alerts(), "could not be read"),
    (lambda tmp: from_env({}, store_path=tmp / "missing.sqlite").time_bounds(), "does not exist"),
])
def test_every_source_fails_with_one_source_error(tmp_path, make, needle):
    with pytest.raises(SourceError, match=needle):
        make(tmp_path)


def test_a_down_backend_is_reported_by_health_not_raised(tmp_path):
    comp = from_env({"WARMSCOPE_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}, store_path=tmp_path / "no.sqlite")
    problem = comp.health()
    assert problem is not None and "Redis at redis://127.0.0.1:" in problem and "is unreachable" in problem


def test_a_long_lived_composite_sees_a_store_written_or_replaced_after_it_was_built(tmp_path):
    from warmscope.collectors.store import _TABLES, EmbeddedStore

    path = tmp_path / "late.sqlite"
    comp = from_env({}, store_path=path)  # built before the store exists (a dashboard started first)
    with pytest.raises(SourceError, match="does not exist"):
        comp.time_bounds()

    def fill(ts: float) -> None:
        st = EmbeddedStore(path)
        row = {c: "x" for c in _TABLES["lookups"]} | {"ts": ts, "count": 3}
        st.write({"lookups": [tuple(row[c] for c in _TABLES["lookups"])]})
        st.close()

    fill(100.0)
    assert comp.time_bounds() == (100.0, 100.0)
    for p in tmp_path.glob("late.sqlite*"):  # a fresh store in the same place (`demo --fresh`)
        p.unlink()
    fill(500.0)
    assert comp.time_bounds() == (500.0, 500.0)  # the new file, not the deleted one still open
