"""The gateway hook on its own: what it adds to a request body, what it submits."""

from __future__ import annotations

import json
from types import SimpleNamespace

from warmscope.collectors.kv import EngineSpec, KVWatcher
from warmscope.collectors.kv.decode import DecodeStats, decode_message
from warmscope.collectors.kv.gateway_hook import KVGatewayHook

from tests.collectors.kv_events import frames, stored, toks


def make() -> tuple[KVWatcher, KVGatewayHook, list[dict]]:
    calls: list[dict] = []
    w = KVWatcher([EngineSpec("e1", "tcp://127.0.0.1:1")])  # never started: fed by hand
    tel = SimpleNamespace(record_misses=lambda **kw: calls.append(kw))
    return w, KVGatewayHook(w, tel, salt_tenants=True, salt_secret="k"), calls


def test_before_adds_session_and_salt_and_leaves_others_alone():
    w, hook, _ = make()
    ex = SimpleNamespace(labels=("acme", None, None, None, None))
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    out = json.loads(hook.before(ex, "/v1/chat/completions", body))
    assert out["session_id"] == ex.kv_session and out["cache_salt"] == hook.salt_for("acme")
    assert out["cache_salt"] != "acme" and len(out["cache_salt"]) == 32  # keyed digest
    assert out["messages"] == [{"role": "user", "content": "hi"}]
    # a request with its own session id and salt: untouched
    own = json.dumps({"session_id": "x", "cache_salt": "y", "messages": []}).encode()
    ex2 = SimpleNamespace(labels=("acme",))
    assert hook.before(ex2, "/v1/chat/completions", own) == own
    assert not hasattr(ex2, "kv_session")
    # not a chat request, or not a JSON object: untouched
    assert hook.before(ex, "/v1/completions", body) == body
    assert hook.before(ex, "/v1/chat/completions", b"[1]") == b"[1]"
    assert hook.before(None, "/v1/chat/completions", body) == body
    assert hook.stats["tagged"] == 1 and hook.stats["not_tagged"] == 1 and hook.stats["errors"] == 0


def test_after_submits_and_records_misses_when_the_store_arrives():
    w, hook, calls = make()
    ex = SimpleNamespace(labels=("acme", None, None, None, None), status=200, usage=None,
                         stream=False, kind="chat")
    hook.before(ex, "/v1/chat/completions", b'{"messages": []}')
    usage = {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 0}}
    ex.buf = [json.dumps({"usage": usage}).encode()]
    hook.after(ex)
    assert calls == [] and hook.stats["submitted"] == 1
    b = decode_message(frames(0, [stored([1, 2], None, toks(1, 2), session=ex.kv_session)],
                              1.0), DecodeStats())
    assert b is not None
    w.state.apply("e1", b)
    # 9 tokens, block 4: (9 - 1) // 4 = 2 judged blocks, both new: cold 8, partial 1
    assert len(calls) == 1 and calls[0]["tenant"] == "acme" and calls[0]["engine"] == "e1"
    assert calls[0]["classes"]["cold"] == 8 and calls[0]["classes"]["partial"] == 1
    assert calls[0]["family"] == "chat"
    # no record_misses on the telemetry: nothing is called, nothing fails
    hook.telemetry = object()
    hook._record(w.state.attribute(None, 5, 0), "acme", None)
    assert hook.stats["errors"] == 0
    # a failed response, or one without usage: not submitted
    hook.after(SimpleNamespace(kv_session="s", status=500))
    hook.after(SimpleNamespace(kv_session="s", status=200, usage=None, stream=True, buf=None,
                               labels=("a",)))
    assert hook.stats["submitted"] == 1 and hook.stats["no_usage"] == 1
