"""Every module imports as the first of the project's modules in an interpreter (an import cycle
that only bites in one order shows up here; import_each.py forks each from an interpreter that
imported only the standard and third-party modules), and the import contract in pyproject.toml
holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


IMPORT_EACH = Path(__file__).with_name("import_each.py")
# what importing every module loads besides the project's own (the children's preload)
_LOADED = """import importlib, sys
for m in sys.argv[1:]:
    try:
        importlib.import_module(m)
    except BaseException:
        pass
print("\\n".join(n for n in sorted(sys.modules) if n.split(".")[0] not in ("warmscope", "__main__")))
"""


def import_each(prefix: str, mods: list[str], preload: list[str], **kw) -> dict[str, tuple[int, str]]:
    """{module: (exit code, error)} of importing each module first among ``prefix``'s modules
    (import_each.py)."""
    r = subprocess.run([sys.executable, str(IMPORT_EACH), prefix, *preload], input="\n".join(mods) + "\n",
                       capture_output=True, text=True, timeout=600, **kw)
    assert r.returncode == 0, r.stderr[-3000:]
    out = {m: (rc, err) for m, rc, err in map(json.loads, r.stdout.splitlines())}
    assert sorted(out) == sorted(mods), r.stderr[-3000:]
    return out


@pytest.mark.slow
def test_every_module_imports_first_among_the_projects_modules():
    mods = modules()
    loaded = subprocess.run([sys.executable, "-c", _LOADED, *mods], capture_output=True, text=True,
                            timeout=300, check=True).stdout.split()
    assert "pandas" in loaded and not any(m.startswith("warmscope") for m in loaded)
    failed = {m: err for m, (rc, err) in import_each("warmscope", mods, loaded).items() if rc}
    assert not failed, failed


def test_import_each_finds_a_cycle_that_bites_in_one_order(tmp_path):
    """The harness itself: ``cyc.a`` and ``cyc.b`` import each other by name (each fails when
    imported first: the other finds it half-made), ``cyc.ok`` imports one of them only inside a
    function. In one interpreter the second import would succeed from the module cache; forked
    from a preloaded interpreter, each is first and fails."""
    pkg = tmp_path / "cyc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyc.b import g\n\ndef f():\n    return g\n")
    (pkg / "b.py").write_text("from cyc.a import f\n\ndef g():\n    return f\n")
    (pkg / "ok.py").write_text("import json\n\ndef h():\n    from cyc.a import f\n    return f\n")
    got = import_each("cyc", ["cyc.a", "cyc.ok", "cyc.b"], ["json", "cyc_absent"],
                      env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert got["cyc.ok"] == (0, "")
    for m, name in (("cyc.a", "f"), ("cyc.b", "g")):  # a first: b finds a half-made, no f
        rc, err = got[m]
        assert rc == 1 and err.startswith("ImportError") and f"cannot import name '{name}'" in err, got
    # nothing of the project may be preloaded: the harness refuses
    r = subprocess.run([sys.executable, str(IMPORT_EACH), "cyc", "cyc.ok"], input="cyc.a\n", capture_output=True,
                       text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert r.returncode != 0 and "cyc modules were loaded before the children" in r.stderr


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
