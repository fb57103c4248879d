"""The package list, derived from the source folders.

The folders stay at the top of the repository; installed, they live under the
``warmscope`` namespace (``collectors/llm`` -> ``warmscope.collectors.llm``). Every
folder under a source root that holds a ``.py`` file is a package, so a new
subpackage cannot be left out of the wheel (``tests/deploy/test_packaging.py``
installs the wheel in a fresh venv and imports every module). ``rules/`` ships as
data (``warmscope/rules/*.yml``): ``warmscope rules`` and ``warmscope grafana`` read
it beside the installed ``app`` package as they do in a checkout.
Everything else about the project is in ``pyproject.toml``.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
SOURCE_ROOTS = ("model", "collectors", "sources", "analysis", "simulator", "app")


def packages() -> list[str]:
    found = []
    for root in SOURCE_ROOTS:
        for d in sorted([ROOT / root, *(ROOT / root).rglob("*")]):
            if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py")):
                found.append("warmscope." + ".".join(d.relative_to(ROOT).parts))
    return found


setup(
    packages=[*packages(), "warmscope.rules"],
    package_dir={**{f"warmscope.{r}": r for r in SOURCE_ROOTS}, "warmscope.rules": "rules"},
    package_data={"*": ["py.typed"], "warmscope.rules": ["*.yml"]},
)
