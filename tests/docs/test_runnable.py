"""Every code block marked runnable (```python {.runnable}, ```bash {.runnable}) runs — those of
Get started and Instrument, and any other page's: each page's blocks in order, in one fresh
folder (a later block reads what an earlier one wrote), with the data directory inside it and
the checkout's `warmscope` first on the PATH. Runs child processes and a short simulation: marked slow."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import DOCS, blocks

SECTIONS = ("get-started", "instrument")  # the sections whose examples must run
RUNNERS = {"python": [sys.executable, "-"], "bash": ["bash", "-euo", "pipefail", "-s"]}


def runnable_pages() -> dict[str, list]:
    pages = {}
    for page in sorted(DOCS.rglob("*.md")):
        found = [b for b in blocks(page) if b.runnable]
        if found:
            pages[str(page.relative_to(DOCS))] = found
    return pages


def test_runnable_blocks_are_marked_the_one_way_and_there_are_some():
    pages = runnable_pages()
    in_sections = [b for page, bs in pages.items() if page.startswith(SECTIONS) for b in bs]
    assert len(in_sections) >= 5, pages
    assert {"instrument/in-process.md", "get-started/simulator.md"} <= set(pages)
    for page in DOCS.rglob("*.md"):
        for b in blocks(page):
            assert set(b.classes) <= {"runnable", b.lang}, f"{b}: unknown class {b.classes}"
            if b.runnable:
                assert b.lang in RUNNERS, f"{b}: no runner for {b.lang!r}"


@pytest.mark.slow
@pytest.mark.parametrize("page", sorted(runnable_pages()))
def test_runnable_blocks_run(page, tmp_path):
    env = dict(os.environ, WARMSCOPE_DATA_DIR=str(tmp_path / "var"), HOME=str(tmp_path),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    for name in ("WARMSCOPE_CONFIG", "WARMSCOPE_STORE", "WARMSCOPE_REDIS_URL", "WARMSCOPE_EXPORTER",
                 "WARMSCOPE_KEY_SECRET"):
        env.pop(name, None)
    for block in runnable_pages()[page]:
        done = subprocess.run(RUNNERS[block.lang], input=block.code, text=True, cwd=tmp_path, env=env,
                              capture_output=True, timeout=540)
        assert done.returncode == 0, f"{block} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
