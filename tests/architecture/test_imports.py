"""Every module imports as the first import of a fresh interpreter (an import cycle that only
bites in one order shows up here), and the import contract in pyproject.toml holds."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"model": "model", "collectors": "collectors", "sources": "sources",
            "analysis": "analysis", "simulator": "simulator", "app": "app"}
# Streamlit scripts run a page when imported; they are run by Streamlit, not imported. The pages
# themselves (app/dashboard/views/) are modules of functions and are imported here like any other.
SCRIPTS = ("app/dashboard/main.py", "app/dashboard/entries/")


def modules() -> list[str]:
    out = []
    for name, folder in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(SCRIPTS) or path.name == "__main__.py":
                continue
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out.append(".".join(("warmscope", name, *parts)))
    return out


def test_the_module_list_is_complete():
    mods = modules()
    # hand-picked modules from each layer, so an empty or partial walk fails
    for m in ("warmscope.model.records", "warmscope.model.ab_metrics", "warmscope.collectors.pipeline",
              "warmscope.sources.base", "warmscope.sources.prometheus", "warmscope.analysis.rootcause",
              "warmscope.simulator.engine", "warmscope.app.cli.main", "warmscope.app.dashboard.prewarm",
              "warmscope.app.dashboard.views.overview", "warmscope.app.dashboard.views.advisor"):
        assert m in mods
    assert len(mods) == len(set(mods)) > 80


@pytest.mark.slow
def test_every_module_imports_first_in_a_fresh_interpreter():
    def load(mod: str) -> tuple[str, int, str]:
        r = subprocess.run([sys.executable, "-c", f"import {mod}"], capture_output=True, text=True,
                           timeout=120)
        return mod, r.returncode, r.stderr.strip().splitlines()[-1:] and r.stderr.strip().splitlines()[-1]

    with ThreadPoolExecutor(4) as pool:
        failed = [(m, err) for m, rc, err in pool.map(load, modules()) if rc]
    assert not failed, failed


def test_the_import_contract_holds():
    exe = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(exe), "--no-cache", "--config", str(ROOT / "pyproject.toml")], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def test_the_import_contract_sees_the_pages(tmp_path):
    """A page that imports the command line breaks the contract (the pages are a package it sees)."""
    import shutil

    work = tmp_path / "tree"
    for name in ("model", "collectors", "sources", "analysis", "simulator", "app"):
        shutil.copytree(ROOT / name, work / "warmscope" / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    page = work / "warmscope" / "app" / "dashboard" / "views" / "latency.py"
    page.write_text(page.read_text() + "\nfrom warmscope.app.cli import main as _cli  # noqa\n")
    exe = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(exe), "--no-cache", "--config", str(work / "pyproject.toml")], cwd=work,
                       capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(work), "PATH": ""})
    assert r.returncode != 0, r.stdout[-3000:]
    assert "warmscope.app.dashboard.views.latency -> warmscope.app.cli" in r.stdout, r.stdout[-3000:]
