"""A bad configuration shows one clear error on the page, never a traceback:
a bad ``[analysis]`` table, a bad ``[collectors]`` TOML, a garbage
``WARMSCOPE_REDIS_URL``. Real `streamlit run` on a free loopback port, driven
by Chromium; screenshots in test-output/screenshots/config-*.png."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from warmscope.collectors.store import EmbeddedStore

from tests.conftest import need_binary, streamlit_app

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "test-output" / "screenshots"

CASES = {
    "analysis": ({"WARMSCOPE_CONFIG": "toml"}, "[analysis]\nno_such_setting = 1\n", "no_such_setting"),
    "collectors": ({"WARMSCOPE_CONFIG": "toml"}, "[collectors\nexporter = ", "not valid TOML"),
    "redis-url": ({"WARMSCOPE_REDIS_URL": "garbage"}, "", "WARMSCOPE_REDIS_URL"),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.browser
def test_bad_configuration_shows_one_error_not_a_traceback(tmp_path, case):
    from playwright.sync_api import sync_playwright

    chromium = need_binary("chromium")
    extra, toml, words = CASES[case]
    store = tmp_path / "s.sqlite"
    EmbeddedStore(store).close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMSCOPE_")}
    env["WARMSCOPE_STORE"] = str(store)
    for k, v in extra.items():
        if v == "toml":
            (tmp_path / "warmscope.toml").write_text(toml)
            v = str(tmp_path / "warmscope.toml")
        env[k] = v
    with streamlit_app(env, cwd=tmp_path) as url:
        OUT.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1200, "height": 700})
            for path in ("", "ab"):
                page.goto(f"{url}/{path}", wait_until="networkidle")
                page.wait_for_selector('[data-testid="stAlertContentError"]', timeout=60_000)
                page.wait_for_timeout(500)
                if not path:
                    page.screenshot(path=str(OUT / f"config-{case}.png"))
                assert page.locator('[data-testid="stException"]').count() == 0
                errors = page.locator('[data-testid="stAlertContentError"]')
                assert errors.count() == 1
                assert words in errors.first.inner_text()
            browser.close()
