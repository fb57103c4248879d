"""Helpers shared by tests (import as tests.helpers)."""

from __future__ import annotations

from pathlib import Path


def points(reader, name: str) -> list:
    """Data points of one metric from an InMemoryReader collection."""
    md = reader.get_metrics_data()
    out = []
    if md is None:
        return out
    for rm in md.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == name:
                    out.extend(m.data.data_points)
    return out


def total(reader, name: str, attrs: dict | None = None) -> float:
    attrs = attrs or {}
    return sum(
        p.value for p in points(reader, name)
        if all(p.attributes.get(k) == v for k, v in attrs.items())
    )


def assert_same_report(ra, rb) -> None:
    """Two A/B reports (``analysis.ab_report.report_for``) on the same traffic
    agree: units, verdict, every table row, the effect over time and the
    request-level sample-ratio check."""
    import pandas as pd
    import pytest

    assert ra.units == rb.units and ra.verdict == rb.verdict and ra.error is None
    ta, tb = ra.table(), rb.table()
    assert len(ta) >= 6
    pd.testing.assert_frame_equal(ta, tb, check_exact=False, rtol=1e-9, atol=1e-12)
    pd.testing.assert_frame_equal(ra.effect_over_time, rb.effect_over_time, check_exact=False, rtol=1e-9)
    assert ra.srm_requests.p_value == pytest.approx(rb.srm_requests.p_value, rel=1e-9)


def wrapped_table(markdown: str):
    """The frame a ``fmt.wrapped_table`` markdown element draws (its header row and cells, text
    unescaped), read with the standard library's HTML parser."""
    from html.parser import HTMLParser

    import pandas as pd

    class _Table(HTMLParser):
        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.rows: list[list[str]] = []
            self.cell: list[str] | None = None

        def handle_starttag(self, tag, attrs):
            if tag == "tr":
                self.rows.append([])
            elif tag in ("td", "th"):
                self.cell = []

        def handle_endtag(self, tag):
            if tag in ("td", "th") and self.cell is not None:
                self.rows[-1].append("".join(self.cell).strip())
                self.cell = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell.append(data)

    p = _Table()
    p.feed(markdown[markdown.index("<table"):])
    head, *body = [r for r in p.rows if r]
    return pd.DataFrame(body, columns=head)


MAIN = str(Path(__file__).resolve().parents[1] / "app" / "dashboard" / "main.py")


def page_on_store(path, monkeypatch, tables: dict, page: str, query: dict | None = None):
    """A dashboard page under AppTest on a store written at ``path`` with ``tables`` (records by
    table name), its URL holding ``query``; the page ran without an exception or an error."""
    from streamlit.testing.v1 import AppTest
    from warmscope.collectors import EmbeddedStore

    st = EmbeddedStore(path)
    st.write(tables)
    st.close()
    monkeypatch.setenv("WARMSCOPE_STORE", str(path))
    at = AppTest.from_file(MAIN, default_timeout=120)
    for k, v in (query or {}).items():
        at.query_params[k] = v
    at.run()
    at.switch_page(f"entries/{page}.py").run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    return at
