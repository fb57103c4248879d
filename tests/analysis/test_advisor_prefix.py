"""The advisor on a one-layer recording of an engine's prefix cache (what `warmscope gateway`
records): the TTFT price of a missed token, the warm-set size and lead time, the prediction
against a top-k warm set, its fidelity check and bad input, and the KV-event classes."""

import math

import numpy as np
import pandas as pd
import pytest
from warmscope.analysis.advisor import (
    NoRecommendation,
    advise_prefix,
    cache_notes,
    cache_shares,
    prefix_only,
    prefix_text,
)
from warmscope.analysis.value import ValueModel, ttft_per_token

# Two tenants on a fresh engine that keeps what it caches: a prefix's first read misses, the later
# ones hit. Tenant a's prefixes are 1000 cached tokens, b's 500; every request adds 40 tokens of
# its own (missed). Requests per prefix:
COUNTS = {"a": [8, 4, 2, 1, 1, 1], "b": [6, 3, 1, 1, 1, 1]}  # 17 + 13 = 30 requests, 12 prefixes
P = {"a": 1000, "b": 500}
OWN = 40
FIXED, PER_TOKEN = 0.02, 1e-4  # TTFT = 0.02 s + 0.1 ms per missed token


def _frames(re_miss: int = 0, misses: pd.DataFrame | None = None):
    hk, units, hit_tok, miss_tok = [], [], {"a": 0, "b": 0}, {"a": 0, "b": 0}
    for t, counts in COUNTS.items():
        for j, c in enumerate(counts):
            m = 1 + (re_miss if (t, j) == ("a", 0) else 0)  # a0 misses again re_miss times
            hk.append(
                {
                    "window": 0.0,
                    "tenant": t,
                    "layer": "prefix_kv",
                    "key_hash": f"{t}{j}",
                    "family": t,
                    "hits": c - m,
                    "misses": m,
                    "err": 0,
                }
            )
            for r in range(c):
                cached = P[t] if r >= m else 0
                hit_tok[t] += cached
                miss_tok[t] += P[t] + OWN - cached
                units.append(
                    {
                        "requests": 1,
                        "ttft_sum": FIXED + PER_TOKEN * (P[t] + OWN - cached),
                        "lookups_prefix_kv": P[t] + OWN,
                        "hits_prefix_kv": cached,
                    }
                )
    lk = pd.DataFrame(
        [
            {
                "ts": 1000.0 + 600 * (res == "miss"),
                "tenant": t,
                "layer": "prefix_kv",
                "result": res,
                "count": v,
                "variant": "",
                "replica": "r0",
            }
            for t in COUNTS
            for res, v in (("hit", hit_tok[t]), ("miss", miss_tok[t]))
        ]
    )
    fr = {"lookups": lk, "hot_keys": pd.DataFrame(hk)}
    if misses is not None:
        fr["misses"] = misses
    return fr, pd.DataFrame(units)


def _slo(v: float) -> ValueModel:
    return ValueModel("slo", 0.001, v, (v / 2, v * 1.5), "a test SLO")


def test_the_ttft_price_of_a_missed_token_is_the_fitted_line():
    _, units = _frames()
    lat = ttft_per_token(units)
    assert lat.per_token_s == pytest.approx(PER_TOKEN) and lat.fixed_s == pytest.approx(FIXED)
    assert lat.units == 30 and lat.ttft(1040) == pytest.approx(0.124)  # 0.02 + 1e-4 · 1040
    # noise around the line: the 95 % interval covers the slope in about 95 % of data sets
    rng, hits = np.random.default_rng(3), 0
    for _ in range(300):
        u = units.assign(ttft_sum=units["ttft_sum"] + rng.normal(0, 0.005, len(units)))
        f = ttft_per_token(u)
        hits += f.ci_low <= PER_TOKEN <= f.ci_high
    # 300 data sets: 285 ± 2·√(300·0.95·0.05) ≈ 285 ± 8 (HC1 is a little liberal with 30 points)
    assert 270 <= hits <= 295
    assert ttft_per_token(units.head(29)).startswith("not enough points: 29 A/B units")
    assert ttft_per_token(None).startswith("no A/B unit records with prefix_kv")


