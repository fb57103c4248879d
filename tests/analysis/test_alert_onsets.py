"""Alert onsets are dated no earlier than the first data that shows them: a cross-tenant read inside an hourly
hot-key window is dated by the first flush whose hit rate on the leaking layer departs from the hour before, not
by the window's start; a bypass spike by the first flush over the line; and the simulator's two injected faults
are dated within one flush interval (60 s) of their injected start."""

import numpy as np
import pandas as pd
import pytest
from warmscope.analysis.alert_history import alert_history, holding_now, open_alerts
from warmscope.analysis.alerts import bypass_spikes, cross_tenant_reads, leak_onset

from tests.conftest import simulated_store

HK = ["window", "tenant", "layer", "key_hash", "family", "hits", "misses", "err"]
LK = ["ts", "tenant", "layer", "family", "result", "experiment", "variant", "model", "replica", "length_bucket",
      "count"]


def _flushes(spans, layer="response", results=("hit", "miss")):
    """One flush a minute, stamped at the end of its minute; spans: (from, to, share of results[0]), 1000 a flush."""
    rows = []
    for a, b, p in spans:
        for ts in np.arange(a + 60, b + 1, 60.0):
            k = int(round(1000 * p))
            rows.append((ts, "acme", layer, "resp:*", results[0], "", "", "m", "r0", "", k))
            rows.append((ts, "acme", layer, "resp:*", results[1], "", "", "m", "r0", "", 1000 - k))
    return pd.DataFrame(rows, columns=LK)


def _leak(window):
    return pd.DataFrame([(window, "acme", "response", "k1", "resp:*", 3, 0, 0),
                         (window, "globex", "response", "k1", "resp:*", 2, 0, 0),
                         (window - 3600, "acme", "response", "k0", "resp:*", 3, 0, 0)], columns=HK)


def test_a_leak_inside_an_hourly_window_is_dated_by_its_first_flush_not_the_window_start():
    # Window 7200 (02:00), leak from 02:35 (9300 s): the response hit rate 65 % until then, 35 % after.
    lk = _flushes([(0.0, 9300.0, 0.65), (9300.0, 14400.0, 0.35)])
    hk = _leak(7200.0)
    # the flush stamped 9360 (covering 9300–9360) is the first that shows it
    assert leak_onset(lk, ["response"], 7200.0, 3600.0, 14400.0) == 9360.0
    leak = cross_tenant_reads(hk, 3600.0, 14400.0, lk)
    assert leak["first"] == 9360.0 and leak["window"] == 7200.0
    # re-evaluated at 02:10 and 02:30 the leak is not there yet (the window's counts reach past the instant)
    assert cross_tenant_reads(hk, 7200.0 - 3600, 7800.0, lk[lk.ts <= 7800.0], newest=14400.0) is None
    assert cross_tenant_reads(hk, 9000.0 - 3600, 9000.0, lk[lk.ts <= 9000.0], newest=14400.0) is None
    h = alert_history({"hot_keys": hk, "lookups": lk}, 3600.0, 14400.0, every=600.0)
    r = h[h.alert == "CrossTenantCacheRead"].iloc[0]
    assert r.since == 9360.0 and r.fired == 9600.0  # the first evaluation (…, 9000, 9600) after the onset


def test_without_a_flush_that_shows_it_a_leak_is_dated_at_the_windows_end():
    lk = _flushes([(0.0, 14400.0, 0.65)])  # no change in the hit rate
    assert leak_onset(lk, ["response"], 7200.0, 3600.0, 14400.0) == 10800.0  # 7200 + 3600
    assert leak_onset(lk, ["response"], 7200.0, 3600.0, 9000.0) == 9000.0    # window still open: the newest data
    assert leak_onset(None, ["response"], 7200.0, 3600.0, 14400.0) == 10800.0


def test_a_leak_that_began_just_before_its_first_shared_window_is_dated_by_its_first_dip():
    # The leak runs 6600–9000 s: its keys are hot (shared) only from window 7200 on; the hit rate dips when it
    # starts (keys lose their tenant scope: new keys) and again when it ends (they regain it). The window alone
    # would date the end (9060); half a window before it the start shows: the flush stamped 6660.
    lk = _flushes([(0.0, 6600.0, 0.65), (6600.0, 6900.0, 0.35), (6900.0, 9000.0, 0.65),
                   (9000.0, 9300.0, 0.35), (9300.0, 14400.0, 0.65)])
    assert leak_onset(lk, ["response"], 7200.0, 3600.0, 14400.0) == 9060.0
    assert leak_onset(lk, ["response"], 7200.0, 3600.0, 14400.0, lead=1800.0) == 6660.0
    assert cross_tenant_reads(_leak(7200.0), 3600.0, 14400.0, lk)["first"] == 6660.0
    # nothing in the lead: the window's own first dip
    lk2 = _flushes([(0.0, 9300.0, 0.65), (9300.0, 9600.0, 0.35), (9600.0, 14400.0, 0.65)])
    assert leak_onset(lk2, ["response"], 7200.0, 3600.0, 14400.0, lead=1800.0) == 9360.0


