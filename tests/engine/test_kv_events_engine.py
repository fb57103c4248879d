"""Miss attribution from the KV events of two real vLLM engines with small caches.

Two engines of 96 blocks (32 tokens each) publish their KV events to one
:class:`KVWatcher`; five tenants send chats, one at a time, spread over both:
``acme`` (plain), ``bolt`` (the same prompts as acme under ``cache_salt``),
``clock`` (a system prompt that starts with a changing timestamp), ``dana``
(a multi-turn chat) and ``flood`` (long unique prompts that evict everything).

The expected classes are derived without the events: the test replays its own
workload (token ids from the engine's ``/tokenize``, which engine got what and
when, and the floods that empty both caches) through the rule of
docs/kv-events.md. Its residency model is checked first: it must predict every
request's ``cached_tokens``. Then, per request, the watcher's classes must add
up to prompt - cached and equal the derived ones; the totals must equal the
engines' own counters. Finally the watcher is stopped, requests are sent while
no subscriber listens, a new watcher starts from nothing and must rebuild both
engines' residency from the replay sockets (or count what it could not).
"""

from __future__ import annotations

import json
import os
import random
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from warmscope.collectors.kv import CLASSES, EngineSpec, KVWatcher

from tests.conftest import free_port

pytestmark = pytest.mark.engine

CI = os.environ.get("CI", "").lower() == "true"
BLOCKS = 96
B = 32
SYS_ACME = ("You are the support desk of a parcel courier. Answer briefly and politely; quote the "
            "ledger entry, the invoice number and the refund policy where they apply. ") * 3
SYS_CLOCK = ("You are a turbine maintenance assistant. Check the valve, gasket, nozzle, piston and "
             "rotor logs before you answer; list the spindle readings first. ") * 3
QUESTIONS = ["Where is my parcel 4411?", "Can I get a refund for invoice 9921 please?",
             "My voucher code does not work, what now?"]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def engines():
    from warmscope.simulator import real_engine as re_
    try:
        re_.ensure_installed()
        re_.model_dir()
    except re_.EngineError as e:
        msg = f"vLLM is not available: {e}; run scripts/test.sh (it installs it)"
        if CI:
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    # the event port from the session's slice, below the ephemeral range: an engine retrying its
    # connect can never be handed it as its own source port (a TCP self-connect would hold it)
    specs = [EngineSpec(f"e{i}", f"tcp://127.0.0.1:{free_port()}",
                        f"tcp://127.0.0.1:{free_port()}") for i in (1, 2)]
    engs = [re_.VLLMEngine(kv_events_endpoint=s.endpoint, kv_replay_endpoint=s.replay_endpoint,
                           num_gpu_blocks_override=BLOCKS, kv_cache_metrics=True)
            for s in specs]
    watcher = KVWatcher(specs, max_blocks=8 * BLOCKS).start()  # binds before the engines connect
    try:
        with ThreadPoolExecutor(2) as ex:
            errors = [f.exception() for f in [ex.submit(e.start) for e in engs]]
        bad = [e for e in errors if e is not None]
        if bad:
            pytest.fail(f"vLLM did not start: {bad[0]}", pytrace=False)
        yield specs, engs, watcher
    finally:
        watcher.stop()
        for e in engs:
            e.stop()


