"""`warmscope rules --runbook-base URL --out DIR`: the Prometheus rule files
with every alert's ``runbook_url`` pointing at your own copy of
docs/runbooks.md (a wiki page, an internal Git host, …).

The shipped files link to :data:`DEFAULT_RUNBOOK_BASE`; anchors (``#engine-…``)
are kept, so the base must be the URL of a page holding docs/runbooks.md's
headings.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from warmscope.analysis.alert_defs import RUNBOOK_BASE as DEFAULT_RUNBOOK_BASE
from warmscope.app.cli.base import Simple

__all__ = ["DEFAULT_RUNBOOK_BASE", "RULES_DIR", "render", "COMMAND"]

RULES_DIR = Path(__file__).resolve().parents[2] / "rules"  # app/cli/rules.py -> the checkout
_URL = re.compile(
    r'(runbook_url:\s*")(?:' + re.escape(DEFAULT_RUNBOOK_BASE) + r"|docs/runbooks\.md)(#[^\"]+\")"
)


def render(text: str, base: str) -> str:
    """A rule file's text with every runbook link on ``base`` (default or relative links alike)."""
    return _URL.sub(lambda m: m.group(1) + base.rstrip("/#") + m.group(2), text)


def cmd_rules(args: argparse.Namespace) -> int:
    base = args.runbook_base
    if not re.match(r"^https?://[^\s\"]+$", base):
        print(
            "warmscope rules: --runbook-base must be an absolute http(s) URL without spaces or "
            f"quotes, got {base!r}",
            file=sys.stderr,
        )
        return 2
    files = sorted(RULES_DIR.glob("*.yml")) if RULES_DIR.is_dir() else []
    if not files:
        print(
            f"warmscope rules: no rule files found in {RULES_DIR}; run from a warmscope checkout",
            file=sys.stderr,
        )
        return 1
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(
            f"warmscope rules: --out {out} is a file; give a folder (created if missing)",
            file=sys.stderr,
        )
        return 1
    try:
        out.mkdir(parents=True, exist_ok=True)
        for f in files:
            (out / f.name).write_text(render(f.read_text(), base))
    except OSError as e:
        print(f"warmscope rules: cannot write to {out}: {e.strerror}", file=sys.stderr)
        return 1
    print(
        f"wrote {len(files)} rule files to {out} with runbook links on {base.rstrip('/#')}",
        file=sys.stderr,
    )
    return 0


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--runbook-base", required=True, help="absolute URL of your copy of docs/runbooks.md"
    )
    p.add_argument(
        "--out", required=True, help="folder to write the rule files to (created if missing)"
    )


COMMAND = Simple(
    "rules",
    run=cmd_rules,
    arguments=_arguments,
    help="write the Prometheus rule files with runbook links on your own base URL",
    description="Copy rules/*.yml to a folder, pointing every alert's runbook_url at "
    "BASE#anchor (BASE: where your copy of docs/runbooks.md is served).",
    uses_store=False,
)
