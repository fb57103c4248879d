import asyncio
from concurrent.futures import ThreadPoolExecutor

from warmscope.collectors import InstrumentedCache, propagate, request_context
from warmscope.model import schema
from warmscope.model.schema import ATTR

from tests.helpers import total

LOOKUPS = schema.CACHE_LOOKUPS.name


def test_context_follows_asyncio_tasks(make_tel):
    tel = make_tel()
    c = InstrumentedCache({}, layer="response", telemetry=tel)

    async def handle(tenant, n):
        with request_context(tenant=tenant, telemetry=tel):
            for i in range(n):
                await asyncio.sleep(0)
                c.get(f"r:{i}")

    async def main():
        await asyncio.gather(handle("a", 30), handle("b", 50), handle("c", 70))

    asyncio.run(main())
    for t, n in (("a", 30), ("b", 50), ("c", 70)):
        assert total(tel.reader, LOOKUPS, {ATTR.TENANT: t}) == n


def test_context_propagates_into_a_thread_pool(make_tel):
    tel = make_tel()
    c = InstrumentedCache({}, layer="response", telemetry=tel)
    with ThreadPoolExecutor(4) as pool:
        with request_context(tenant="pooled", telemetry=tel):
            futs = [pool.submit(propagate(c.get), f"k:{i}") for i in range(20)]
        futs += [pool.submit(c.get, "k:x")]  # no context: unknown tenant
        [f.result() for f in futs]
    assert total(tel.reader, LOOKUPS, {ATTR.TENANT: "pooled"}) == 20
    assert total(tel.reader, LOOKUPS, {ATTR.TENANT: schema.UNKNOWN}) == 1


def test_nested_contexts_restore_the_outer_one(make_tel):
    tel = make_tel()
    c = InstrumentedCache({}, layer="response", telemetry=tel)
    with request_context(tenant="outer", telemetry=tel):
        with request_context(tenant="inner", telemetry=tel):
            c.get("x:1")
        c.get("x:2")
    assert total(tel.reader, LOOKUPS, {ATTR.TENANT: "inner"}) == 1
    assert total(tel.reader, LOOKUPS, {ATTR.TENANT: "outer"}) == 1


def test_tenants_outside_the_allow_list_become_other(make_tel):
    tel = make_tel(tenants=("gold",))
    c = InstrumentedCache({}, layer="response", telemetry=tel)
    for t in ("gold", "x", "y"):
        with request_context(tenant=t, telemetry=tel):
            c.get("k:1")
    assert total(tel.reader, LOOKUPS, {ATTR.TENANT: "gold"}) == 1
    assert total(tel.reader, LOOKUPS, {ATTR.TENANT: schema.OTHER}) == 2


def test_a_labelling_failure_runs_the_block_unlabelled_and_is_counted(make_tel):
    tel = make_tel()
    c = InstrumentedCache({}, layer="response", telemetry=tel)

    class Unprintable:
        def __str__(self):
            raise ValueError("no text")

    before = tel.aggregator.errors.get("record", 0)
    ran = []
    with request_context(tenant="t", unit="u1", experiment=Unprintable(), telemetry=tel) as ctx:
        ran.append(ctx)
        c.get("k:1")
    assert ran == [tel.default_context]  # the block ran, with the unlabelled context
    assert tel.aggregator.errors.get("record", 0) == before + 1
    assert total(tel.reader, LOOKUPS, {ATTR.TENANT: schema.UNKNOWN}) == 1


def test_an_exception_in_the_block_propagates_and_the_outer_context_comes_back(make_tel):
    tel = make_tel()
    c = InstrumentedCache({}, layer="response", telemetry=tel)
    with request_context(tenant="outer", telemetry=tel):
        try:
            with request_context(tenant="inner", telemetry=tel) as ctx:
                assert ctx.tenant == "inner"
                raise KeyError("from the host")
        except KeyError as e:
            assert e.args == ("from the host",)
        else:  # pragma: no cover
            raise AssertionError("the host's exception was swallowed")
        c.get("x:1")
    c.get("x:2")
    assert total(tel.reader, LOOKUPS, {ATTR.TENANT: "outer"}) == 1
    assert total(tel.reader, LOOKUPS, {ATTR.TENANT: "inner"}) == 0
    assert total(tel.reader, LOOKUPS, {ATTR.TENANT: schema.UNKNOWN}) == 1
