import pytest
from warmscope.collectors import InstrumentedCache, request_context
from warmscope.model import schema

from tests.helpers import points

LOOKUPS = schema.CACHE_LOOKUPS.name


def _series(make_tel, n_keys, tmp_name, reads=1):
    tel = make_tel(store_path=tmp_name)
    c = InstrumentedCache({}, layer="prefix_kv", telemetry=tel)
    with request_context(tenant="t1", model="m", prompt_tokens=900, telemetry=tel):
        for _ in range(reads):
            for i in range(n_keys):
                c.get(f"chat:session:{i}:turn:{i % 7}")
    tel.flush()
    pts = points(tel.reader, LOOKUPS)
    assert sum(p.value for p in pts) == n_keys * reads
    store_series = tel.store.frame("lookups").drop(columns=["ts", "count"]).drop_duplicates()
    return len(pts), len(store_series), len(tel.store.frame("hot_keys"))


@pytest.mark.slow
def test_a_million_distinct_keys_export_as_many_series_as_ten(make_tel, tmp_path):
    few = _series(make_tel, 10, str(tmp_path / "few.sqlite"), reads=3)
    many = _series(make_tel, 1_000_000, str(tmp_path / "many.sqlite"))
    assert few[0] == many[0] == 1  # one family, one result
    assert few[1] == many[1] == 1
    # Hot keys stay bounded by K, not by the key count.
    assert many[2] <= 100 and few[2] == 10
