"""What `warmscope gateway` and `warmscope warmup` share: checking an engine URL,
importing an optional extra, and setting the collectors up for the command."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any
from urllib.parse import urlparse


def bad_url(cmd: str, flag: str, url: str) -> bool:
    """True (after one message naming the option) when ``url`` is not an http(s) URL."""
    u = urlparse(url)
    if u.scheme in ("http", "https") and u.netloc:
        return False
    print(
        f"warmscope {cmd}: {flag} {url!r} is not an http(s) URL; pass e.g. {flag} http://127.0.0.1:8000",
        file=sys.stderr,
    )
    return True


def load(cmd: str, extra: str, module: str) -> Any:
    """Import ``module`` (of an optional extra); None after one message naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        print(
            f'warmscope {cmd}: {e.name} is not installed; pip install "warmscope[{extra}]"',
            file=sys.stderr,
        )
        return None


def telemetry(args: argparse.Namespace) -> Any:
    """The collectors, writing to ``--store`` when given (else where the configuration says),
    labelled with ``--replica`` when given."""
    from warmscope import collectors

    kw = {"store_path": args.store} if getattr(args, "store", None) else {}
    if getattr(args, "replica", None):
        kw["replica"] = args.replica
    return collectors.setup(**kw)
