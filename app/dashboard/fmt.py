"""How pages write figures and statuses: percentages, integers, times, column names, the
text-and-colour status of a score and the alert lines."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from html import escape
from typing import TYPE_CHECKING

import pandas as pd
import streamlit as st

if TYPE_CHECKING:
    from pandas.io.formats.style import Styler

# Text-and-colour status (no emoji font needed): label, colour.
STATUS = {
    "good": ("OK", "#1a7f37"),
    "fair": ("FAIR", "#b58100"),
    "poor": ("POOR", "#cf222e"),
    "none": ("NO DATA", "#6e7781"),
    "critical": ("CRITICAL", "#cf222e"),
    "warning": ("WARNING", "#b35900"),
    "info": ("INFO", "#0969da"),
    "security": ("SECURITY", "#cf222e"),
}


def when(ts: float) -> str:
    return pd.Timestamp(ts, unit="s").strftime("%Y-%m-%d %H:%M")


def hhmm(ts: float) -> str:
    return pd.Timestamp(ts, unit="s").strftime("%H:%M")


def grade(score: float | None) -> str:
    if score is None or score != score:
        return "none"
    return "good" if score >= 0.8 else ("fair" if score >= 0.5 else "poor")


def light(score: float | None) -> str:
    """Status text for a 0–1 score (colour it with :func:`status_style`)."""
    return STATUS[grade(score)][0]


def status_style(v: object) -> str:
    """pandas Styler cell style for a status label."""
    for label, colour in STATUS.values():
        if v == label:
            return f"color: white; background-color: {colour}; font-weight: 600"
    return ""


def badge(kind: str, text: str = "") -> str:
    """Inline HTML badge: text on a coloured background (for st.markdown(...,
    unsafe_allow_html=True))."""
    label, colour = STATUS[kind]
    return (
        f'<span style="background:{colour};color:white;border-radius:4px;padding:1px 6px;'
        f'font-size:0.8em;font-weight:600">{text or label}</span>'
    )


def is_security(alert: str) -> bool:
    return alert in ("CrossTenantCacheRead",) or "tenant_isolation" in alert


def alert_row(severity: str, alert: str, summary: str, since: float | None = None) -> None:
    """One alert line; security findings in red whatever their severity."""
    kind = "security" if is_security(alert) else severity if severity in STATUS else "info"
    extra = f" · since {when(since)}" if since is not None and since == since else ""
    box = (
        st.error
        if kind in ("security", "critical")
        else st.warning
        if kind == "warning"
        else st.info
    )
    tag = "SECURITY · " if kind == "security" else ""
    if tag and summary.upper().startswith("SECURITY:"):
        summary = summary[len("SECURITY:") :].strip()
    box(f"**{tag}{severity.upper()} · {alert}** — {summary}{extra}")


def alert_rows(alerts: pd.DataFrame, limit: int | None = None) -> None:
    """:func:`alert_row` for each row of an alert frame (severity, alert, summary, since)."""
    for r in alerts.head(limit).to_dict("records") if limit else alerts.to_dict("records"):
        since = r.get("since")
        alert_row(
            str(r["severity"]),
            str(r["alert"]),
            str(r["summary"]),
            None if since is None else float(since),
        )


# A table whose every column shows in full at any width: its cells wrap instead of being cut.
_WRAPPED = (
    "<style>.ws-wrapped{overflow-x:auto}"
    ".ws-wrapped table{width:100%;border-collapse:collapse;font-size:0.78rem}"
    ".ws-wrapped th,.ws-wrapped td{white-space:normal;overflow-wrap:normal;padding:4px 5px;"
    "border-bottom:1px solid #e6e6e6;text-align:left;vertical-align:top}"
    ".ws-wrapped th{font-weight:600}"
    ".ws-wrapped th[title]{text-decoration:underline dotted;cursor:help}</style>"
)


def wrapped_table(styler: Styler, help: Mapping[str, str] | None = None) -> None:
    """A styled table drawn as HTML whose cells wrap at spaces: every column shows in the page's
    width (``st.table`` and ``st.dataframe`` cut a wide table's columns or its long cells);
    a table whose words alone are wider than the page scrolls sideways. ``help``: a column's
    help, shown on hovering its name (dotted underline)."""
    html = styler.hide(axis="index").to_html()
    for i, col in enumerate(styler.columns):
        if (tip := (help or {}).get(str(col))) is not None:
            head = re.search(rf'<th [^>]*class="col_heading level0 col{i}" >', html)
            if head is not None:  # the help as the header's title attribute
                at = head.end() - 1
                html = f'{html[:at]}title="{escape(tip)}"{html[at:]}'
    st.markdown(f'{_WRAPPED}<div class="ws-wrapped">{html}</div>', unsafe_allow_html=True)


def num(x: object) -> float:
    """A number read from a frame's row (NaN for anything that is not one)."""
    if isinstance(x, int | float):
        return float(x)
    try:
        return float(str(x))
    except ValueError:
        return float("nan")


def pct(x: float | None, digits: int = 1) -> str:
    """``0.123`` → ``12.3%``; a positive value too small to show at ``digits`` reads ``< 0.1%``
    (a share that is there never reads as none); one that rounds to zero from below reads
    ``0.0%``, never ``-0.0%``."""
    if x is None or x != x:
        return "–"
    if round(x * 100, digits) == 0:
        return f"< {10.0**-digits:.{digits}f}%" if x > 0 else f"{0.0:.{digits}%}"
    return f"{x:.{digits}%}"


def integer(x: float | None) -> str:
    return "–" if x is None or x != x else f"{int(round(x)):,}"


def tokens(x: float | None, unit: bool = True) -> str:
    """A token count at a size a person reads, to three significant figures: ``812 tokens``,
    ``41.0 k tokens``, ``1.58 M tokens`` (never ``0.0 M``); ``unit=False`` leaves out the word
    (``1.58 M``: a metric whose label names the unit, where the value has a tile's width)."""
    if x is None or x != x:
        return "–"
    word = " tokens" if unit else ""
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        q = float(f"{x / scale:.3g}")
        if abs(q) >= 1:
            return f"{q:,.{max(0, 2 - math.floor(math.log10(abs(q))))}f} {prefix}{word}"
    return f"{x:,.0f}{word}"


def human(col: str) -> str:
    """Column name for people: ``wasted_gpu_s`` → ``Wasted GPU-s``."""
    words = {
        "gpu": "GPU",
        "s": "(s)",
        "id": "ID",
        "ci": "CI",
        "p": "p",
        "roi": "ROI",
        "ttft": "TTFT",
        "kv": "KV",
    }
    parts = [words.get(w, w) for w in col.split("_")]
    out = " ".join(parts).replace("GPU (s)", "GPU-s")
    return out[:1].upper() + out[1:]
