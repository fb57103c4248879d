"""The simulator benchmark's scorer (bench/eval_rca.py ``match``) on hand-built leaf tables."""

import pandas as pd

from bench.eval_rca import expected, match


def _leaves() -> pd.DataFrame:
    # Two models; globex and umbrella are all of qwen's tenants, acme is llama's only tenant.
    rows = [
        ("globex", "qwen", "response"),
        ("globex", "qwen", "prefix_kv"),
        ("umbrella", "qwen", "response"),
        ("umbrella", "qwen", "prefix_kv"),
        ("acme", "llama", "response"),
        ("acme", "llama", "prefix_kv"),
        ("initech", "llama", "prefix_kv"),
    ]
    return pd.DataFrame(rows, columns=["tenant", "model", "layer"])


def _e(**kv: str) -> frozenset:
    return frozenset(kv.items())


def test_an_element_selecting_the_leaves_of_two_expected_elements_recalls_both() -> None:
    exp = {_e(tenant="globex", layer="response"), _e(tenant="umbrella", layer="response")}
    # {model=qwen, layer=response} selects rows 0 and 2: exactly the two expected elements.
    assert match({_e(model="qwen", layer="response")}, exp, _leaves()) == (2, 1)


def test_an_element_selecting_more_than_the_expected_leaves_matches_nothing() -> None:
    exp = {_e(tenant="globex", layer="response"), _e(tenant="umbrella", layer="response")}
    # {layer=response} also holds acme's row 4, which no expected element has.
    assert match({_e(layer="response")}, exp, _leaves()) == (0, 0)
    # {model=qwen} also holds the two prefix_kv rows 1 and 3.
    assert match({_e(model="qwen")}, exp, _leaves()) == (0, 0)


def test_an_element_selecting_one_expected_element_of_two_recalls_that_one() -> None:
    exp = {_e(tenant="acme", layer="response"), _e(tenant="globex", layer="response")}
    # {model=llama, layer=response} is row 4 only: acme × response, and not globex.
    pred = {_e(model="llama", layer="response"), _e(tenant="initech")}
    assert match(pred, exp, _leaves()) == (1, 1)


def _kv_leaves(lookups_8192: float) -> pd.DataFrame:
    # Replica a-0's prefix cache in four buckets, plus one response leaf with no bucket and
    # replica a-1's 1024 bucket (not part of a-0's group).
    rows = [
        ("a-0", "prefix_kv", "1024", 300.0),
        ("a-0", "prefix_kv", "2048", 400.0),
        ("a-0", "prefix_kv", "4096", 220.0),
        ("a-0", "prefix_kv", "8192", lookups_8192),
        ("a-0", "response", "", 500.0),
        ("a-1", "prefix_kv", "1024", 900.0),
    ]
    return pd.DataFrame(rows, columns=["replica", "layer", "length_bucket", "lookups"])


# The fixed-length KV trap (min 4096) on a-0: the literal truth is its three short buckets.
_KV_EXP = {_e(replica="a-0", length_bucket=b) for b in ("1024", "2048", "4096")}
_KV_COARSE = _e(replica="a-0", layer="prefix_kv")


def test_fixed_len_kv_literal_buckets_score_even_when_the_coarse_element_would() -> None:
    # Short buckets 300 + 400 + 220 = 920 of 920 + 80 = 1000 prefix lookups: 92 % >= 90 %.
    leaves = _kv_leaves(80.0)
    assert match(set(_KV_EXP), _KV_EXP, leaves) == (3, 3)
    # The coarse element recalls all three; it is one predicted element, right.
    assert match({_KV_COARSE}, _KV_EXP, leaves) == (3, 1)


def test_fixed_len_kv_coarse_element_below_ninety_percent_is_a_false_positive() -> None:
    # 920 of 920 + 120 = 1040: 88.5 % < 90 %, and the 8192 leaf is outside every bucket.
    assert match({_KV_COARSE}, _KV_EXP, _kv_leaves(120.0)) == (0, 0)
    # The literal buckets still score in full there.
    assert match(set(_KV_EXP), _KV_EXP, _kv_leaves(120.0)) == (3, 3)


def test_fixed_len_kv_is_not_lenient_otherwise() -> None:
    leaves = _kv_leaves(80.0)  # 92 %: the coarse element is accepted
    # A proper subset of the buckets recalls only itself: 2 of 3.
    two = {_e(replica="a-0", length_bucket="1024"), _e(replica="a-0", length_bucket="2048")}
    assert match(two, _KV_EXP, leaves) == (2, 2)
    # The unmoved long bucket and the other replica's bucket are false positives: 1 right of 4
    # ({replica=a-0} holds the response leaf and the 8192 one too: no match).
    extra = {
        _KV_COARSE,
        _e(replica="a-0", length_bucket="8192"),
        _e(replica="a-1", length_bucket="1024"),
        _e(replica="a-0"),
    }
    assert match(extra, _KV_EXP, leaves) == (3, 1)
    # The coarse element of the other replica does not stand for a-0's buckets.
    assert match({_e(replica="a-1", layer="prefix_kv")}, _KV_EXP, leaves) == (0, 0)
    # Without a lookups column the share is unknown and only the literal elements score.
    assert match({_KV_COARSE}, _KV_EXP, leaves.drop(columns="lookups")) == (0, 0)


def test_fixed_len_kv_expects_the_literal_buckets_whatever_their_share() -> None:
    # Lookups in the trap window 00:45-01:15 (t0 = 0: 2700 < ts <= 4500) on a-0's prefix cache:
    # short buckets 300 + 400 + 220 = 920 of 1000 (92 %, where only {a-0, prefix_kv} used to be
    # expected); 8192 is above min_tokens, a-1 and the response layer are other leaves, and the
    # 512 row lies before the window.
    rows = [
        (3000.0, "a-0", "prefix_kv", "1024", 300),
        (3000.0, "a-0", "prefix_kv", "2048", 400),
        (4500.0, "a-0", "prefix_kv", "4096", 220),
        (3000.0, "a-0", "prefix_kv", "8192", 80),
        (3000.0, "a-0", "response", "", 500),
        (3000.0, "a-1", "prefix_kv", "512", 900),
        (2000.0, "a-0", "prefix_kv", "512", 50),
    ]
    lookups = pd.DataFrame(rows, columns=["ts", "replica", "layer", "length_bucket", "count"])
    spec = "kv_fixed_len:replica=a-0@00:45-01:15;min_tokens=4096"
    assert expected(spec, lookups, 0.0) == _KV_EXP
