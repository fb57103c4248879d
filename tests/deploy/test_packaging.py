"""The installed project claims only the `warmscope` import name, and the base
install is what the collectors need (no dashboard or analysis stack).

Builds the wheel, installs it into a fresh venv beside a package of the host's
own named `app` (the name a service is most likely to use), and imports both."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # simulates or builds first: tens of seconds on two cores

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "-w", str(out), str(ROOT)], check=True, capture_output=True)
    (whl,) = out.glob("warmscope-*.whl")
    return whl


def test_wheel_has_only_the_warmscope_top_level_name(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"warmscope"}, tops
    assert "warmscope/collectors/__init__.py" in names
    assert "warmscope/app/dashboard/main.py" in names and "warmscope/app/dashboard/views/overview.py" in names
    assert not any(n.startswith("warmscope/__init__") for n in names)  # a namespace: room for plugins
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    base = [ln for ln in text.splitlines() if ln.startswith("Requires-Dist:") and "extra ==" not in ln]
    joined = " ".join(base).lower()
    for heavy in ("streamlit", "plotly", "scipy", "pandas", "prometheus-api-client"):
        assert heavy not in joined, f"{heavy} must come with the [app] extra, not the base install"
    assert "opentelemetry-sdk" in joined


def test_wheel_installs_beside_a_host_package_named_app(wheel, tmp_path):
    env_dir = tmp_path / "host-venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    host = tmp_path / "host-src" / "app"
    host.mkdir(parents=True)
    (host / "__init__.py").write_text("WHO = 'the host service'\n")
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], capture_output=True, text=True)
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
