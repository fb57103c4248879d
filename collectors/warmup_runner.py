"""Warm a real engine's prefix cache: send the warm set with ``max_tokens=1``.

The warm set is either the most requested prompt prefixes an instrumented
client or gateway has seen in this process (``source="hot"``; the prefix texts
never leave the process) or prompts from a file (JSON lines, each
``{"messages": [...]}`` — the fixed part of a conversation: system prompt and
any turns before the user's message — or ``{"prompt": "..."}``; an optional
``"tenant"``). Requests are rate-limited and the run is cancellable (a
``threading.Event``, or Ctrl-C). The run is recorded as a warm-up run of the
``prefix_kv`` layer whose keys are the prefix keys real requests will carry, so
warm-set precision, recall and ROI follow from the requests that come after
it. A request that fails ends the run as ``error``; the result says why.

Needs the ``client`` extra. Example (e.g. on replica start)::

    from warmscope.collectors.warmup_runner import run_warmup
    res = run_warmup("http://127.0.0.1:8000", "hot", recorder=recorder, top_k=50,
                     trigger="replica_start")
    res.status, res.keys, res.prompt_tokens
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .llm import LLMRecorder
from .pipeline import Telemetry, current_telemetry

__all__ = ["WarmupResult", "WarmupInputError", "load_prompts", "hot_from_store", "run_warmup"]


class WarmupInputError(ValueError):
    """The warm set could not be read; the message says where and what to do."""


@dataclass
class WarmupResult:
    run_id: str
    status: str  # ok | error | cancelled
    keys: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # tokens already warm when sent
    duration_s: float = 0.0
    error: str | None = None
    key_list: list[str] = field(default_factory=list)


def load_prompts(path: str | Path) -> list[dict[Any, Any]]:
    """Read a JSON-lines warm set; one clear error naming the line on bad input."""
    p = Path(path)
    if not p.is_file():
        raise WarmupInputError(
            f"warm-set file {p} does not exist; pass --from hot or a JSON-lines file"
        )
    out = []
    for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as e:
            # json.loads raises JSONDecodeError, which has .msg
            raise WarmupInputError(
                f"{p}:{i}: not JSON ({e.msg}); each line must be "  # type: ignore[attr-defined]
                '{"messages": [...]} or {"prompt": "..."}'
            ) from None
        ok_msgs = (
            isinstance(item, dict)
            and isinstance(item.get("messages"), list)
            and item["messages"]
            and all(
                isinstance(m, dict) and "role" in m and "content" in m for m in item["messages"]
            )
        )
        ok_prompt = isinstance(item, dict) and isinstance(item.get("prompt"), str)
        if not (ok_msgs or ok_prompt):
            raise WarmupInputError(
                f'{p}:{i}: expected {{"messages": [{{"role": ..., "content": ...}}]}} '
                'or {"prompt": "..."}'
            )
        out.append(item)
    if not out:
        raise WarmupInputError(f"{p} holds no prompts")
    return out


def hot_from_store(
    library: str | Path,
    store_path: str | Path,
    secret: bytes,
    top_k: int = 50,
    tenant: str | None = None,
    since_s: float = 86400.0,
) -> list[dict[Any, Any]]:
    """The warm set from another process's records: the ``prefix_kv`` hot keys
    of the last ``since_s`` seconds in the embedded store (keyed hashes only),
    matched against a prompt library file kept on this host (written by
    ``LLMRecorder(prompt_library=...)`` or ``warmscope gateway --prompt-library``),
    most requested first. ``secret``: the key secret the serving process hashed
    with. Each item is ``{"messages": ...}`` or ``{"prompt": ...}`` with its
    ``"key"`` and ``"tenant"``. Raises :class:`WarmupInputError` when nothing matches."""
    from .keys import KeyHasher
    from .llm import read_library
    from .store import EmbeddedStore

    try:
        lib = read_library(library)
    except OSError as e:
        raise WarmupInputError(
            f"cannot read the prompt library {library} ({e.strerror}); it is written on "
            "the serving host by LLMRecorder(prompt_library=...) or "
            "'warmscope gateway --prompt-library PATH'"
        ) from None
    if not Path(store_path).is_file():
        raise WarmupInputError(
            f"store {store_path} does not exist; pass --store with the serving process's store"
        )
    store = EmbeddedStore(store_path, readonly=True)
    try:
        hk = store.frame("hot_keys", start=time.time() - since_s)
    finally:
        store.close()
    hk = hk[hk["layer"] == "prefix_kv"]
    if tenant is not None:
        hk = hk[hk["tenant"] == tenant]
    counts = (hk["hits"] + hk["misses"]).groupby(hk["key_hash"]).sum().to_dict()
    h = KeyHasher(secret).hash
    ranked = sorted(
        ((counts[hh], key) for key in lib if (hh := h(key)) in counts), key=lambda t: -t[0]
    )
    if not ranked:
        raise WarmupInputError(
            f"none of the {len(lib)} prefixes in {library} is among the {len(counts)} hot prefix "
            f"keys recorded in {store_path} over the last {since_s / 3600:g} h"
            + (f" for tenant {tenant!r}" if tenant else "")
            + "; check that the serving process writes to this store with the same key secret "
            "(WARMSCOPE_KEY_SECRET or the same data directory)"
        )
    out = []
    for _, key in ranked[:top_k]:
        kind, t, prefix = lib[key]
        item: dict[Any, Any] = (
            {"messages": [{"role": r, "content": c} for r, c in prefix]}
            if kind == "chat"
            else {"prompt": prefix}
        )
        out.append({**item, "key": key, "tenant": t})
    return out


def _warm_set(
    source: Any, recorder: LLMRecorder, top_k: int, tenant: str | None
) -> list[tuple[Any, ...]]:
    """(key, tenant, request body part) per prefix to warm."""
    if isinstance(source, str) and source == "hot":
        out = []
        for key, kind, prefix in recorder.hot_prefixes(top_k, tenant):
            body = (
                {"messages": [{"role": r, "content": c} for r, c in prefix]}
                if kind == "chat"
                else {"prompt": prefix}
            )
            out.append((key, tenant, body))
        return out
    items = load_prompts(source) if isinstance(source, (str, Path)) else list(source)
    out = []
    for item in items:
        t = item.get("tenant", tenant)
        if tenant is not None and t != tenant:
            continue
        if "key" in item:  # a hot prefix whose key was recorded with it
            key, body = item["key"], {k: item[k] for k in ("messages", "prompt") if k in item}
        elif "messages" in item:
            msgs = item["messages"]
            key = recorder.prefix_key("chat", [[m.get("role"), m.get("content")] for m in msgs])
            body = {"messages": msgs}
        else:
            key = recorder.prefix_key("completion", item["prompt"][:512])
            body = {"prompt": item["prompt"]}
        out.append((key, t, body))
    return out[:top_k]


def _model(http: httpx.Client, base: str) -> str:
    r = http.get(base + "/models")
    r.raise_for_status()
    return r.json()["data"][0]["id"]  # type: ignore[no-any-return]  # JSON body


def run_warmup(
    engine: str,
    source: Any = "hot",
    *,
    recorder: LLMRecorder | None = None,
    telemetry: Telemetry | None = None,
    top_k: int = 50,
    tenant: str | None = None,
    model: str | None = None,
    rate: float = 20.0,
    strategy: str = "engine_prefix",
    trigger: str = "manual",
    timeout_s: float = 60.0,
    cancel: threading.Event | None = None,
    progress: Callable[[int, int], None] | None = None,
    transport: httpx.BaseTransport | None = None,
) -> WarmupResult:
    """Send the warm set to ``engine`` (its URL, with or without ``/v1``) and
    record the run. ``source``: ``"hot"``, a JSON-lines path, or a list of
    ``{"messages": ...}`` / ``{"prompt": ...}`` dicts. ``rate``: requests per
    second. Raises only :class:`WarmupInputError` (bad warm set, before
    anything is sent); engine failures end the run as ``error``."""
    tel = telemetry or (recorder.tel if recorder is not None else current_telemetry())
    rec = recorder or LLMRecorder(tel)
    warm = _warm_set(source, rec, top_k, tenant)
    base = engine.rstrip("/")
    base = base if base.endswith("/v1") else base + "/v1"
    run = tel.warmup(strategy, layer="prefix_kv", tenant=tenant, trigger=trigger)
    res = WarmupResult(run.run_id, "running")
    t0 = time.monotonic()
    gap = 1.0 / rate if rate > 0 else 0.0
    try:
        with run, httpx.Client(timeout=timeout_s, transport=transport) as http:
            mdl = model or _model(http, base)
            for i, (key, t, part) in enumerate(warm):
                if cancel is not None and cancel.is_set():
                    raise KeyboardInterrupt
                t_req = time.monotonic()
                path = "/chat/completions" if "messages" in part else "/completions"
                r = http.post(
                    base + path, json={"model": mdl, "max_tokens": 1, "temperature": 0, **part}
                )
                r.raise_for_status()
                usage = r.json().get("usage") or {}
                pt = int(usage.get("prompt_tokens") or 0)
                ct = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
                spent = time.monotonic() - t_req
                run.warmed(key, gpu_s=spent, tenant=t)
                res.keys += 1
                res.prompt_tokens += pt
                res.cached_tokens += ct
                res.key_list.append(key)
                if progress is not None:
                    progress(i + 1, len(warm))
                wait = gap - (time.monotonic() - t_req)
                if wait > 0 and i + 1 < len(warm):
                    if cancel is not None:
                        if cancel.wait(wait):
                            raise KeyboardInterrupt
                    else:
                        time.sleep(wait)
    except KeyboardInterrupt:
        res.error = "cancelled"
    except Exception as e:  # engine down, HTTP error, unexpected reply: the run failed
        msg = f"{type(e).__name__}: {e}"
        res.error = msg if len(msg) < 300 else msg[:300] + "…"
    res.status = run.status
    res.duration_s = time.monotonic() - t0
    return res
