import threading

from warmscope.collectors import InstrumentedCache, request_context
from warmscope.model import schema
from warmscope.model.schema import ATTR

from tests.helpers import total

LOOKUPS = schema.CACHE_LOOKUPS.name


def test_eight_threads_100k_lookups_each_give_exact_totals(make_tel):
    tel = make_tel()
    data = {f"k:{i}": i for i in range(0, 1000, 2)}  # every other key present
    c = InstrumentedCache(data, layer="response", telemetry=tel)
    n_threads, n = 8, 100_000
    start = threading.Barrier(n_threads)
    flushed = []

    def worker(t):
        with request_context(tenant=f"t{t % 2}", unit=f"u{t}", experiment="e", variant="AB"[t % 2],
                             telemetry=tel):
            start.wait()
            for i in range(n):
                c.get(f"k:{i % 1000}")

    def flusher():  # flushes race with the recorders on purpose
        while any(th.is_alive() for th in threads):
            flushed.append(tel.flush(settle=False))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    f = threading.Thread(target=flusher)
    f.start()
    for th in threads:
        th.join()
    f.join()
    tel.flush(settle=True)

    assert total(tel.reader, LOOKUPS) == n_threads * n
    assert total(tel.reader, LOOKUPS, {ATTR.RESULT: "hit"}) == n_threads * n // 2
    assert total(tel.reader, LOOKUPS, {ATTR.TENANT: "t0"}) == n_threads * n // 2
    # The store got the same totals, split over however many flushes ran.
    df = tel.store.frame("lookups")
    assert df["count"].sum() == n_threads * n
    # A/B unit records: swapped under concurrency, still exact.
    units = tel.store.units("e")
    assert len(units) == n_threads
    assert units["lookups_response"].sum() == n_threads * n and units["hits_response"].sum() == n_threads * n // 2
    assert (units["lookups_response"] == n).all()
