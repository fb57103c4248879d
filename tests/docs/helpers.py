"""What the documentation tests share: the checkout's paths, the scripts loaded as modules, and the
code blocks of a page."""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def script(name: str) -> ModuleType:
    """``scripts/<name>.py`` imported as a module (scripts/ is not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@dataclass(frozen=True)
class Block:
    page: str  # path under docs/
    line: int  # the opening fence's line, 1-based
    lang: str
    classes: tuple[str, ...]
    code: str

    @property
    def runnable(self) -> bool:
        return "runnable" in self.classes

    def __str__(self) -> str:
        return f"docs/{self.page}:{self.line}"


# ```python {.runnable}   or   ``` {.python .runnable}
FENCE = re.compile(r"^(?P<fence>```+)\s*(?P<lang>[\w+-]*)\s*(?:\{(?P<attrs>[^}]*)\})?\s*$")


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, with their language and classes."""
    out: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i].strip())
        if m is None:
            i += 1
            continue
        attrs = (m["attrs"] or "").split()
        classes = tuple(a[1:] for a in attrs if a.startswith("."))
        lang = m["lang"] or (classes[0] if classes else "")
        end = i + 1
        while end < len(lines) and lines[end].strip() != m["fence"]:
            end += 1
        out.append(Block(str(page.relative_to(DOCS)), i + 1, lang, classes,
                         "\n".join(lines[i + 1 : end]) + "\n"))
        i = end + 1
    return out