def test_the_warm_set_is_the_prefixes_whose_next_reads_pay_and_the_lead_is_their_prefill():
    fr, units = _frames()
    assert prefix_only(fr)
    # latency priced at v = 0.0005 per request-second, GPU at g = 0.001 per GPU-s: warming a prefix
    # read c times pays when p = 1 − e^−c > g / (g + v) = 2/3, i.e. c ≥ 2 (p(1) = 0.632,
    # p(2) = 0.865): a 8, b 6, a 4, b 3, a 2 -> 5 prefixes
    adv = advise_prefix(fr, units, _slo(0.0005), "slo")
    assert adv.warm_keys == 5 and adv.keys == 12
    # saved on the replay: 1000 + 500 + 1000 + 500 + 1000 = 4000 tokens; lead = 5 · 0.02 s +
    # 4000 · 0.1 ms = 0.5 s
    assert adv.lead_s == pytest.approx(0.5)
    assert adv.prefix_tokens == {"a": pytest.approx(1000), "b": pytest.approx(500)}
    # fidelity: recorded hits (7+3+1)·1000 + (5+2)·500 = 14500 of 17·1040 + 13·540 = 24700 tokens
    assert adv.recorded_hit_rate == pytest.approx(14500 / 24700)
    assert adv.replayed_hit_rate == pytest.approx(14500 / 24700) and adv.re_miss_share == 0
    # gain: Σ s·(p·(g+v) − g), s = 0.1 s (a) or 0.05 s (b)
    g, v = 0.001, 0.0005
    want = sum(
        s * ((1 - math.exp(-c)) * (g + v) - g)
        for s, c in ((0.1, 8), (0.05, 6), (0.1, 4), (0.05, 3), (0.1, 2))
    )
    assert adv.gain == pytest.approx(want)
    # versus the top 2 (a 8, b 6: 1500 tokens): 2500 more tokens hit, of 24700, over 30 requests
    d = adv.versus(2)
    assert d["hit_rate"] == pytest.approx(2500 / 24700)
    assert d["ttft_per_request_s"] == pytest.approx(-PER_TOKEN * 2500 / 30)
    assert d["warm_s"] == pytest.approx(3 * FIXED + PER_TOKEN * 2500)
    # relative to the top 2's TTFT: it misses (24700 − 14500 − 1500) / 30 = 290 tokens per request,
    # 0.02 + 0.029 = 0.049 s; −0.0083333 / 0.049 = −17.0 % (the line is exact: no interval)
    assert d["ttft_relative"] == pytest.approx(-(2500 / 30 * PER_TOKEN) / 0.049)
    assert d["ttft_relative_ci"] == pytest.approx((d["ttft_relative"],) * 2)
    # a rank shared by equal counts is averaged: 7 prefixes read once, 3 of a (1000), 4 of b (500)
    assert adv.outcome_for(7).hit_tokens == pytest.approx(14500 + 4000 + 2 * 5000 / 7)
    assert adv.outcome_for(99).hit_tokens == pytest.approx(14500 + 4000 + 5000)
    text = prefix_text(adv, 2)
    assert "the 5 most requested prefixes; lead time 0.5 s" in text
    assert "read at least 2 times" in text and "no pre-peak trigger" in text


def test_the_objective_moves_the_warm_set_to_its_bounds_and_says_so():
    fr, units = _frames()
    every = advise_prefix(fr, units, _slo(0.01), "slo")  # v ≫ g: every prefix pays
    assert every.warm_keys == 12 and "upper bound, all 12 prefixes" in " ".join(every.notes)
    none = advise_prefix(fr, units, _slo(0.01), "net_gpu_s")  # GPU-s alone: s·(p − 1) < 0
    assert none.warm_keys == 0 and none.gain == 0 and "in GPU-s alone" in none.notes[0]
    dflt = advise_prefix(fr, units, ValueModel("gpu_s", 0.001, 0.0, (0, 0), "no SLO"))
    assert dflt.objective == "net_gpu_s" and dflt.warm_keys == 0
    with pytest.raises(NoRecommendation, match="^No SLO price"):
        advise_prefix(fr, units, ValueModel("gpu_s", 0.001, 0.0, (0, 0), "no SLO"), "slo")


def test_a_recording_that_evicted_or_is_too_small_gets_one_sentence():
    fr, units = _frames(re_miss=4)  # a0 read 8 times, 5 of them missed: 4 re-misses
    # modelled hits stay 14500; recorded lose 4 · 1000: 10500 / 24700 = 42.5 % vs 58.7 %
    with pytest.raises(NoRecommendation, match="4 of 30 requests missed a prefix read before"):
        advise_prefix(fr, units, _slo(0.01), "slo")
    fr, units = _frames()
    for bad, match in (
        ({**fr, "hot_keys": fr["hot_keys"].head(0)}, "^No prefix_kv hot keys"),
        ({**fr, "hot_keys": fr["hot_keys"].head(4)}, "^Too little data: 4 prefixes"),
        ({**fr, "lookups": fr["lookups"].head(0)}, "^No prefix_kv lookups"),
    ):
        with pytest.raises(NoRecommendation, match=match) as e:
            advise_prefix(bad, units, _slo(0.01), "slo")
        assert str(e.value).count(". ") == 0  # one sentence
    with pytest.raises(NoRecommendation, match="^Not enough points: 20 A/B units"):
        advise_prefix(fr, units.head(20), _slo(0.01), "slo")
    assert not prefix_only({"lookups": fr["lookups"].assign(layer="response")})


def _misses(cold: int, evicted: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "miss_class": ["cold", "evicted", "partial"],
            "tokens": [cold, evicted, 900],
            "tenant": "a",
        }
    )


def test_the_kv_event_classes_say_cache_too_small_or_size_the_warm_set_on_cold_misses():
    # evicted 800 of 6800 non-partial missed tokens = 11.8 % >= 5 %: the cache is too small
    sh = cache_shares(_misses(6000, 800))
    assert sh == {"cold": pytest.approx(6000 / 6800), "evicted": pytest.approx(800 / 6800)}
    too_small = cache_notes(sh, 3000, 6000)
    assert "12% of the missed prompt tokens were evicted" in too_small[0]
    assert "KV cache is too small" in too_small[0]
    assert "the recommended warm set covers 50% of them" in too_small[1]  # 3000 / 6000
    holds = cache_notes(cache_shares(_misses(6000, 100)), 3000, 6000)
    assert "the cache holds this traffic" in holds[0]  # 100 / 6100 = 1.6 %
    assert cache_shares(None) == {} and cache_shares(_misses(0, 0).head(0)) == {}
    # through the advisor: 5 prefixes save 4000 of the 6000 cold tokens
    fr, units = _frames(misses=_misses(6000, 800))
    adv = advise_prefix(fr, units, _slo(0.0005), "slo")
    assert adv.cache["evicted"] == pytest.approx(800 / 6800)
    assert any("covers 67% of them" in n for n in adv.notes)
    assert any("too small" in n for n in adv.notes)
