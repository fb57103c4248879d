"""Missed tokens over time as a rate over the part of each bucket the data covers: the range's edge
buckets are cut short and read as drops when drawn as counts."""

import pandas as pd
import pytest
from warmscope.analysis.misses import MISS_CLASSES, over_time


def test_edge_buckets_are_rates_over_the_part_they_cover():
    # flushes every 60 s, stamped at their ends, 100 cold tokens each, from 00:01:00 (covering 00:00–00:01) to
    # 00:25:00; 10-min buckets (b, b + 600]: 00:00 holds 10 flushes, 00:10 holds 10, 00:20 holds 5 (to 00:25)
    m = pd.DataFrame({"ts": [60.0 * k for k in range(1, 26)], "miss_class": "cold", "tokens": 100.0})
    t = over_time(m, 600.0)
    cold = t[t.miss_class == "cold"].set_index("ts")
    assert list(cold.tokens) == [1000.0, 1000.0, 500.0]
    assert list(cold.covered_s) == [600.0, 600.0, 300.0]  # the last bucket: 1200 to the newest row, 1500
    assert list(cold.per_min) == pytest.approx([100.0, 100.0, 100.0])  # a steady rate stays level
    # a range whose rows start at 00:05 (the flush covering 00:04–00:05): the first bucket holds 6 flushes,
    # 360 s
    t = over_time(m[m.ts >= 300.0], 600.0)
    cold = t[t.miss_class == "cold"].set_index("ts")
    assert cold.loc[0.0, "tokens"] == 600.0 and cold.loc[0.0, "covered_s"] == 360.0
    assert cold.per_min.tolist() == pytest.approx([100.0, 100.0, 100.0])
    assert set(t.miss_class) == {c for c in MISS_CLASSES if c != "unknown"}  # every class on every bucket
    assert over_time(m.iloc[0:0]).columns.tolist() == ["ts", "miss_class", "tokens", "covered_s", "per_min"]


def test_a_short_last_flush_is_a_rate_over_its_own_seconds():
    # flushes every 60 s to 00:24:00, then a closing flush 5 s later (00:24:05) with 5 tokens: the 00:20 bucket
    # covers 240 + 5 s and holds 400 + 5 tokens: 100 a minute, not a spike (5 tokens over 5 s read alone) and
    # not a drop (405 tokens as a count beside 1,000)
    ts = [60.0 * k for k in range(1, 25)] + [1445.0]
    m = pd.DataFrame({"ts": ts, "miss_class": "cold", "tokens": [100.0] * 24 + [100.0 * 5 / 60]})
    cold = over_time(m, 600.0).query("miss_class == 'cold'").set_index("ts")
    assert cold.loc[1200.0, "covered_s"] == pytest.approx(245.0)
    assert cold.per_min.tolist() == pytest.approx([100.0, 100.0, 100.0])


def test_buckets_are_exact_on_epoch_seconds():
    # flushes every 60 s from 1,796,431,560 (a whole minute; 1,796,431,500 is a multiple of 180): 3-min buckets
    # (b, b + 180] hold three flushes each, 180 s; a stamp on a bucket's end stays in that bucket
    t0 = 1_796_431_500.0
    m = pd.DataFrame({"ts": [t0 + 60.0 * k for k in range(1, 10)], "miss_class": "cold", "tokens": 60.0})
    cold = over_time(m, 180.0).query("miss_class == 'cold'")
    assert cold.ts.tolist() == [t0, t0 + 180, t0 + 360] and cold.tokens.tolist() == [180.0] * 3
    assert cold.covered_s.tolist() == [180.0] * 3 and cold.per_min.tolist() == pytest.approx([60.0] * 3)
