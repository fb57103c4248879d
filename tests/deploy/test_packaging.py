"""What ships is what is tested.

The sdist and the wheel are built from the tree; the wheel holds every module of the
source folders (a subpackage cannot be left out), claims only the `warmscope` import
name, and installed into a fresh venv with no access to the source tree every module
imports, `warmscope --help` runs and a small command writes the shipped rule files. The
base install is what the collectors need (no dashboard or analysis stack). The image's
build context (the Dockerfile's COPY lines, minus .dockerignore) builds the same wheel;
where a container engine runs, the image is built and started."""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds first: tens of seconds on two cores

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = ("model", "collectors", "sources", "analysis", "simulator", "app")
# Streamlit scripts run a page when imported: Streamlit runs them, nothing imports them (the
# two-line page entries; the pages themselves are render() functions in views/).
SCRIPTS = ("app/dashboard/main.py", "app/dashboard/entries/")  # views/ are modules of render()s


def tree_modules() -> set[str]:
    """Every ``.py`` file under the source folders, as its installed path in the wheel."""
    out = set()
    for root in SOURCE_ROOTS:
        for p in (ROOT / root).rglob("*.py"):
            if "__pycache__" not in p.parts:
                out.add("warmscope/" + p.relative_to(ROOT).as_posix())
    return out


def importable(paths: set[str]) -> list[str]:
    mods = []
    for p in sorted(paths):
        if not (p.startswith("warmscope/") and p.endswith(".py")):
            continue
        rel = p.removeprefix("warmscope/")
        if rel.startswith(SCRIPTS) or rel.endswith("__main__.py"):
            continue
        name = p.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
        mods.append(name)
    return mods


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel",
                        "--outdir", str(out), str(ROOT)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    shutil.rmtree(ROOT / "build", ignore_errors=True)  # setuptools' scratch folder in the tree
    (whl,) = out.glob("warmscope-*.whl")
    (sdist,) = out.glob("warmscope-*.tar.gz")
    return {"wheel": whl, "sdist": sdist}


@pytest.fixture(scope="module")
def fresh_venv(dists, tmp_path_factory) -> Path:
    """A new venv with the wheel installed (no dependencies fetched): the dev venv's
    site-packages is on its path *after* its own, as a plain path entry, so the dev venv's
    editable hook (a .pth the site module would have to process) never runs and every
    `warmscope` module comes from the installed wheel."""
    env_dir = tmp_path_factory.mktemp("fresh") / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(dists["wheel"])],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "zz_dev_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return env_dir


def _clean_env(home: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "WARMSCOPE_EXPORTER": "none"}


def test_the_wheel_holds_every_module_of_the_tree_and_the_rules(dists):
    names = set(zipfile.ZipFile(dists["wheel"]).namelist())
    missing = tree_modules() - names
    assert not missing, f"modules left out of the wheel: {sorted(missing)}"
    # a planted subpackage would be found too: the list is derived from the folders
    assert "warmscope/collectors/llm/recorder.py" in names
    rules = {p.name for p in (ROOT / "rules").glob("*.yml")}
    assert rules and {f"warmscope/rules/{n}" for n in rules} <= names
    assert "warmscope/collectors/py.typed" in names


def test_the_sdist_builds_the_same_wheel(dists, tmp_path):
    with tarfile.open(dists["sdist"]) as tf:
        members = {m.split("/", 1)[1] for m in tf.getnames() if "/" in m}
    for need in ("setup.py", "pyproject.toml", "README.md", "LICENSE", "rules/warmscope.rules.yml"):
        assert need in members, need
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(tmp_path), str(dists["sdist"])], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    (whl,) = tmp_path.glob("warmscope-*.whl")
    a = {n for n in zipfile.ZipFile(whl).namelist() if not n.startswith("warmscope-")}
    b = {n for n in zipfile.ZipFile(dists["wheel"]).namelist() if not n.startswith("warmscope-")}
    assert a == b


