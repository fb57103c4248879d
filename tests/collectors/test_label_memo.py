"""The label bound runs once per distinct raw value, and ``bounded`` counts distinct values,
not calls (TenantBucketer, LabelCap, through labels.Bounder)."""

from warmscope.collectors import keys, labels
from warmscope.model import schema


def _counting_bound(monkeypatch) -> list[str]:
    calls: list[str] = []
    real = labels.bound

    def spy(value, max_len=labels.MAX_LABEL_LEN):
        calls.append(value)
        return real(value, max_len)

    monkeypatch.setattr(labels, "bound", spy)
    return calls


def test_a_tenant_that_needs_bounding_is_bounded_once(monkeypatch):
    calls = _counting_bound(monkeypatch)
    b = keys.TenantBucketer(allow=["acme"])  # an allow-list: a bounded outsider is never "seen"
    odd, long = 'x"y', "t" * 20_000
    for _ in range(5):
        assert b.label(odd) == schema.OTHER and b.label(long) == schema.OTHER
    assert b.label("acme") == "acme"
    # "acme" from the allow-list, then 'x"y' and the long one once each (10 calls); "acme"
    # as a request value is the allow-list's memoised raw value: no bound
    assert calls == ["acme", odd, long]
    assert b.bounded == 2  # two distinct raw values changed, not 10 calls


def test_first_seen_tenants_keep_their_bounded_label():
    b = keys.TenantBucketer(max_tenants=2)
    long_a, long_b = "a" * 100, "a" * 99 + "b"
    first = [b.label(long_a), b.label(long_b), b.label(long_a), b.label(long_b)]
    assert first[0] == first[2] == labels.bound(long_a) and first[1] == first[3]
    assert first[0] != first[1] and len(first[0]) == 64
    assert b.label("c") == schema.OTHER  # the cap of 2 is taken by the two bounded ones
    assert b.bounded == 2


def test_a_free_label_is_bounded_and_counted_once_per_distinct_value(monkeypatch):
    calls = _counting_bound(monkeypatch)
    cap = keys.LabelCap(limit=4, vocabulary=labels.WARMUP_VOCABULARY)
    for _ in range(3):
        assert cap.label("alice.smith@example.com") == "*"  # the vocabulary rule
        assert cap.label("replica_start") == "replica_start"
        assert cap.label("Ünïcødé trigger") == "*"  # a space: bounded to "_", then the rule
    assert calls.count("alice.smith@example.com") == 1 and calls.count("Ünïcødé trigger") == 1
    assert cap.bounded == 2  # alice... and the Unicode one; replica_start is unchanged


def test_the_memo_is_bounded_and_starts_over(monkeypatch):
    monkeypatch.setattr(labels, "MEMO_CAP", 2)
    calls = _counting_bound(monkeypatch)
    bd = labels.Bounder()
    for v in ("a b", "c d", "a b"):  # "a b" memoised, "c d" memoised: full at 2
        bd(v)
    assert calls == ["a b", "c d"] and bd.bounded == 2
    bd("e f")  # a third value: the memo starts over with it
    bd("a b")  # forgotten: bounded and counted again
    assert calls == ["a b", "c d", "e f", "a b"] and bd.bounded == 4
    monkeypatch.setattr(labels, "MEMO_CAP", 4096)
    monkeypatch.setattr(labels, "MEMO_CHARS", 25_000)
    big = labels.Bounder()
    big("x" * 20_000)
    big("y" * 20_000)  # 40,000 characters would pass 25,000: the memo starts over
    big("x" * 20_000)
    assert calls[-3:] == ["x" * 20_000, "y" * 20_000, "x" * 20_000] and big.bounded == 3
