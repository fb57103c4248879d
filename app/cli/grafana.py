"""`warmscope grafana --out DIR`: write the Grafana dashboards (``app/grafana.py``) as JSON files
that Grafana provisions from a folder (docker-compose mounts ``deploy/grafana/dashboards``)."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from warmscope.app.cli.base import Simple
from warmscope.app.cli.http import bad_url, load


def _present(url: str, timeout: float = 10.0) -> Callable[[str], bool]:
    """``name -> bool``: does the Prometheus API at ``url`` hold a series of that name?"""

    def present(name: str) -> bool:
        q = urllib.parse.urlencode({"match[]": name})
        with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/series?{q}", timeout=timeout) as r:
            return bool(json.loads(r.read())["data"])

    return present


def cmd_grafana(args: argparse.Namespace) -> int:
    if not load("grafana", "grafana", "grafana_foundation_sdk"):
        return 2
    from warmscope.app import grafana

    present = None
    if args.prometheus:
        if bad_url("grafana", "--prometheus", args.prometheus):
            return 2
        present = _present(args.prometheus)
        try:
            present("up")
        except (OSError, ValueError, KeyError) as e:
            print(f"warmscope grafana: cannot query {args.prometheus}: {e}", file=sys.stderr)
            return 1
    if Path(args.out).exists() and not Path(args.out).is_dir():
        print(
            f"warmscope grafana: --out {args.out} is a file; give a folder (created if missing)",
            file=sys.stderr,
        )
        return 1
    try:
        written = grafana.write(
            Path(args.out), Path(args.rules) if args.rules else grafana.RULES_DIR, present
        )
    except grafana.GrafanaError as e:
        print(f"warmscope grafana: {e}", file=sys.stderr)
        return 1
    for path, d, missing in written:
        note = (
            f"; {len(missing)} series missing from {args.prometheus}: {', '.join(missing)}"
            if missing
            else ""
        )
        print(f"wrote {path} ({d.title}, {len(d.panels)} panels{note})", file=sys.stderr)
    return 0


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out", required=True, help="folder to write the dashboards to (created if missing)"
    )
    p.add_argument(
        "--rules",
        metavar="DIR",
        help="rule files to check the panels against (default: rules/ of this checkout)",
    )
    p.add_argument(
        "--prometheus",
        metavar="URL",
        help="check which series the panels read are missing from this "
        "Prometheus; dashboards that read missing series open with a text panel naming them",
    )


COMMAND = Simple(
    "grafana",
    run=cmd_grafana,
    arguments=_arguments,
    help="write Grafana dashboards generated from the rules and alert definitions",
    description="Write the overview, engine and KV-miss-class dashboards as Grafana JSON (one "
    "file each), with a datasource variable. Every recorded series a panel reads is checked "
    "against the rule files.",
    uses_store=False,
)
