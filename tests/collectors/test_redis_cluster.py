"""The Redis sink and source on a real 3-master Redis Cluster: every script's
keys share one slot, A/B moments kept in Redis equal the embedded store's, the
same A/B report comes out of both, retries and concurrent writers count once."""

import threading

import numpy as np
import pandas as pd
import pytest
from warmscope.analysis.ab_report import report_for
from warmscope.collectors import InstrumentedCache, request_context
from warmscope.collectors.redis_sink import AB_SHARDS, RedisSink, ab_tag, is_cluster, key
from warmscope.model import ab_metrics as M
from warmscope.model.records import UNIT_HIST
from warmscope.sources import EmbeddedSource
from warmscope.sources.redis_source import RedisSource

from tests.helpers import assert_same_report

pytestmark = pytest.mark.redis


def _traffic(tel, rng, units, start=0):
    kv = InstrumentedCache({f"k:{i}": 1 for i in range(20)}, layer="prefix_kv", telemetry=tel)
    resp = InstrumentedCache({f"r:{i}": 1 for i in range(5)}, layer="response", telemetry=tel)
    for u in range(start, start + units):
        var = "AB"[u % 2]
        with request_context(tenant="t1", unit=f"s{u}", experiment="exp", variant=var, telemetry=tel):
            for _ in range(int(rng.integers(1, 6))):
                for _ in range(int(rng.integers(1, 4))):
                    kv.get(f"k:{int(rng.integers(0, 40 if var == 'A' else 30))}")
                if u % 3:
                    resp.get(f"r:{int(rng.integers(0, 8))}")
                tel.record_request(latency_s=float(rng.gamma(2.0, 0.3)), ttft_s=float(rng.gamma(2.0, 0.05)),
                                   gpu_s=float(rng.gamma(2.0, 0.1)), conversion=bool(rng.random() < 0.2),
                                   value=3.0, sla_met=bool(rng.random() < 0.9))
        if u % 7 == 0:  # lookups without any request record: a unit all the same
            with request_context(tenant="t1", unit=f"only{u}", experiment="exp", variant=var, telemetry=tel):
                kv.get("k:1")


def _both(make_tel, tmp_path, url):
    via_redis = make_tel(redis_url=url, store_path=str(tmp_path / "a.sqlite"), side_flush_s=0)
    via_store = make_tel(store_path=str(tmp_path / "b.sqlite"), side_flush_s=0)
    for seed, now, (units, start) in ((1, 1000.0, (120, 0)), (2, 2000.0, (120, 60)), (3, 2900.0, (40, 0))):
        for tel in (via_redis, via_store):  # three flushes; later ones add to units of earlier ones
            _traffic(tel, np.random.default_rng(seed), units, start)
            tel.flush(now=now)
    return via_redis, via_store


def test_cluster_moments_and_report_equal_the_embedded_store(make_tel, tmp_path, redis_cluster, cluster_client):
    via_redis, via_store = _both(make_tel, tmp_path, redis_cluster.url)
    assert via_redis.pending_rows("redis") == 0 and via_redis.aggregator.errors.get("redis", 0) == 0
    assert is_cluster(via_redis.redis_sink.client)
    src = RedisSource(redis_cluster.url)
    emb = EmbeddedSource(str(tmp_path / "b.sqlite"))
    m_r, lm_r = src.moments("exp")
    m_e, lm_e = emb.moments("exp")
    assert len(m_e) == 4  # 2 variants × buckets 900, 1800 (the third flush only adds to existing units)
    key_m = ["variant", "bucket"]
    pd.testing.assert_frame_equal(m_r.sort_values(key_m).reset_index(drop=True),
                                  m_e.sort_values(key_m).reset_index(drop=True), check_dtype=False, rtol=1e-9)
    key_l = ["variant", "bucket", "layer"]
    pd.testing.assert_frame_equal(lm_r.sort_values(key_l).reset_index(drop=True),
                                  lm_e.sort_values(key_l).reset_index(drop=True), check_dtype=False, rtol=1e-9)
    # 180 sessions + 26 lookups-only units (u % 7 == 0 for u < 180) = 206 units
    assert m_r["n"].sum() == 206 == len(src.units("exp"))
    ra = report_for(src, "exp")
    rb = report_for(emb, "exp")
    # request-level SRM: the store counts request metrics, Redis the unit records' requests — the same here
    assert_same_report(ra, rb)


def test_every_key_carries_a_hash_tag_and_each_part_one_slot(make_tel, tmp_path, redis_cluster, cluster_client):
    tel = make_tel(redis_url=redis_cluster.url, side_flush_s=0)
    _traffic(tel, np.random.default_rng(0), 60)
    with tel.warmup("static_topk", layer="prefix_kv", tenant="t1") as run:
        run.warmed("k:1")
    tel.flush(now=7300.0)
    keys = [k.decode() for k in cluster_client.scan_iter("ws:*")]
    untagged = sorted(k for k in keys if "{" not in k)
    assert untagged == ["ws:ab:experiments", "ws:hot:windows", "ws:runs"]
    by_tag: dict[str, set] = {}
    for k in keys:
        if "{" in k:
            tag = k[k.index("{") + 1:k.index("}")]
            by_tag.setdefault(tag, set()).add(cluster_client.keyslot(k))
    assert all(len(slots) == 1 for slots in by_tag.values())
    shards = {t for t in by_tag if t.startswith("ab:exp:")}
    assert len(shards) == AB_SHARDS  # 60+ units fill all 16 shards
    nodes = {cluster_client.get_node_from_key(key(ab_tag("exp", s))).name for s in range(AB_SHARDS)}
    assert len(nodes) == 3  # one experiment's writes spread over the three masters