class Model:
    """The test's own replay of the workload: which full-block prefixes (per salt) each
    engine holds, what was ever stored, which block tokens were seen at which position."""

    def __init__(self) -> None:
        self.resident: dict[str, set] = {"e1": set(), "e2": set()}
        self.stored: set = set()
        self.seen: set = set()

    def flush(self, engine: str) -> None:
        self.resident[engine].clear()

    def expect(self, engine: str, salt: str, toks: list[int]) -> tuple[int, dict[str, int]]:
        n = len(toks)
        cap = (n - 1) // B
        pre = [tuple(toks[:B * (k + 1)]) for k in range(n // B)]
        blk = [tuple(toks[B * k:B * (k + 1)]) for k in range(n // B)]
        hit = 0
        while hit < cap and (salt, pre[hit]) in self.resident[engine]:
            hit += 1
        out = dict.fromkeys(CLASSES, 0)
        other = [e for e in self.resident if e != engine]
        unseen = sum((salt, j, blk[j]) not in self.seen for j in range(hit))
        for k in range(hit, cap):
            p = (salt, pre[k])
            if any(p in self.resident[e] for e in other):
                c = "elsewhere"
            elif p in self.stored and not any(p in r for r in self.resident.values()):
                c = "evicted"
            elif any(q[1] == pre[k] and q[0] != salt for r in self.resident.values() for q in r):
                c = "isolated"
            elif 1 <= unseen <= 2 and (salt, k, blk[k]) in self.seen:
                c = "drifted"
            else:
                c = "cold"
            out[c] += B
            unseen += (salt, k, blk[k]) not in self.seen
        out["partial"] = n - B * cap
        for k in range(n // B):
            self.resident[engine].add((salt, pre[k]))
            self.stored.add((salt, pre[k]))
            self.seen.add((salt, k, blk[k]))
        return B * hit, out


def test_kv_events_attribution(engines):
    specs, engs, watcher = engines
    by_name = {s.name: e for s, e in zip(specs, engs, strict=True)}
    model = Model()
    rows: list[dict] = []
    rnd = random.Random(26)

    def chat(tenant: str, engine: str, messages: list[dict], salt: str | None = None,
             w: KVWatcher = watcher) -> dict:
        eng = by_name[engine]
        toks = _post(eng.url + "/tokenize", {"model": "tiny", "messages": messages})["tokens"]
        sid = f"{tenant}-{len(rows)}"
        body = {"model": "tiny", "messages": messages, "max_tokens": 1, "temperature": 0,
                "session_id": sid}
        if salt:
            body["cache_salt"] = salt
        if len(rows) % 2:  # every other request asks for vLLM's reports of the blocks it reused
            body["vllm_xargs"] = {"kv_cache_report_mode": "full"}
        usage = _post(eng.base_url + "/chat/completions", body)["usage"]
        prompt, cached = usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]
        assert prompt == len(toks)
        want_cached, want = model.expect(engine, salt or "", toks)
        got = w.attribute({"session_id": sid, "usage": usage}, wait_s=10)
        row = {"tenant": tenant, "engine": engine, "prompt": prompt, "cached": cached,
               "want_cached": want_cached, "got": got, "want": want}
        rows.append(row)
        time.sleep(0.3)  # the request's removals and store reach the subscriber before the next
        return row

    def flood(engine: str) -> None:
        for _ in range(2):  # 2 x ~60 blocks through a cache of 95: nothing older survives
            words = " ".join(f"{rnd.getrandbits(40):x}" for _ in range(1200))
            msgs = [{"role": "user", "content": words}]
            n = len(_post(by_name[engine].url + "/tokenize", {"model": "tiny", "messages": msgs})
                    ["tokens"])
            keep = int(len(words) * min(1.0, 1900 / n))
            chat("flood", engine, [{"role": "user", "content": words[:keep]}])
        model.flush(engine)

    def acme(q: int) -> list[dict]:
        return [{"role": "system", "content": SYS_ACME}, {"role": "user", "content": QUESTIONS[q]}]

    def clock(t: int) -> list[dict]:
        stamp = f"Time: 2026-12-01 2{t % 4}:{10 + 7 * t % 49:02d}:{13 + 11 * t % 46:02d}. "
        return [{"role": "system", "content": stamp + SYS_CLOCK},
                {"role": "user", "content": "Status of rotor 7?"}]

    dana = [{"role": "system", "content": "You help plan a trip by train. " * 4},
            {"role": "user", "content": "I want to go from Lyon to Turin next week, cheaply."}]

    # Phase 1: both caches empty
    chat("acme", "e1", acme(0))                       # cold
    chat("acme", "e2", acme(0))                       # elsewhere: resident on e1
    chat("bolt", "e1", acme(0), salt="bolt")          # isolated: acme's blocks, another salt
    chat("clock", "e2", clock(1))                     # cold
    chat("clock", "e2", clock(2))                     # block 0 cold, the rest drifted
    chat("dana", "e1", dana)                          # cold
    dana += [{"role": "assistant", "content": "Take the morning TGV to Chambery, then the regional "
              "train over the Frejus line."}, {"role": "user", "content": "And back on Sunday?"}]
    chat("dana", "e1", dana)                          # hits turn 1, new blocks cold
    chat("acme", "e2", acme(1))                       # hits the system prompt on e2
    # Phase 2: floods empty both caches
    flood("e1")
    flood("e2")
    # Phase 3: what was there is gone
    chat("acme", "e1", acme(0))                       # evicted
    chat("clock", "e1", clock(3))                     # drifted after block 0 (seen, then evicted)
    dana += [{"role": "assistant", "content": "Yes, the Sunday evening train."},
             {"role": "user", "content": "Book a window seat."}]
    chat("dana", "e2", dana)                          # turn-2 prefix evicted, the rest cold
    chat("bolt", "e2", acme(0), salt="bolt")          # evicted (its salt), acme's copy is on e1
    chat("acme", "e2", acme(0))                       # elsewhere

    # --- the model reproduces the engines' hits; the watcher's classes equal the model's
    for r in rows:
        assert r["cached"] == r["want_cached"], r
        assert sum(r["got"].values()) == r["prompt"] - r["cached"], r
    table: dict[str, dict[str, list[int]]] = {}
    for r in rows:
        t = table.setdefault(r["tenant"], {c: [0, 0] for c in CLASSES})
        for c in CLASSES:
            t[c][0] += r["got"][c]
            t[c][1] += r["want"][c]
    print("\ntenant   " + "".join(f"{c:>18}" for c in CLASSES) + "   (watcher / derived)")
    for tenant, t in table.items():
        print(f"{tenant:<8} " + "".join(f"{f'{a} / {b}':>18}" for a, b in t.values()))
    mismatches = [(r["tenant"], r["engine"], r["got"], r["want"]) for r in rows
                  if r["got"] != r["want"]]
    assert not mismatches, mismatches
    # the reports of reused blocks were read as reports (a watcher with reuse_reports off read them
    # as stores: elsewhere for cold, second copies that are not there)
    assert watcher.state.counts["reuse_reports"] > 0
    # every class the rule has was met (each could have been 0: the workload is built for them)
    for c in ("elsewhere", "evicted", "isolated", "drifted", "cold", "partial"):
        assert sum(t[c][0] for t in table.values()) > 0, c
    assert sum(t["unknown"][0] for t in table.values()) == 0

    # --- the engines' own counters: queries and hits, in tokens
    ctr = [e.counters() for e in engs]
    assert sum(c["vllm:prefix_cache_queries_total"] for c in ctr) == sum(r["prompt"] for r in rows)
    assert sum(c["vllm:prefix_cache_hits_total"] for c in ctr) == sum(r["cached"] for r in rows)
    st = watcher.stats()
    missed = sum(r["prompt"] - r["cached"] for r in rows)
    assert sum(st["class_tokens"].values()) == missed
    assert st["decode_errors"] == 0 and st["unrepaired"] == 0 and st["errors"] == 0
    print("watcher:", {k: st[k] for k in ("batches", "events", "gaps", "repaired", "unrepaired",
                                          "resident_blocks")}, st["per_salt"])

    # --- the index within its bound: no engine holds more than its 95 usable blocks
    for name, idx in watcher.state.indexes.items():
        assert 0 < idx.resident_blocks() <= BLOCKS - 1, name
        assert idx.dropped == {"resident": 0, "content": 0, "removed": 0, "seen": 0}
    resident_before = {n: {idx.main.keys[s] for s in idx.main.live()}
                       for n, idx in watcher.state.indexes.items()}

    # --- a killed subscriber; a new one rebuilds from the replay sockets at start
    watcher.stop()
    chat("acme", "e1", acme(2), w=_Null())            # published while nobody listens
    chat("dana", "e2", dana[:2], w=_Null())
    w2 = KVWatcher(specs, max_blocks=8 * BLOCKS).start()
    try:
        r = chat("clock", "e1", clock(4), w=w2)
        assert r["got"] == r["want"], r
        st2 = w2.stats()
        print("restarted watcher (catch-up at start):",
              {n: {k: e[k] for k in ("batches", "caught_up", "next_seq", "gaps", "repaired",
                                     "unrepaired")} for n, e in st2["engines"].items()})
        for name, e in st2["engines"].items():
            # every batch the engine published, from 0, applied once: nothing left out
            assert e["batches"] == e["next_seq"] > 0 and e["caught_up"] > 0, name
            assert e["unrepaired"] == 0, name
        for name, idx in w2.state.indexes.items():
            now = {idx.main.keys[s] for s in idx.main.live()}
            assert len(now) <= BLOCKS - 1
            assert resident_before[name] & now, name  # what was held and not evicted since
    finally:
        w2.stop()
    # --- killed again; this one does not catch up: the first live batch shows the gap
    chat("acme", "e2", acme(1), w=_Null())
    w3 = KVWatcher(specs, max_blocks=8 * BLOCKS, catch_up=False).start()
    try:
        time.sleep(0.5)  # the engines' PUB sockets reconnect
        r1 = chat("acme", "e1", acme(1), w=w3)          # new blocks on e1: repairs e1
        assert sum(r1["got"].values()) == r1["prompt"] - r1["cached"]
        r2 = chat("clock", "e2", clock(5), w=w3)        # repairs e2; judged on both
        assert r2["got"] == r2["want"], r2
        st3 = w3.stats()
        print("restarted watcher (gap repair):",
              {n: {k: e[k] for k in ("batches", "gaps", "missed_batches", "repaired",
                                     "unrepaired", "next_seq")}
               for n, e in st3["engines"].items()})
        for name, e in st3["engines"].items():
            assert e["gaps"] >= 1 and e["missed_batches"] > 0, name
            assert e["repaired"] == e["missed_batches"] and e["unrepaired"] == 0, name
            assert e["batches"] == e["next_seq"], name
    finally:
        w3.stop()
    # --- a watcher bounded below what the engines hold: rows dropped and counted, never more
    w4 = KVWatcher(specs, max_blocks=32).start()  # catches up from the replay sockets
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(
                e["batches"] == e["next_seq"] > 0 for e in w4.stats()["engines"].values()):
            time.sleep(0.1)
        st4 = w4.stats()
        print("bounded watcher:", {n: (e["resident_blocks"], e["dropped_rows"])
                                   for n, e in st4["engines"].items()})
        for name, e in st4["engines"].items():
            assert e["batches"] == e["next_seq"] > 0, name
            assert 0 < e["resident_blocks"] <= 32 and e["dropped_rows"]["resident"] > 0, name
        assert st4["errors"] == 0 and st4["dropped_rows"]["resident"] > 0
    finally:
        w4.stop()


class _Null:
    """Stands in for a watcher while none listens."""

    def attribute(self, info: dict, wait_s: float = 0.0) -> dict[str, int]:
        p = info["usage"]["prompt_tokens"]
        c = info["usage"]["prompt_tokens_details"]["cached_tokens"]
        return {"cold": p - c}


def test_gateway_hook_attributes_and_salts(engines, make_tel):
    """Chats through the gateway (collectors/gateway.py) with the KV hook: each request gets
    a session id and its tenant as cache_salt; record_misses gets classes that add up."""
    import httpx
    from warmscope.collectors.gateway import make_app, serve
    from warmscope.collectors.kv import discover
    from warmscope.collectors.kv.gateway_hook import KVGatewayHook

    specs, engs, _ = engines
    # the engine's own GET /kv_event_sources names the endpoints it was given
    found = discover(engs[0].url, name="e1")
    assert [(f.name, f.endpoint, f.replay_endpoint) for f in found] == \
        [("e1", specs[0].endpoint, specs[0].replay_endpoint)]
    calls: list[dict] = []
    tel = make_tel()

    class Misses:
        """Keeps each call, and hands it to the real pipeline (recorded in its store)."""

        def record_misses(self, **kw) -> None:
            calls.append(kw)
            tel.record_misses(**kw)

    w = KVWatcher(specs, max_blocks=8 * BLOCKS).start()
    hook = KVGatewayHook(w, Misses(), salt_tenants=True)
    app = make_app(engs[0].url, tel, kv=hook)
    msgs = [{"role": "system", "content": "You route support tickets by product line. " * 6},
            {"role": "user", "content": "Ticket 77: the hinge bracket is loose."}]
    usages = []
    with serve(app) as gw, httpx.Client(base_url=gw, timeout=120) as c:
        for i, stream in enumerate((False, True)):
            body = {"model": "tiny", "messages": msgs, "max_tokens": 1, "temperature": 0,
                    "stream": stream}
            r = c.post("/v1/chat/completions", json=body, headers={"x-warmscope-tenant": "gina"})
            assert r.status_code == 200
            if not stream:
                usages.append(r.json()["usage"])
            deadline = time.monotonic() + 10
            while len(calls) < i + 1 and time.monotonic() < deadline:
                time.sleep(0.05)
    w.stop()
    assert hook.stats["tagged"] == 2 and hook.stats["salted"] == 2
    assert len(calls) == 2 and all(k["tenant"] == "gina" for k in calls)
    first, second = calls[0]["classes"], calls[1]["classes"]
    u = usages[0]
    assert sum(first.values()) == u["prompt_tokens"] - u["prompt_tokens_details"]["cached_tokens"]
    # the same prompt again under the same salt: all but the tail is cached, the rest partial
    n = u["prompt_tokens"]
    assert second == dict.fromkeys(CLASSES, 0) | {"partial": n - B * ((n - 1) // B)}
    # the salt reached the engine: its blocks are counted under the tenant's name
    per_salt = w.stats()["per_salt"]
    assert per_salt["gina"]["stores"] >= (n - 1) // B, per_salt
    # the pipeline stored exactly the classes it was handed, under the tenant
    tel.flush()
    from warmscope.sources import EmbeddedSource

    fr = EmbeddedSource(str(tel.config.resolved_store_path())).frame("misses")
    stored = fr.groupby("miss_class")["tokens"].sum().to_dict()
    want: dict[str, int] = {}
    for k in calls:
        for cls, v in k["classes"].items():
            if v:
                want[cls] = want.get(cls, 0) + v
    assert {k: int(v) for k, v in stored.items() if v} == want
    assert set(fr["tenant"]) == {"gina"}
    print("gateway:", calls[0]["classes"], hook.stats, "stored:", want)
