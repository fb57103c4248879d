"""vLLM KV-cache events: a subscriber, a residency index per engine, and miss attribution.

Imports only the standard library, msgspec and pyzmq (the ``kv`` extra)::

    from warmscope.collectors.kv import KVWatcher
    w = KVWatcher(engines=["http://127.0.0.1:8000"]).start()   # discovered via /kv_event_sources
    ...                                                          # requests carry a session_id
    w.attribute({"session_id": sid, "prompt_tokens": 297, "cached_tokens": 0}, wait_s=1)
    # {'elsewhere': 0, 'evicted': 0, 'isolated': 0, 'drifted': 0, 'cold': 288, 'partial': 9, ...}

See docs/kv-events.md.
"""

from __future__ import annotations

from .attribution import CLASSES, Attribution, KVState
from .subscriber import EngineSpec, KVSubscriber, discover
from .watcher import KVWatcher

__all__ = [
    "CLASSES",
    "Attribution",
    "EngineSpec",
    "KVState",
    "KVSubscriber",
    "KVWatcher",
    "discover",
]
