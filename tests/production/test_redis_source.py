"""The Redis source reads back what the collectors' Redis sink wrote: the same
hot keys, warm-up runs and A/B units the embedded store gets from the same data."""

import pandas as pd
import pytest
from warmscope.collectors import InstrumentedCache, request_context
from warmscope.sources import SourceError
from warmscope.sources.redis_source import RedisSource

from tests.conftest import free_port

pytestmark = pytest.mark.redis


def _traffic(tel):
    c = InstrumentedCache({"k:1": 1, "k:2": 1}, layer="prefix_kv", telemetry=tel)
    for u in range(6):
        with request_context(tenant="t1", unit=f"u{u}", experiment="exp", variant="AB"[u % 2], telemetry=tel):
            for _ in range(4):
                c.get("k:1")
            c.get("k:2")
            c.get(f"k:{u + 10}")
            tel.record_request(latency_s=0.2 + u / 10, ttft_s=0.05, gpu_s=0.1, conversion=u % 3 == 0, value=2.0,
                               sla_met=True)
    with tel.warmup("static_topk", layer="prefix_kv", tenant="t1") as run:
        run.warmed("k:1", gpu_s=0.5)
        run.warmed("k:99", gpu_s=0.5)


def test_redis_frames_match_the_embedded_store(make_tel, redis_client, redis_server, tmp_path):
    via_redis = make_tel(redis_client=redis_client, store_path=str(tmp_path / "a.sqlite"))
    via_store = make_tel(store_path=str(tmp_path / "b.sqlite"))
    for tel in (via_redis, via_store):
        _traffic(tel)
        tel.flush(now=7300.0)
    src = RedisSource(redis_server.url)
    st = via_store.store
    key = ["tenant", "layer", "key_hash"]
    a = src.frame("hot_keys").sort_values(key).reset_index(drop=True)
    b = st.frame("hot_keys").sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_dtype=False)
    ua = src.units("exp").sort_values("unit_hash").reset_index(drop=True)
    ub = st.units("exp").sort_values("unit_hash").reset_index(drop=True)
    cols = ["variant", "unit_hash", "requests", "latency_sum", "conversions", "value", "lookups_prefix_kv",
            "hits_prefix_kv", "h7"]
    pd.testing.assert_frame_equal(ua[cols], ub[cols], check_dtype=False)
    ra, rb = src.frame("warmup_runs"), st.frame("warmup_runs")
    assert ra[["strategy", "layer", "status", "keys", "gpu_s"]].values.tolist() == \
        rb[["strategy", "layer", "status", "keys", "gpu_s"]].values.tolist()
    wa = src.frame("warmed_keys").sort_values("key_hash")
    wb = st.frame("warmed_keys").sort_values("key_hash")
    assert wa.key_hash.tolist() == wb.key_hash.tolist() and wa.hits.tolist() == wb.hits.tolist()


def test_redis_down_is_a_clear_message():
    src = RedisSource(f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(SourceError, match="is unreachable"):
        src.units("exp")
    with pytest.raises(SourceError, match="does not come from Redis"):
        src.frame("lookups")
