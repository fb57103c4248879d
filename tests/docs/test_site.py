"""The documentation site builds in strict mode, and the README stays a short door into it.

The build runs MkDocs in this process (no child): a broken link, a missing anchor, a page left out
of the navigation or a missing screenshot is a warning, and strict mode turns it into a failure.
"""

from __future__ import annotations

import logging
import re
import shutil
import struct
from pathlib import Path

import pytest
import yaml
from mkdocs.commands.build import build
from mkdocs.config import load_config
from mkdocs.exceptions import Abort

from .helpers import DOCS, ROOT

MKDOCS = ROOT / "mkdocs.yml"
DESIGN_NOTES = ("architecture.md", "kv-events.md", "rootcause.md", "runbooks.md", "scaling.md")
ANALYSE_NOTES = ("whatif.md", "warmup-evaluation.md")


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def strict_build(config_file: Path, site_dir: Path) -> list[str]:
    """Build the site strictly into ``site_dir``; the warnings MkDocs logged (raises Abort when
    there were any)."""
    handler = _Collect()
    log = logging.getLogger("mkdocs")
    log.addHandler(handler)
    try:
        cfg = load_config(str(config_file), strict=True, site_dir=str(site_dir))
        build(cfg)
    except Abort as e:
        raise AssertionError("strict build failed:\n" + "\n".join(handler.messages)) from e
    finally:
        log.removeHandler(handler)
    return handler.messages


def nav_files(nav) -> list[str]:
    out: list[str] = []
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            out += nav_files(value) if isinstance(value, list) else [value]
    return out


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    assert strict_build(MKDOCS, out) == []
    return out


def test_the_site_builds_strictly_with_every_page(site):
    nav = nav_files(yaml.safe_load(MKDOCS.read_text())["nav"])
    on_disk = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(nav) == on_disk  # every page in the navigation once, none missing
    for page in nav:
        stem = page.removesuffix(".md")
        built = site / (stem.removesuffix("index") if stem.endswith("index") else stem + "/") / "index.html"
        assert built.is_file(), page
    home = (site / "index.html").read_text()
    for section in ("Get started", "Instrument", "Operate", "Analyse", "Reference", "Design"):
        assert section in home, section  # a tab of the navigation


def test_design_notes_keep_their_names_and_the_replay_notes_sit_under_analyse():
    nav = yaml.safe_load(MKDOCS.read_text())["nav"]
    files = nav_files(nav)
    for note in DESIGN_NOTES:
        assert (DOCS / note).is_file() and note in files, note
    analyse = next(e["Analyse"] for e in nav if isinstance(e, dict) and "Analyse" in e)
    assert set(ANALYSE_NOTES) <= set(nav_files(analyse))


def test_every_runbook_anchor_the_rules_and_code_use_exists_on_the_built_page(site):
    used = set()
    for folder in ("rules", "analysis", "app", "collectors"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".yml", ".py"):
                used |= set(re.findall(r"runbooks\.md#([a-z0-9-]+)", path.read_text()))
    assert len(used) >= 12, used  # the twelve runbooks the alerts link
    html = (site / "runbooks" / "index.html").read_text()
    ids = set(re.findall(r'id="([^"]+)"', html))
    assert used <= ids, sorted(used - ids)


def test_strict_mode_fails_on_a_broken_anchor_and_a_page_left_out(tmp_path):
    """The check above can fail: the project's validation settings on a two-page site with one
    broken anchor and one page missing from the navigation."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[runbook](runbooks.md#no-such-runbook)\n")
    shutil.copy(DOCS / "runbooks.md", docs / "runbooks.md")
    (docs / "orphan.md").write_text("# Not in the nav\n")
    cfg = yaml.safe_load(MKDOCS.read_text())
    cfg.update(docs_dir=str(docs), nav=[{"Home": "index.md"}, {"Runbooks": "runbooks.md"}])
    cfg.pop("extra_css", None)
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(AssertionError) as err:
        strict_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert "no-such-runbook" in str(err.value) and "orphan.md" in str(err.value)


QUICK_START = (
    "bash scripts/demo.sh     # set up, fill the embedded store with demo data, open the dashboard on :8501",
    "bash scripts/test.sh     # set up (installs redis-server, prometheus, victoria-metrics, chromium and "
    "vLLM's CPU build if missing) and run all tests",
)


def test_readme_is_short_and_keeps_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = [ln for ln in re.findall(r"```bash\n(.*?)```", quick, re.S)[0].splitlines() if ln.strip()]
    assert tuple(commands) == QUICK_START
    assert "Apache" in text and (ROOT / "LICENSE").is_file()
    for extra in ("redis", "client", "gateway", "kv", "grafana", "instrument", "app", "docs", "dev"):
        assert f"`{extra}`" in text, extra  # every extra pyproject.toml defines
    pyproject = (ROOT / "pyproject.toml").read_text()
    defined = set(re.findall(r"^([a-z]+) = \[", pyproject.split("[project.optional-dependencies]")[1]
                             .split("\n[")[0], re.M))
    assert defined == {"redis", "client", "gateway", "kv", "grafana", "instrument", "app", "docs", "dev"}


def test_readme_links_and_image_resolve():
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert any(t.endswith(".png") for t in targets)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert len(local) >= 20
    for t in local:
        assert (ROOT / t).exists(), t


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", head[16:24])


def test_every_dashboard_page_has_a_committed_screenshot_on_the_first_look_page():
    from warmscope.app.dashboard.pages import PAGES

    shots = DOCS / "assets" / "screenshots"
    first_look = (DOCS / "get-started" / "dashboard.md").read_text()
    for p in PAGES:
        png = shots / f"{p.name}.png"
        assert png.is_file(), f"{png} is missing: run python scripts/screenshots.py"
        w, h = _png_size(png)
        assert w >= 1000 and h >= 600 and png.stat().st_size > 20_000, (p.name, w, h)
        assert f"../assets/screenshots/{p.name}.png" in first_look, p.name
    # no screenshot left behind for a page that is gone
    used = "".join(p.read_text() for p in DOCS.rglob("*.md")) + (ROOT / "README.md").read_text()
    for png in shots.glob("*.png"):
        assert png.name in used, f"{png} is not shown on any page"
