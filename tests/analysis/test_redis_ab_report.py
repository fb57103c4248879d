"""The dashboard's A/B report with WARMSCOPE_REDIS_URL set (the sources ``from_env``
builds) comes from the A/B moments the Redis sink keeps, not from unit rows, and
equals the embedded store's report on the same traffic."""

import pandas as pd
import pytest
from warmscope.analysis.ab_report import report_for
from warmscope.sources import EmbeddedSource, from_env
from warmscope.sources.redis_source import RedisSource

from tests.collectors.test_redis_cluster import _both
from tests.helpers import assert_same_report

pytestmark = pytest.mark.redis


def test_app_report_on_redis_reads_moments_and_equals_the_embedded_one(make_tel, tmp_path, redis_server,
                                                                        redis_client, monkeypatch):
    via_redis, _ = _both(make_tel, tmp_path, redis_server.url)
    assert via_redis.pending_rows("redis") == 0 and via_redis.aggregator.errors.get("redis", 0) == 0
    app = from_env({"WARMSCOPE_REDIS_URL": redis_server.url}, store_path=str(tmp_path / "none.sqlite"))
    emb = EmbeddedSource(str(tmp_path / "b.sqlite"))
    m_a, lm_a = app.moments("exp")
    m_e, lm_e = emb.moments("exp")
    key_m = ["variant", "bucket"]
    pd.testing.assert_frame_equal(m_a.sort_values(key_m).reset_index(drop=True),
                                  m_e.sort_values(key_m).reset_index(drop=True), check_dtype=False, rtol=1e-9)
    # 180 sessions + 26 lookups-only units (u % 7 == 0 for u < 180) = 206 units
    assert m_a["n"].sum() == 206

    def no_unit_rows(self, experiment):
        raise AssertionError("the report read unit rows")

    monkeypatch.setattr(RedisSource, "units", no_unit_rows)  # a spy: the moments path must not need them
    ra = report_for(app, "exp")
    rb = report_for(emb, "exp")
    assert_same_report(ra, rb)