def test_a_dip_that_one_noisy_flush_hides_shows_in_three():
    # Flushes alternate 0.60 / 0.70: median 0.65, MAD 0.05, robust sd 1.4826 x 0.05 = 0.0741. A dip to 0.30,
    # 0.35, 0.40 from 7200 s: no flush departs by 6 sd (0.445 > 0.35), but the three's mean departs by
    # 0.30 > 5 x 0.0741 / sqrt(3) = 0.214 and the first by 0.35 > 2.5 x 0.0741 = 0.185: the flush stamped 7260.
    noisy = [(t, t + 60.0, 0.60 if (t // 60) % 2 else 0.70) for t in np.arange(0.0, 7200.0, 60.0)]
    dip = [(7200.0, 7260.0, 0.30), (7260.0, 7320.0, 0.35), (7320.0, 7380.0, 0.40)]
    after = [(t, t + 60.0, 0.60 if (t // 60) % 2 else 0.70) for t in np.arange(7380.0, 10800.0, 60.0)]
    lk = _flushes(noisy + dip + after)
    assert leak_onset(lk, ["response"], 7200.0, 3600.0, 10800.0) == 7260.0
    # the same noise without the dip: no departure, the window's end
    lk0 = _flushes(noisy + [(t, t + 60.0, 0.60 if (t // 60) % 2 else 0.70) for t in np.arange(7200.0, 10800.0, 60.0)])
    assert leak_onset(lk0, ["response"], 7200.0, 3600.0, 10800.0) == 10800.0


def test_a_bypass_spike_is_dated_by_the_first_flush_over_the_line():
    # 20 % of lookups bypass from 3600 s: the flush stamped 3660 shows it; the 5-minute share crosses 5 % at 3720
    lk = _flushes([(0.0, 3600.0, 0.0), (3600.0, 7200.0, 0.2)], results=("bypass", "hit"))
    sp = bypass_spikes(lk, 0.0, 7200.0)
    assert sp.since.tolist() == [3660.0]


def test_holding_now_is_the_historys_last_evaluation():
    lk = _flushes([(0.0, 9300.0, 0.65), (9300.0, 14400.0, 0.35)])
    fr = {"hot_keys": _leak(7200.0), "lookups": lk}
    h = alert_history(fr, 3600.0, 14400.0, every=600.0)
    now = holding_now(fr, 14400.0)
    assert sorted(open_alerts(h).alert) == sorted(now.alert) == ["CrossTenantCacheRead", "HitRateRegression"][:len(now)]
    assert set(open_alerts(h).alert) == set(now.alert)


@pytest.mark.slow
def test_the_simulators_two_faults_are_dated_within_one_flush_of_their_start(tmp_path):
    from warmscope.app.dashboard import background
    from warmscope.simulator import SimConfig
    from warmscope.simulator.faults import parse_fault
    from warmscope.sources import from_env

    path = tmp_path / "two-faults.sqlite"
    # the leak starts 35 minutes into an hourly hot-key window (01:00): the old attribution dated it 01:00
    simulated_store(path, SimConfig.load(hours=2.5, rps=6.0, tenants=4, seed=3),
                    [parse_fault("bypass:tenant=globex,layer=response@00:38-01:10"),
                     parse_fault("tenant_isolation:layer=response@01:35-02:20")], workers=1)
    src = from_env({}, store_path=str(path))
    b = src.time_bounds()
    fr = background.overview_frames(background.source_reader(src), b[0] - 3600, b[1] + 1e-6, None)
    names = {"bypass": "CacheBypassSpike", "tenant_isolation": "CrossTenantCacheRead"}
    faults = src.frame("faults")
    assert sorted(faults.trap) == ["bypass", "tenant_isolation"]
    for f in faults.itertuples():
        h = alert_history(fr, f.start - 1800, min(f.start + 3600, b[1] + 1e-6), every=300.0)
        r = h[h.alert == names[f.trap]].iloc[0]
        # flushes every 60 s, stamped at their end: the first one that shows the fault ends 60 s after its start
        assert f.start < r.since <= f.start + 60.0, (f.trap, r.since - f.start)
        assert r.fired >= r.since


@pytest.mark.slow
@pytest.mark.parametrize("minute", [0, 20, 45])
def test_the_demos_leak_is_dated_at_its_start_whatever_the_minute_it_ends(tmp_path, minute):
    """The demo's span ends at the current minute, so its leak (2.5 h to 1.5 h before the end) starts at any minute
    of an hour: at minute 0 and 45 of the end it starts 30 and 15 minutes into a window; at minute 20, 10 minutes
    before one (its keys are not hot there). The onset is the first flush after its start, every time (it was the
    leak's end, 05:51, or a window's end before)."""
    import dataclasses

    from warmscope.app.cli.main import demo_world
    from warmscope.app.dashboard import background
    from warmscope.sources import from_env

    path = tmp_path / "demo.sqlite"
    cfg, faults = demo_world(6.0, now=1796367600.0 + minute * 60)  # an hour's start, + minute
    simulated_store(path, dataclasses.replace(cfg, rps=3.0, tenants=4, seed=5), faults, workers=1)
    src = from_env({}, store_path=str(path))
    b = src.time_bounds()
    fr = background.overview_frames(background.source_reader(src), b[0] - 3600, b[1] + 1e-6, None)
    f = src.frame("faults").set_index("trap").loc["tenant_isolation"]
    leak = cross_tenant_reads(fr["hot_keys"], b[0], b[1] + 1e-6, fr["lookups"])
    assert f.start < leak["first"] <= f.start + 60.0, (minute, leak["first"] - f.start)
