"""scripts/screenshots.py takes the site's screenshots: the demo's world simulated small, the
dashboard served and two pages shot in a real Chromium. Simulates and drives a browser: marked
browser and slow."""

from __future__ import annotations

import struct

import pytest

from tests.conftest import need_binary

from .helpers import script

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_the_script_shoots_pages_of_the_registry_from_a_demo_store(tmp_path):
    need_binary("chromium")
    shots = script("screenshots")
    store = shots.demo_store(tmp_path / "demo.sqlite", hours=2.0, rps=2.0, tenants=3, seed=5)
    out = tmp_path / "shots"
    written = shots.take(store, out, pages=["overview", "alerts"])
    assert [p.name for p in written] == ["overview.png", "alerts.png"]  # the registry's order
    for png in written:
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", data[16:24]) == shots.SIZE
        assert len(data) > 20_000, (png, len(data))  # a drawn page, not a blank one
    with pytest.raises(SystemExit, match="no such page: nowhere"):
        shots.take(store, out, pages=["nowhere"])
