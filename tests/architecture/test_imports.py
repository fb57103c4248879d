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
# the top-level packages importing every module loads besides the project (the children's preload)
_LOADED = """import importlib, sys
prefix = sys.argv[1]
for m in sys.argv[2:]:
    try:
        importlib.import_module(m)
    except BaseException:
        pass
print("\\n".join(n for n in sorted(sys.modules) if "." not in n and n not in (prefix, "__main__")))
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
    loaded = subprocess.run([sys.executable, "-c", _LOADED, "warmscope", *mods], capture_output=True, text=True,
                            timeout=300, check=True).stdout.split()
    assert "pandas" in loaded and not any(m.startswith("warmscope") for m in loaded)
    failed = {m: err for m, (rc, err) in import_each("warmscope", mods, loaded).items() if rc}
    assert not failed, failed


def test_import_each_finds_a_cycle_that_bites_in_one_order(tmp_path):
    """The harness itself, on a package of its own:

    * ``cyc.a`` defines ``f`` and then imports ``g`` from ``cyc.b``; ``cyc.b`` imports ``f`` from
      ``cyc.a`` and then defines ``g``. Imported a first, both load; b first finds a half-made
      that asks b for a ``g`` it has not made yet. In one interpreter, a then b would both pass
      (b comes from the module cache); each in its own child, b fails.
    * ``cyc.late`` imports ``concurrent`` and uses ``concurrent.futures`` at import: it fails in a
      fresh interpreter, and must fail here although another module (``cyc.early``) imported
      ``concurrent.futures`` in the interpreter that found what to preload.
    * ``cyc.hang`` never finishes importing: it is ended and reported, by name, without holding up
      the rest."""
    pkg = tmp_path / "cyc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    return 1\n\nfrom cyc.b import g  # noqa\n")
    (pkg / "b.py").write_text("from cyc.a import f\n\ndef g():\n    return f\n")
    (pkg / "early.py").write_text("import concurrent.futures\n")
    (pkg / "late.py").write_text("import concurrent\n\nPOOL = concurrent.futures.ThreadPoolExecutor\n")
    (pkg / "hang.py").write_text("import threading\n\nthreading.Event().wait()\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    mods = ["cyc.a", "cyc.b", "cyc.early", "cyc.late"]
    loaded = subprocess.run([sys.executable, "-c", _LOADED, "cyc", *mods], capture_output=True, text=True,
                            timeout=60, env=env, check=True).stdout.split()
    assert "concurrent" in loaded and "concurrent.futures" not in loaded
    got = import_each("cyc", [*mods, "cyc.hang"], loaded, env={**env, "WARMSCOPE_IMPORT_LIMIT_S": "2"})
    assert got["cyc.a"] == (0, "") and got["cyc.early"] == (0, "")
    rc, err = got["cyc.b"]
    assert rc == 1 and err.startswith("ImportError") and "cannot import name 'g'" in err, got
    rc, err = got["cyc.late"]
    assert rc == 1 and err.startswith("AttributeError") and "futures" in err, got
    assert got["cyc.hang"][0] == -14, got  # SIGALRM
    # nothing of the project may be preloaded, and only top-level packages: the harness refuses
    for preload, said in ((["cyc"], "cyc modules were loaded before the children"),
                          (["concurrent.futures"], "only top-level packages are preloaded")):
        r = subprocess.run([sys.executable, str(IMPORT_EACH), "cyc", *preload], input="cyc.a\n", capture_output=True,
                           text=True, timeout=60, env=env)
        assert r.returncode != 0 and said in r.stderr, r.stderr


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
