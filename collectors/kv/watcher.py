"""The public entry: :class:`KVWatcher` watches engines and attributes requests' misses."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from .attribution import Attribution, KVState, TraceRow
from .subscriber import EngineSpec, KVSubscriber, discover, engine_capacity

__all__ = ["KVWatcher"]

log = logging.getLogger("warmscope.kv")


def _usage_numbers(info: Mapping[str, Any]) -> tuple[int, int]:
    usage = info.get("usage")
    if isinstance(usage, Mapping):
        prompt = usage.get("prompt_tokens")
        det = usage.get("prompt_tokens_details")
        cached = det.get("cached_tokens") if isinstance(det, Mapping) else 0
    else:
        prompt, cached = info.get("prompt_tokens"), info.get("cached_tokens")
    return (prompt if isinstance(prompt, int) else 0, cached if isinstance(cached, int) else 0)


class KVWatcher:
    """Watches engines' KV events; :meth:`attribute` splits a request's missed tokens.

    ``engines``: engine URLs (their publishers found through ``GET /kv_event_sources``)
    or :class:`EngineSpec` (endpoint given). An engine that cannot be discovered is
    logged and left out; nothing raises into the host after construction."""

    def __init__(
        self,
        engines: list[str | EngineSpec],
        max_blocks: int = 1_000_000,
        drift_blocks: int = 2,
        reuse_reports: bool = False,
        catch_up: bool = True,
        trace_sink: Callable[[TraceRow], None] | None = None,
        trace_key: bytes | None = None,
    ) -> None:
        specs: list[EngineSpec] = []
        capacity: dict[str, int] = {}  # engine -> num_gpu_blocks, where its /metrics says
        for e in engines:
            if isinstance(e, EngineSpec):
                specs.append(e)
                continue
            try:
                found = discover(e)
                specs.extend(found)
                cap = engine_capacity(e)
                if cap:
                    for f in found:
                        capacity[f.name] = cap
            except Exception as ex:  # an engine that is down, or without events
                log.warning(
                    "warmscope kv-events: cannot read %s/kv_event_sources (%s: %s); "
                    "its events are not watched",
                    e,
                    type(ex).__name__,
                    ex,
                )
        self.specs = specs
        self.state = KVState(
            [s.name for s in specs],
            max_blocks=max_blocks,
            drift_blocks=drift_blocks,
            reuse_reports=reuse_reports,
            trace_sink=trace_sink,
            trace_key=trace_key,
        )
        self.state.capacity.update(capacity)
        self.subscriber = KVSubscriber(specs, self.state, catch_up=catch_up)

    def start(self) -> KVWatcher:
        self.subscriber.start()
        return self

    def stop(self) -> None:
        self.subscriber.stop()

    def __enter__(self) -> KVWatcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def attribute_detail(self, info: Mapping[str, Any], wait_s: float = 0.0) -> Attribution:
        """``info``: ``session_id`` plus ``prompt_tokens`` and ``cached_tokens`` (or the
        response's ``usage``). Waits up to ``wait_s`` for the request's events."""
        prompt, cached = _usage_numbers(info)
        sid = info.get("session_id")
        return self.state.attribute(
            sid if isinstance(sid, str) else None, prompt, cached, wait_s=wait_s
        )

    def attribute(self, info: Mapping[str, Any], wait_s: float = 0.0) -> dict[str, int]:
        return self.attribute_detail(info, wait_s).classes

    def submit(
        self,
        info: Mapping[str, Any],
        callback: Callable[[Attribution], None],
        wait_s: float = 2.0,
        trace: dict[str, Any] | None = None,
    ) -> None:
        """Attribute without blocking; ``callback`` runs on the subscriber's thread.
        ``trace``: the request's arrival, end, tenant, output tokens and TTFT, for the block
        trace (see :meth:`KVState.submit`)."""
        prompt, cached = _usage_numbers(info)
        sid = info.get("session_id")
        self.state.submit(
            sid if isinstance(sid, str) else None, prompt, cached, callback, wait_s, trace
        )

    def stats(self) -> dict[str, Any]:
        return self.subscriber.stats()
