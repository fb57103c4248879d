"""The Hot keys page under AppTest, on a store with hand-written hot-key rows: the top keys' misses
per hot-key window in the caption equal the arithmetic in the comments, and the Misses column says
why hot keys share one count (a miss per replica that lost the key, not per lookup)."""

import json

import pytest

from tests.helpers import page_on_store

T = 1_800_000_000.0  # a multiple of 3600: the hot-key windows start on the hour
H = 3600.0

# window, tenant, layer, key_hash, family, hits, misses, err: two misses a window for the two hot
# keys whatever their hits (two replicas restarting every hour without a warm-up), one for a key
# read in one window only
HOT = [
    *[(T + i * H, "acme", "embedding", "k1", "emb:*", 500 + 100 * i, 2, 0) for i in range(3)],
    *[(T + i * H, "acme", "embedding", "k2", "emb:*", 50 + 10 * i, 2, 0) for i in range(3)],
    (T + H, "acme", "embedding", "k3", "emb:*", 10, 1, 0),
]


def _lookups():
    # the page's range comes from the lookups' time bounds: three hours
    return [
        (T + s, "acme", "embedding", "emb:*", "hit", "", "", "m", "a-0", "1024", 5)
        for s in range(0, int(3 * H), 600)
    ]


@pytest.fixture
def at(tmp_path, monkeypatch):
    return page_on_store(tmp_path / "hot.sqlite", monkeypatch, {"lookups": _lookups(), "hot_keys": HOT}, "hotkeys")


def test_the_top_keys_misses_per_window_and_why(at):
    top = at.dataframe[0].value
    # k1: 500 + 600 + 700 hits + 6 misses = 1,806 lookups; k2: 50 + 60 + 70 + 6 = 186; k3: 10 + 1 = 11
    assert list(top["key_hash"]) == ["k1", "k2", "k3"]
    assert list(top["lookups"]) == [1806, 186, 11]
    assert list(top["misses"]) == [6, 6, 1]
    # per window: k1 6 / 3 = 2.0, k2 6 / 3 = 2.0, k3 1 / 1 = 1.0: median 2.0; k1 and k2 were hot in more than
    # one window: median of 2.0 and 2.0 = 2.0
    assert any(
        c.value.startswith(
            "The 3 top keys miss a median 2.0 times per 1 h hot-key window in which they were counted (from 1.0 "
            "to 2.0; the 2 hot in more than one window, a median 2.0) while their lookups run from 11 to 1,806"
        )
        for c in at.caption
    ), [c.value for c in at.caption]
    help_ = json.loads(at.dataframe[0].proto.columns)["misses"]["help"]
    assert "once per replica after a restart that no warm-up followed" in help_