def test_every_module_imports_from_the_installed_wheel(dists, fresh_venv, tmp_path):
    py = fresh_venv / "bin" / "python"
    mods = importable(set(zipfile.ZipFile(dists["wheel"]).namelist()))
    assert len(mods) > 100 and "warmscope.collectors.openai_client" in mods and "warmscope.collectors.gateway" in mods
    code = (
        "import importlib, json, sys\n"
        f"mods = {mods!r}\n"
        "where = {}\n"
        "for m in mods:\n"
        "    where[m] = importlib.import_module(m).__file__\n"
        "print(json.dumps(where))\n"
    )
    r = subprocess.run([str(py), "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env=_clean_env(tmp_path), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    where = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(where) == set(mods)
    prefix = str(fresh_venv)
    outside = {m: f for m, f in where.items() if not f.startswith(prefix)}
    assert not outside, f"imported from outside the installed wheel: {outside}"
    print(f"\n{len(where)} modules imported from {prefix}, e.g. "
          f"{where['warmscope.collectors.gateway']}")


def test_the_installed_command_runs(fresh_venv, tmp_path):
    exe = fresh_venv / "bin" / "warmscope"
    r = subprocess.run([str(exe), "--help"], cwd=tmp_path, capture_output=True, text=True,
                       env=_clean_env(tmp_path), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "simulate" in r.stdout and "rca" in r.stdout
    out = tmp_path / "rules-out"
    r = subprocess.run([str(exe), "rules", "--runbook-base", "https://wiki.example.org/runbooks",
                        "--out", str(out)], cwd=tmp_path, capture_output=True, text=True,
                       env=_clean_env(tmp_path), timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    written = sorted(p.name for p in out.glob("*.yml"))
    assert written == sorted(p.name for p in (ROOT / "rules").glob("*.yml"))
    assert "https://wiki.example.org/runbooks#" in (out / "warmscope.alerts.yml").read_text()


def test_the_base_install_is_the_collectors_only(dists):
    names = zipfile.ZipFile(dists["wheel"]).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"warmscope"}, tops
    assert not any(n.startswith("warmscope/__init__") for n in names)  # a namespace: room for plugins
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(dists["wheel"]).read(meta).decode()
    base = [ln for ln in text.splitlines() if ln.startswith("Requires-Dist:") and "extra ==" not in ln]
    joined = " ".join(base).lower()
    for heavy in ("streamlit", "plotly", "scipy", "pandas", "prometheus-api-client", "numba"):
        assert heavy not in joined, f"{heavy} must come with the [app] extra, not the base install"
    assert "opentelemetry-sdk" in joined


def test_wheel_installs_beside_a_host_package_named_app(dists, tmp_path):
    env_dir = tmp_path / "host-venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    host = tmp_path / "host-src" / "app"
    host.mkdir(parents=True)
    (host / "__init__.py").write_text("WHO = 'the host service'\n")
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", str(dists["wheel"])], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    code = ("import app, sys; from warmscope import collectors; "
            "import warmscope.collectors.store; "
            "print(app.WHO); print(collectors.__name__); "
            "print(sorted(m for m in ('streamlit', 'pandas', 'scipy', 'plotly') if m in sys.modules))")
    r = subprocess.run([str(py), "-c", code], cwd=tmp_path / "host-src", capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[:3] == ["the host service", "warmscope.collectors", "[]"]
    # the collectors work in that venv: a lookup through an instrumented cache, exporter off
    code = ("import os; os.environ['WARMSCOPE_EXPORTER'] = 'none'; "
            "from warmscope import collectors; tel = collectors.setup(); "
            "c = collectors.InstrumentedCache({}, layer='response'); "
            "print(c.get('k') is None); collectors.shutdown()")
    r = subprocess.run([str(py), "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "True"


# ------------------------------------------------------------------ the image
def docker_context() -> tuple[list[str], list[str]]:
    """The Dockerfile's COPY sources and the .dockerignore patterns."""
    copies: list[str] = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        m = re.match(r"\s*COPY\s+(.+)$", line)
        if m:
            copies.extend(m.group(1).split()[:-1])
    ignore = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
              if ln.strip() and not ln.startswith("#")]
    return copies, ignore


def _ignored(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    for pat in patterns:
        pat = pat.removeprefix("**/")
        if any(fnmatch.fnmatch("/".join(parts[:i + 1]), pat) or fnmatch.fnmatch(parts[i], pat)
               for i in range(len(parts))):
            return True
    return False


def test_the_image_context_holds_what_the_build_needs(tmp_path):
    """Copies what the Dockerfile copies (minus .dockerignore) into an empty folder and builds
    the wheel there, as `pip install .` in the image does."""
    copies, ignore = docker_context()
    for need in (*SOURCE_ROOTS, "rules", "setup.py", "pyproject.toml", "README.md", "LICENSE"):
        assert need in copies, f"the Dockerfile does not copy {need}"
    ctx = tmp_path / "context"
    for src in copies:
        p = ROOT / src
        assert p.exists(), f"the Dockerfile copies {src}, which does not exist"
        files = [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file()]
        for f in files:
            rel = f.relative_to(ROOT).as_posix()
            if _ignored(rel, ignore):
                continue
            (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, ctx / rel)
    assert not list(ctx.rglob("__pycache__")) and not (ctx / "rules" / "tests").exists()
    # a subpackage nobody listed anywhere is found by setup.py's walk of the folders
    planted = ctx / "collectors" / "planted_sub"
    planted.mkdir()
    (planted / "probe.py").write_text("X = 1\n")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(tmp_path / "out"), str(ctx)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    (whl,) = (tmp_path / "out").glob("warmscope-*.whl")
    names = set(zipfile.ZipFile(whl).namelist())
    assert tree_modules() <= names and "warmscope/collectors/planted_sub/probe.py" in names


def _docker_engine() -> bool:
    exe = shutil.which("docker")
    if not exe:
        return False
    try:
        return subprocess.run([exe, "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _docker_engine(), reason="no container engine runs here (docker info fails): "
                    "the image is checked through its build context above")
def test_the_image_builds_and_starts(tmp_path):  # pragma: no cover - needs a Docker engine
    tag = "warmscope-test:latest"
    subprocess.run(["docker", "build", "-t", tag, str(ROOT)], check=True, timeout=1800)
    r = subprocess.run(["docker", "run", "--rm", tag, "warmscope", "--help"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "simulate" in r.stdout
