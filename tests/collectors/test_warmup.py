import pytest
from warmscope.collectors import InstrumentedCache, request_context
from warmscope.model import schema
from warmscope.model.schema import ATTR

from tests.helpers import total


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def test_run_record_costs_and_status(make_tel):
    clock = Clock()
    tel = make_tel(clock=clock)
    with tel.warmup("static_topk", layer="prefix_kv", tenant="acme", trigger="replica_start") as run:
        clock.t += 30
        for i in range(5):
            run.warmed(f"kv:{i}", nbytes=100, gpu_s=0.5)
        run.add_gpu_seconds(1.0)
        run.set_memory(4096)
    tel.flush()
    runs = tel.store.frame("warmup_runs")
    assert len(runs) == 1
    r = runs.iloc[0]
    assert (r.status, r.strategy, r.layer, r.tenant, r.trigger) == ("ok", "static_topk", "prefix_kv", "acme",
                                                                     "replica_start")
    assert (r.started, r.ended, r["keys"], r["bytes"], r.gpu_s, r.memory_bytes) == (1000.0, 1030.0, 5, 500, 3.5, 4096)
    assert total(tel.reader, schema.WARMUP_RUNS.name, {ATTR.STATUS: "ok"}) == 1
    assert total(tel.reader, schema.WARMUP_KEYS.name) == 5
    assert total(tel.reader, schema.WARMUP_GPU_TIME.name) == 3.5
    assert total(tel.reader, schema.WARMUP_ACTIVE.name) == 0


def test_active_gauge_is_up_while_running(make_tel):
    tel = make_tel()
    with tel.warmup("none", layer="lora"):
        assert total(tel.reader, schema.WARMUP_ACTIVE.name) == 1


def test_failing_run_is_recorded_as_error_and_exception_propagates(make_tel):
    tel = make_tel()
    with pytest.raises(ValueError):
        with tel.warmup("static_topk", layer="prefix_kv"):
            raise ValueError("secret key text kv:42 in message")
    tel.flush()
    r = tel.store.frame("warmup_runs").iloc[0]
    assert r.status == "error" and r.error == "ValueError"  # no message: it may hold key text


def test_precision_inputs_first_hit_and_first_miss(make_tel):
    clock = Clock()
    tel = make_tel(clock=clock)
    backend = {}
    kv = InstrumentedCache(backend, layer="prefix_kv", telemetry=tel)
    with tel.warmup("static_topk", layer="prefix_kv", tenant="t") as run:
        for k in ("kv:a", "kv:b", "kv:c"):
            backend[k] = 1
            run.warmed(k, ttl_s=600)
    del backend["kv:c"]  # evicted before anyone read it
    with request_context(tenant="t", telemetry=tel):
        clock.t = 1010
        kv.get("kv:a")
        clock.t = 1020
        kv.get("kv:a")
        kv.get("kv:c")
    tel.flush()
    w = tel.store.frame("warmed_keys").set_index("family")
    assert len(w) == 3
    rows = tel.store.frame("warmed_keys")
    hit = rows[rows.hits > 0]
    assert len(hit) == 1 and hit.iloc[0].first_hit_at == 1010 and hit.iloc[0].hits == 2
    missed = rows[rows.first_miss_at.notna()]
    assert len(missed) == 1 and missed.iloc[0].first_miss_at == 1020
    # Precision = warmed keys hit at least once = 1 / 3.
    assert (rows.hits > 0).mean() == pytest.approx(1 / 3)


def test_recall_window_records_keys_seen_after_the_run(make_tel):
    clock = Clock()
    tel = make_tel(clock=clock, early_window_s=60)
    kv = InstrumentedCache({}, layer="prefix_kv", telemetry=tel)
    with tel.warmup("static_topk", layer="prefix_kv", tenant="t") as run:
        run.warmed("kv:1")
        run.warmed("kv:2")
    with request_context(tenant="t", telemetry=tel):
        clock.t += 10
        for k in ("kv:1", "kv:1", "kv:3", "kv:4"):
            kv.get(k)
    with request_context(tenant="other", telemetry=tel):
        kv.get("kv:9")  # out of the run's tenant scope
    clock.t += 100  # window closed
    with request_context(tenant="t", telemetry=tel):
        kv.get("kv:5")
    tel.flush()
    early = tel.store.frame("early_keys")
    assert len(early) == 3
    assert early.lookups.sum() == 4
    warmed = set(tel.store.frame("warmed_keys").key_hash)
    # Recall = early keys that had been warmed = 1 of 3.
    assert early.key_hash.isin(warmed).sum() == 1


def test_a_recall_window_open_at_close_is_written_under_a_clock_that_stands_still(make_tel):
    # A simulated clock stands still while the pipeline closes: the window cut at the clock
    # (until == now) is written at close, not left behind and counted dropped (it was, for every
    # warm-up whose window was still open at the end of a simulated span)
    clock = Clock()
    tel = make_tel(clock=clock, early_window_s=600)
    kv = InstrumentedCache({}, layer="prefix_kv", telemetry=tel)
    with tel.warmup("static_topk", layer="prefix_kv", tenant="t") as run:
        run.warmed("kv:1")
    clock.t += 10
    with request_context(tenant="t", telemetry=tel):
        for k in ("kv:1", "kv:2", "kv:2"):
            kv.get(k)
    store = tel.store
    tel.close()
    early = store.frame("early_keys")
    assert sorted(early.lookups) == [1, 2]  # kv:1 once, kv:2 twice
    assert tel.aggregator.dropped.get("store", 0) == 0


def test_keys_read_counter_gives_precision_in_prometheus_terms(make_tel):
    clock = Clock()
    tel = make_tel(clock=clock)
    backend = {}
    kv = InstrumentedCache(backend, layer="prefix_kv", telemetry=tel)
    with tel.warmup("static_topk", layer="prefix_kv", tenant="t") as run:
        for k in ("kv:a", "kv:b", "kv:c", "kv:d"):
            backend[k] = 1
            run.warmed(k)
    del backend["kv:d"]
    with request_context(tenant="t", telemetry=tel):
        kv.get("kv:a")
        kv.get("kv:a")
        kv.get("kv:b")
        kv.get("kv:d")  # evicted: a miss, never read while warm
        backend["kv:d"] = 1
        kv.get("kv:d")  # a hit, but on a refilled entry
    read = total(tel.reader, schema.WARMUP_KEYS_READ.name)
    warmed = total(tel.reader, schema.WARMUP_KEYS.name)
    assert (read, warmed) == (2, 4)
