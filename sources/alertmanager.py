"""Alertmanager source: the alerts that are active now (``/api/v2/alerts``),
as rows of :data:`~warmscope.sources.ALERT_COLUMNS`.

Example::

    src = AlertmanagerSource("http://alertmanager:9093")
    firing = src.alerts()          # origin, alertname, state, severity, summary, runbook_url, since
"""

from __future__ import annotations

import json
import urllib.request
from datetime import datetime
from typing import Any

import pandas as pd
from warmscope.sources.base import ALERT_COLUMNS, SourceBase, SourceError

__all__ = ["AlertmanagerSource", "alert_rows"]


def _ts(text: str | None) -> float:
    if not text:
        return float("nan")
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return float("nan")


def _reason(e: Exception) -> str:
    """``Connection refused`` rather than ``<urlopen error [Errno 111] Connection refused>``."""
    reason = getattr(e, "reason", None)
    reason = getattr(reason, "strerror", None) or reason or getattr(e, "strerror", None) or e
    return str(reason)


def alert_rows(origin: str, alerts: list[dict[str, Any]]) -> pd.DataFrame:
    """Alerts as Alertmanager (v2) or Prometheus (``/api/v1/alerts``) lists them, as one frame."""
    rows = []
    for a in alerts:
        lab, ann = a.get("labels", {}) or {}, a.get("annotations", {}) or {}
        state = a.get("state")
        if isinstance(
            a.get("status"), dict
        ):  # Alertmanager v2: status.state is active|suppressed|unprocessed
            state = (
                "firing" if a["status"].get("state") == "active" else a["status"].get("state", "")
            )
        rows.append(
            (
                origin,
                lab.get("alertname", "?"),
                state or "",
                lab.get("severity", ""),
                ann.get("summary", ""),
                ann.get("runbook_url", ""),
                _ts(a.get("startsAt") or a.get("activeAt")),
            )
        )
    return pd.DataFrame(rows, columns=ALERT_COLUMNS)


class AlertmanagerSource(SourceBase):
    label = "Alertmanager"
    kind = "alertmanager"

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def describe(self) -> str:
        return f"Alertmanager · {self.url}"

    def alerts(self) -> pd.DataFrame:
        try:
            with urllib.request.urlopen(
                f"{self.url}/api/v2/alerts?active=true", timeout=self.timeout
            ) as r:
                got = json.loads(r.read())
        except (OSError, ValueError) as e:
            raise SourceError(
                f"Alertmanager at {self.url} could not be read ({_reason(e)}); start it or set "
                "WARMSCOPE_ALERTMANAGER_URL to the right address"
            ) from None
        if not isinstance(got, list):
            raise SourceError(
                f"Alertmanager at {self.url} answered with something that is not its API; check "
                "the URL points at Alertmanager itself"
            )
        return alert_rows("alertmanager", got)

    def health(self) -> str | None:
        try:
            self.alerts()
        except SourceError as e:
            return str(e)
        return None