def test_a_retried_batch_counts_once_and_concurrent_writers_stay_exact(redis_cluster, cluster_client):
    sink = RedisSink(None, redis_cluster.url, 3600, None)
    row = ("e", "A", "u1", 100.0, 100.0, 1, 0.5, 0.25, 0.1, 0, 0.0, 0.2, 1) + (0,) * (len(UNIT_HIST) - 1) + (1,)
    assert sink.write({"ab_units": [row], "ab_lookups": [("e", "A", "u1", "kv", 4, 3)]}, batch_id="b1") == 2
    sink.write({"ab_units": [row], "ab_lookups": [("e", "A", "u1", "kv", 4, 3)]}, batch_id="b1")  # a retry
    src = RedisSource(redis_cluster.url)
    u = src.units("e")
    assert u[["requests", "lookups_kv", "hits_kv"]].values.tolist() == [[1, 4, 3]]
    m, lm = src.moments("e")
    assert m["n"].tolist() == [1] and m["s_latency_sum"].tolist() == [0.5] and lm["q_lookups"].tolist() == [16]

    # Interleaving: writer 2 changes unit u1 after writer 1 read it; writer 1's part is refused and re-read.
    class Slow(RedisSink):
        def _read_units(self, batch, tags):
            got = super()._read_units(batch, tags)
            if not getattr(self, "_done", False):
                self._done = True
                other.write({"ab_units": [row]}, batch_id="other")
            return got

    other = RedisSink(None, redis_cluster.url, 3600, None)
    slow = Slow(None, redis_cluster.url, 3600, None)
    slow.write({"ab_units": [row], "ab_lookups": [("e", "A", "u1", "kv", 1, 1)]}, batch_id="b2")
    assert slow.conflicts == 1
    # Threads: 4 writers × 10 batches on the same 30 units.
    def work(w):
        s = RedisSink(None, redis_cluster.url, 3600, None)
        for b in range(10):
            s.write({"ab_units": [(("e", "B", f"v{i}", 200.0 + b, 200.0 + b, 1, 0.1 * w, 0.01, 0.1, 0, 0.0, 0.1, 1)
                                   + (1,) + (0,) * (len(UNIT_HIST) - 1)) for i in range(30)],
                     "ab_lookups": [("e", "B", f"v{i}", "kv", w + 1, w) for i in range(30)]}, batch_id=f"w{w}b{b}")

    ts = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    u = src.units("e")
    assert u["requests"].sum() == 3 + 4 * 10 * 30  # u1: three writes (b1 once, other, b2); 1,200 on v*
    m, lm = src.moments("e")
    # The moments equal f(totals) summed over units, from the unit rows just read.
    uu = u.sort_values("unit_hash")
    vals = uu[["first_ts", "last_ts", *M.FIELDS, *UNIT_HIST]].to_numpy(float)
    want = M.contributions(vals, np.ones(len(uu)))
    got = m[[c for c in M.COLUMNS]].sum().to_numpy()
    for c, w_, g in zip(M.COLUMNS, want.sum(axis=0), got, strict=True):
        if c not in ("min_first", "max_last"):
            assert g == pytest.approx(w_, rel=1e-9), c
    lw = M.layer_contributions(uu["lookups_kv"].to_numpy(), uu["hits_kv"].to_numpy(), np.ones(len(uu))).sum(axis=0)
    assert lm[list(M.LAYER_COLUMNS)].sum().to_numpy() == pytest.approx(lw, rel=1e-9)
    # v*: each unit got (w+1) lookups from each of 4 writers × 10 batches: 10 × (1+2+3+4) = 100 per unit
    assert (uu.loc[uu.variant == "B", "lookups_kv"] == 100).all()


def test_a_master_killed_mid_run_loses_nothing(make_tel):
    """3 masters with a replica each; the master of one A/B shard is SIGKILLed between flushes: the flush
    fails and is counted, the rows wait, and after the failover every request is there exactly once."""
    from bench.redis_cluster import ClusterUnavailable, LocalCluster

    try:
        c = LocalCluster(masters=3, replicas=1)
    except ClusterUnavailable as e:
        pytest.skip(str(e))
    try:
        tel = make_tel(redis_url=c.url, side_flush_s=0, exporter="none")
        rng = np.random.default_rng(5)
        _traffic(tel, rng, 80)
        tel.flush(now=1000.0)
        assert tel.pending_rows("redis") == 0 and isinstance(tel.redis_sink.client.get_nodes(), list)
        killed = c.kill_master_of(key(ab_tag("exp", 0)))
        _traffic(tel, rng, 80, start=40)
        tel.flush(now=1100.0)  # the dead master's shard fails: counted, kept
        assert tel.aggregator.errors["redis"] >= 1 and tel.pending_rows("redis") > 0
        # node timeout 1 s; the election is slower on a loaded machine
        assert c.wait_failover(key(ab_tag("exp", 0)), timeout=90) != killed
        for t in (1200.0, 1300.0, 1400.0):  # the client learns the new map, then the retry lands
            tel.flush(now=t)
            if not tel.pending_rows("redis"):
                break
        assert tel.pending_rows("redis") == 0
        units = RedisSource(c.live_url).units("exp")
        # 120 sessions + lookups-only units s0, s7, ..., s119 (u % 7 == 0 for u < 120: 18)
        assert len(units) == 120 + 18
        via = make_tel(store_path=str(tel.config.store_path) + ".b", side_flush_s=0)
        rng = np.random.default_rng(5)
        _traffic(via, rng, 80)
        via.flush(now=1000.0)
        _traffic(via, rng, 80, start=40)
        via.flush(now=1100.0)
        want = via.store.units("exp")
        assert units["requests"].sum() == want["requests"].sum() > 0
        assert units["lookups_prefix_kv"].sum() == want["lookups_prefix_kv"].sum()
    finally:
        c.stop()
