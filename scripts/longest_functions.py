"""List the longest functions in product code (lines from ``def`` to the last line of the body).

    python scripts/longest_functions.py [ROOT] [--top 10]

ROOT defaults to the repository this script is in; pass another checkout (e.g. an export of an older
commit) to compare. Product code is the packages that install as ``warmscope.*``; tests, benches and
scripts are left out. Nested functions count on their own and inside their parent.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

PACKAGES = ("model", "collectors", "sources", "analysis", "simulator", "app")


def functions(root: Path) -> list[tuple[int, str]]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    end = node.end_lineno or node.lineno
                    out.append((end - node.lineno + 1,
                                f"{path.relative_to(root)}:{node.lineno} {node.name}"))
    return sorted(out, key=lambda t: (-t[0], t[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument("--top", type=int, default=10)
    args = ap.parse_args()
    for n, where in functions(Path(args.root))[: args.top]:
        print(f"{n:5d}  {where}")


if __name__ == "__main__":
    main()
