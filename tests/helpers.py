"""Helpers shared by tests (import as tests.helpers)."""

from __future__ import annotations


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
