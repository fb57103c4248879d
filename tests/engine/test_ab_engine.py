"""A/B of cache warm-up on two real vLLM engines, measured through the
instrumented OpenAI client: arm A starts cold, arm B is warmed at start by
`warmscope warmup` in another process, whose run B's serving side follows;
one multi-tenant workload is split between them by session hash. What
warmscope reports is checked against the engines' own counters and
the cached tokens they returned; then an engine is stopped mid-run."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import openai
import pytest
from warmscope.analysis.ab_report import report_for
from warmscope.analysis.coverage import warm_set_coverage
from warmscope.collectors import request_context
from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.openai_client import InstrumentedTransport, instrument_openai, recorder_of
from warmscope.collectors.pipeline import Telemetry
from warmscope.collectors.store import EmbeddedStore
from warmscope.collectors.warmup_runner import run_warmup

pytestmark = pytest.mark.engine

EXPERIMENT = "warmup-engine"
TENANTS = ("acme", "globex", "initech", "umbrella")
PER_TENANT = 48            # templates (system prompts) per tenant; one session each (>= 50 effective units an arm)
WORDS = ("ledger invoice refund parcel courier warranty voucher module sensor turbine valve gasket "
         "nozzle piston bracket hinge rotor spindle").split()
SECRET_WORD = "zqxmarker"  # in every system prompt: must appear in no exported byte


def system_prompt(tenant: str, i: int) -> str:
    r = random.Random(f"{tenant}-{i}")
    # ~330 words: about 1700 tokens with the tiny model's tokenizer (max_model_len 2048)
    return f"{SECRET_WORD} {tenant} desk {i}: " + " ".join(r.choice(WORDS) for _ in range(330))


def arm_of(session: str) -> str:
    return "A" if hashlib.blake2b(session.encode(), digest_size=2).digest()[0] % 2 == 0 else "B"


def pct(xs, q):
    return float(np.percentile(np.asarray(xs), q))


@pytest.fixture(scope="module")
def ab_run(vllm_engines, tmp_path_factory):
    eng_a, eng_b = vllm_engines(2)
    tmp = tmp_path_factory.mktemp("ab-engine")
    store = EmbeddedStore(tmp / "ab.sqlite")
    tels = {}
    for arm in "AB":
        cfg = CollectorConfig.load(env={}, store_path=str(tmp / "ab.sqlite"), key_secret="ab-secret",
                                   exporter="embedded", replica=f"{arm.lower()}-0", early_window_s=3600)
        tels[arm] = Telemetry(cfg, store=store, background=False)
    clients = {arm: instrument_openai(openai.OpenAI(base_url=e.base_url, api_key="-", max_retries=0),
                                      telemetry=tels[arm], experiment=EXPERIMENT, variant=arm)
               for arm, e in (("A", eng_a), ("B", eng_b))}
    templates = [(t, i) for t in TENANTS for i in range(PER_TENANT)]
    # B's warm set: 3 in 4 of the templates (the rest stay cold), and 4 prompts no one asks for.
    warm_set = [{"messages": [{"role": "system", "content": system_prompt(t, i)}], "tenant": t}
                for t, i in templates if i % 4 != 3]
    warm_set += [{"messages": [{"role": "system", "content": system_prompt("nobody", i)}]} for i in range(4)]
    # B is warmed at start by `warmscope warmup` in its own process, recorded for replica b-0 in the shared
    # store; B's serving side follows that run at its next flush and matches its own requests to it.
    warm_file = tmp / "warm-set.jsonl"
    warm_file.write_text("".join(json.dumps(item) + "\n" for item in warm_set))
    done = subprocess.run([sys.executable, "-m", "warmscope.app.cli", "--store", str(tmp / "ab.sqlite"), "warmup",
                           "--engine", eng_b.url, "--from", str(warm_file), "--top-k", str(len(warm_set)),
                           "--rate", "0", "--trigger", "replica_start", "--replica", "b-0", "--quiet"],
                          env={**os.environ, "WARMSCOPE_KEY_SECRET": "ab-secret"}, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr
    m = re.search(r"warm-up run (\w+): ok, (\d+) prefixes", done.stderr)
    assert m, done.stderr
    rec_b = recorder_of(clients["B"])
    warm = SimpleNamespace(run_id=m.group(1), keys=int(m.group(2)),
                           key_list=[rec_b.prefix_key("chat", [[x["role"], x["content"]] for x in item["messages"]])
                                     for item in warm_set])
    tels["B"].flush()
    before = {"A": eng_a.counters(), "B": eng_b.counters()}
    sessions = [(f"sess-{t}-{i}", t, i) for t, i in templates]
    random.Random(7).shuffle(sessions)
    records = []
    for sid, tenant, i in sessions:
        arm = arm_of(sid)
        for turn in range(2 if i % 3 == 0 else 1):     # a third of the sessions come back once
            msgs = [{"role": "system", "content": system_prompt(tenant, i)},
                    {"role": "user", "content": f"question {turn} from {tenant}"}]
            with request_context(tenant=tenant, unit=sid, telemetry=tels[arm]):
                t0 = time.perf_counter()
                stream = clients[arm].chat.completions.create(model="tiny", messages=msgs, max_tokens=1,
                                                              stream=True, stream_options={"include_usage": True})
                ttft, usage = None, None
                for chunk in stream:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    usage = chunk.usage or usage
            key = recorder_of(clients[arm]).prefix_key("chat", [["system", msgs[0]["content"]]])
            records.append(dict(arm=arm, tenant=tenant, key=key, ttft=ttft, prompt=usage.prompt_tokens,
                                cached=usage.prompt_tokens_details.cached_tokens))
    after = {"A": eng_a.counters(), "B": eng_b.counters()}
    tels["A"].flush()
    tels["B"].close()   # arm B is done: its final flush closes the run's recall window
    yield dict(engines={"A": eng_a, "B": eng_b}, tels=tels, clients=clients, store=store, warm=warm,
               warm_set=warm_set, before=before, after=after, records=records, tmp=tmp)
    tels["A"].close()
    store.close()   # the engines stay up for the next module (the session's vllm_engines pool)


def test_per_tenant_hits_sum_to_each_engines_own_counters(ab_run):
    lk = ab_run["store"].frame("lookups")
    lk = lk[lk.layer == "prefix_kv"]
    lines = []
    for arm in "AB":
        ours = lk[lk.replica == f"{arm.lower()}-0"]
        per_tenant = ours.pivot_table(index="tenant", columns="result", values="count", aggfunc="sum",
                                      fill_value=0)
        assert set(per_tenant.index) <= set(TENANTS) and len(per_tenant) >= 3
        hits = float(per_tenant["hit"].sum())
        queries = float(per_tenant[["hit", "miss"]].sum().sum())
        b, a = ab_run["before"][arm], ab_run["after"][arm]
        eng_hits = a["vllm:prefix_cache_hits_total"] - b.get("vllm:prefix_cache_hits_total", 0)
        eng_queries = a["vllm:prefix_cache_queries_total"] - b.get("vllm:prefix_cache_queries_total", 0)
        for tenant, row in per_tenant.iterrows():
            lines.append(f"  {arm} {tenant}: {row['hit']:.0f} cached of {row['hit'] + row['miss']:.0f} prompt tokens "
                         f"(hit rate {row['hit'] / (row['hit'] + row['miss']):.3f})")
        lines.append(f"{arm}: per-tenant sum hits {hits:.0f} / {queries:.0f} tokens; engine counters "
                     f"{eng_hits:.0f} / {eng_queries:.0f}")
        assert queries == pytest.approx(eng_queries, rel=0.01)
        assert hits == pytest.approx(eng_hits, rel=0.01, abs=0.5)
        # and both equal what the engine returned request by request
        rec = [r for r in ab_run["records"] if r["arm"] == arm]
        assert hits == sum(r["cached"] for r in rec) and queries == sum(r["prompt"] for r in rec)
        assert hits > 0
    print("\n" + "\n".join(lines))


def test_ab_report_shows_b_better_in_hit_rate_and_ttft(ab_run):
    rep = report_for(ab_run["store"], EXPERIMENT, primary="hit rate (prefix_kv)")
    res = {r.metric: r for r in rep.results}
    hr, tt = res["hit rate (prefix_kv)"], res["TTFT per request (s)"]
    recs = ab_run["records"]
    ttft = {arm: [r["ttft"] for r in recs if r["arm"] == arm] for arm in "AB"}
    rows = ["| arm | units | token hit rate | TTFT P50 (s) | TTFT P95 (s) |", "|---|---|---|---|---|"]
    for arm, v in (("A", hr.control), ("B", hr.treatment)):
        rows.append(f"| {arm} | {rep.units.get(arm)} | {v:.3f} | {pct(ttft[arm], 50):.3f} | "
                    f"{pct(ttft[arm], 95):.3f} |")
    rows.append(f"hit rate B-A {hr.abs_effect:+.3f} [{hr.abs_low:+.3f}, {hr.abs_high:+.3f}] p={hr.p_value:.2g}")
    rows.append(f"TTFT/request B-A {tt.abs_effect:+.4f} s [{tt.abs_low:+.4f}, {tt.abs_high:+.4f}] "
                f"p={tt.p_value:.2g}")
    print("\n" + "\n".join(rows))
    # the report's arm values are the engines' own cached/prompt token ratios
    for arm, v in (("A", hr.control), ("B", hr.treatment)):
        rec = [r for r in recs if r["arm"] == arm]
        assert v == pytest.approx(sum(r["cached"] for r in rec) / sum(r["prompt"] for r in rec), rel=1e-9)
    assert rep.srm_units is not None and not rep.srm_units.flagged
    assert hr.abs_low > 0                      # B's hit rate is higher, CI excludes zero
    # The report's TTFT per request is what the test itself timed, arm by arm, less the SDK's own work:
    # the collector's clock runs from the transport's send to the first chunk, inside the test's clock
    # (measured 2.1 ms apart per request on an idle machine; 20 ms allows for a loaded one).
    for arm, v in (("A", tt.control), ("B", tt.treatment)):
        assert float(np.mean(ttft[arm])) - 0.020 <= v <= float(np.mean(ttft[arm]))
    # B is faster: an uncached ~1700-token prefill costs ~43 ms on an idle machine (60 vs 17 ms median,
    # measured), but the other test worker's load stretches every request, so whether the CI excludes zero
    # depends on that load (it did not, once in about a dozen runs: -0.038 s [-0.079, +0.0025]); the
    # point estimate's sign is what this asserts, the CI is printed above.
    assert tt.abs_effect < 0


def test_warm_set_precision_and_recall_come_from_real_cached_tokens(ab_run):
    st = ab_run["store"]
    runs = st.frame("warmup_runs")
    runs = runs[runs.replica == "b-0"]
    assert list(runs["status"]) == ["ok"] and ab_run["warm"].keys == len(ab_run["warm_set"])
    assert list(runs["run_id"]) == [ab_run["warm"].run_id]      # the run `warmscope warmup` made, followed by B
    cov = warm_set_coverage(runs, st.frame("warmed_keys"), st.frame("early_keys"), recall_window_s=3600)
    row = cov.iloc[0]
    b = [r for r in ab_run["records"] if r["arm"] == "B"]
    warmed = set(ab_run["warm"].key_list)
    read = {r["key"] for r in b if r["key"] in warmed and r["cached"] > 0}   # the engine served it from cache
    requested = {r["key"] for r in b}
    print(f"\nB's warm-up run: precision {row['precision']:.3f} (expected {len(read)}/{len(warmed)}), recall "
          f"{row['recall']:.3f} (expected {len(requested & warmed)}/{len(requested)})")
    assert row["precision"] == pytest.approx(len(read) / len(warmed))
    assert row["recall"] == pytest.approx(len(requested & warmed) / len(requested))
    assert 0 < row["precision"] < 1 and 0 < row["recall"] < 1


def test_no_prompt_text_in_the_store(ab_run):
    ab_run["tels"]["A"].flush()
    blobs = [p.read_bytes() for p in Path(ab_run["tmp"]).glob("ab.sqlite*")]
    assert blobs and sum(len(b) for b in blobs) > 10_000
    for blob in blobs:
        assert SECRET_WORD.encode() not in blob and b"turbine" not in blob and b"question 3" not in blob


def test_a_stream_that_does_not_ask_for_usage_reads_as_without_warmscope(ab_run, tmp_path):
    """The client asks the engine for usage on the caller's behalf and takes the
    usage chunk out again: the caller reads the engine's own stream, and the
    cached tokens are recorded all the same."""
    eng = ab_run["engines"]["B"]
    cfg = CollectorConfig.load(env={}, store_path=str(tmp_path / "s.sqlite"), key_secret="s", exporter="embedded")
    tel = Telemetry(cfg, background=False)
    plain = httpx.Client(base_url=eng.url, timeout=120)
    inst = httpx.Client(base_url=eng.url, timeout=120, transport=InstrumentedTransport(telemetry=tel))
    body = {"model": "tiny", "max_tokens": 3, "temperature": 0, "stream": True,
            "messages": [{"role": "system", "content": system_prompt("acme", 1)},
                         {"role": "user", "content": "a streamed question"}]}

    def sse(client):
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            return b"".join(r.iter_bytes())

    def chunks(b):  # the events' JSON, without the request id and timestamp (they differ per request)
        assert b.endswith(b"data: [DONE]\n\n") and all(e.startswith(b"data: ") for e in b.split(b"\n\n")[:-1])
        out = [json.loads(e[6:]) for e in b.split(b"\n\n")[:-2]]
        for c in out:
            del c["id"], c["created"]
        return out

    def merged(cs):
        """The stream with its content deltas joined into the last choice chunk: the
        engine sends two tokens as one chunk when its reader falls behind, so where a
        stream is cut into chunks varies from request to request."""
        first, rest = cs[0], [c for c in cs[1:] if c["choices"]]
        last = json.loads(json.dumps(rest[-1]))
        last["choices"][0]["delta"]["content"] = "".join(c["choices"][0]["delta"].get("content", "") for c in rest)
        return [first, last] + [c for c in cs[1:] if not c["choices"]]   # a usage-only chunk stays visible

    before = eng.counters()
    got = sse(inst)
    after = eng.counters()
    ref = sse(plain)
    g, r = chunks(got), chunks(ref)
    assert merged(g) == merged(r)                       # the engine's own stream: no usage chunk, no usage fields...
    assert {tuple(c) for c in g} == {tuple(c) for c in r}   # ...each chunk with the fields it has without warmscope
    assert b'"usage"' not in got and b'"system_fingerprint"' in got   # ...and the fingerprint where vLLM puts it
    st = inst._transport.recorder.stats
    assert st["usage_requested"] == 1 and st["recorded"] == 1 and st["no_usage"] == 0
    tel.close()
    lk = tel.store.frame("lookups")
    lk = lk[lk.layer == "prefix_kv"]
    hits, total = lk[lk.result == "hit"]["count"].sum(), lk["count"].sum()
    assert hits == after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"] > 0
    assert total == after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]


def test_engine_stopped_mid_run_fails_for_the_caller_as_without_warmscope(ab_run):
    eng = ab_run["engines"]["A"]
    tel = ab_run["tels"]["A"]
    inst = ab_run["clients"]["A"]
    plain = openai.OpenAI(base_url=eng.base_url, api_key="-", max_retries=0)
    warm_set = [{"messages": [{"role": "system", "content": system_prompt("late", i)}]} for i in range(40)]
    two_done = threading.Event()
    out = {}

    def progress(done, total):
        if done >= 2:
            two_done.set()

    th = threading.Thread(target=lambda: out.setdefault("res", run_warmup(
        eng.url, warm_set, telemetry=tel, top_k=40, rate=2, progress=progress, timeout_s=30)))
    th.start()
    assert two_done.wait(120)
    eng.stop()                                          # the engine goes away mid-run
    th.join(120)
    res = out["res"]
    assert res.status == "error" and 2 <= res.keys < 40
    msgs = [{"role": "system", "content": system_prompt("acme", 0)}, {"role": "user", "content": "hi"}]
    raised = []
    for client in (plain, inst):
        try:
            client.chat.completions.create(model="tiny", messages=msgs, max_tokens=1)
        except Exception as e:
            raised.append(type(e))
    assert raised == [openai.APIConnectionError, openai.APIConnectionError]
    st = recorder_of(inst).stats
    assert st["connect_errors"] == 1
    tel.flush()
    runs = ab_run["store"].frame("warmup_runs")
    assert runs.loc[runs.run_id == res.run_id, "status"].tolist() == ["error"]
    lk = ab_run["store"].frame("lookups")
    assert lk[(lk.replica == "a-0") & (lk.result == "error")]["count"].sum() == 1
