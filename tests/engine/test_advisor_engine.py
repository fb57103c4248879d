"""The advisor's recommendation proven on real vLLM engines.

1. A multi-tenant workload (4 tenants, 80 system prompts of Zipf-like popularity, most read twice)
   is recorded on a fresh vLLM engine through `warmscope gateway` into an embedded store, with the
   prompt library `warmscope warmup --from hot` reads.
2. `warmscope advise` recommends a warm-set size and lead time from that one-layer (prefix_kv)
   recording, and predicts the recommendation against a naive top-50.
3. Two fresh engines are warmed by `warmscope warmup --from hot`: A with the 50 most requested
   prefixes, B with the recommended number; the recorded requests are replayed on both, in the
   same order, through two gateways (experiment "proof"). The project's A/B report measures the
   per-request TTFT and the token hit rate difference with 95 % CIs; the predicted hit rate must
   lie within its CI, the TTFT prediction is printed beside the measured one (the engines' speed on
   this shared machine, measured by probes sent straight to them, moves more than its CI allows).
   Every request's cached tokens are checked against which prefixes were warmed.
4. The paired warm-up evaluation's replay (analysis/whatif/warmup.py) predicts each arm from the
   recording's block trace (its engine's KV events, through `warmscope gateway --kv-events`) and
   the arm's warm set: every replayed request's cached tokens, to the token, and the difference
   inside the A/B's CI, printed beside the measured A/B.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from warmscope.analysis.ab_report import report_for
from warmscope.collectors.keys import KeyHasher
from warmscope.collectors.kv.subscriber import engine_capacity
from warmscope.collectors.llm import read_library
from warmscope.sources import EmbeddedSource

pytestmark = pytest.mark.engine

SECRET = "proof-secret"
TENANTS = ("acme", "globex", "initech", "umbrella")
PER_TENANT = 20
NAIVE_K = 50
WORDS = (
    "ledger invoice refund parcel courier warranty voucher module sensor turbine valve gasket "
    "nozzle piston bracket hinge rotor spindle"
).split()
SECRET_WORD = "qzvmarker"  # in every system prompt: must appear in no exported byte


def system_prompt(tenant: str, i: int) -> str:
    r = random.Random(f"proof-{tenant}-{i}")
    # distinct from the first token on (no two prompts share a cached block); ~330 words: about
    # 1700 tokens with the tiny model's tokenizer (max_model_len 2048)
    return f"{tenant} desk {i} {SECRET_WORD}: " + " ".join(r.choice(WORDS) for _ in range(330))


def workload() -> list[tuple[str, int, str]]:
    """(tenant, prompt, question) per request, in order. Prompt j of a tenant (rank 4j + t over
    all tenants) is read max(2, round(10 / rank^0.8)) times: a few popular prompts, most read
    twice (a prefix read once in a hot-key window is not a hot key, so neither a top-k from the hot
    keys nor the advisor ranks it), so the warm set's size decides how many first reads hit."""
    reqs = []
    for t, tenant in enumerate(TENANTS):
        for j in range(PER_TENANT):
            rank = 4 * j + t + 1
            reqs += [(tenant, j)] * max(2, round(10 / rank**0.8))
    random.Random(27).shuffle(reqs)
    return [
        (tenant, j, f"ticket {n}: where is order {n * 7919 % 100000}?")
        for n, (tenant, j) in enumerate(reqs)
    ]


def cli(store: Path, *args: str, replica: str = "proof", timeout: float = 900) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "warmscope.app.cli", "--store", str(store), *args],
        env={**os.environ, "WARMSCOPE_KEY_SECRET": SECRET, "WARMSCOPE_REPLICA": replica},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def probe_ttft(url: str, name: str) -> float:
    """TTFT of one streamed chat sent straight to an engine (wall clock: reported, not asserted)."""
    body = {
        "model": "tiny",
        "max_tokens": 1,
        "stream": True,
        "messages": [
            {"role": "system", "content": system_prompt(name, 0)},
            {"role": "user", "content": "a probe"},
        ],
    }
    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        for _ in r.iter_lines():
            return time.perf_counter() - t0
    raise AssertionError("empty stream")


class Gateway:
    """`warmscope gateway` in its own process, in front of one engine."""

    def __init__(
        self,
        store: Path,
        upstream: str,
        variant: str,
        experiment: str,
        library: Path | None = None,
        kv: bool = False,
    ) -> None:
        from warmscope.simulator.real_engine import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [
            "--store",
            str(store),
            "gateway",
            "--upstream",
            upstream,
            "--port",
            str(self.port),
            "--experiment",
            experiment,
            "--variant",
            variant,
        ]
        if library is not None:
            args += ["--prompt-library", str(library)]
        if kv:
            args.append("--kv-events")  # the engine's block truth into the store's block trace
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "warmscope.app.cli", *args],
            env={
                **os.environ,
                "WARMSCOPE_KEY_SECRET": SECRET,
                "WARMSCOPE_REPLICA": f"{variant.lower()}-0",
            },
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(self.url + "/v1/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None and time.monotonic() < deadline, self.stop()
            time.sleep(0.2)
        self.client = httpx.Client(base_url=self.url, timeout=120)

    def chat(self, tenant: str, session: str, system: str, question: str) -> dict:
        """One streamed chat (max_tokens 1); the engine's usage."""
        body = {
            "model": "tiny",
            "max_tokens": 1,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ],
        }
        usage = None
        with self.client.stream(
            "POST",
            "/v1/chat/completions",
            json=body,
            headers={"x-warmscope-tenant": tenant, "x-warmscope-session": session},
        ) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    usage = json.loads(line[6:]).get("usage") or usage
        return usage

    def stop(self) -> str:
        self.client = getattr(self, "client", None) and self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # uvicorn stops; the gateway flushes its store
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.stderr.read()


@pytest.fixture(scope="module")
def proof(vllm_engines, tmp_path_factory):
    t_start = time.monotonic()
    phases = {}

    def phase(name: str, t0: list[float] = [t_start]) -> None:  # noqa: B006 (the last mark)
        now = time.monotonic()
        phases[name], t0[0] = now - t0[0], now

    from tests.conftest import (
        free_port,  # below the ephemeral range (see _record in test_whatif_engine)
    )

    # the recording engine publishes its KV events (the block trace the evaluation replays);
    # A and B, started together, stay untouched until the warm-ups
    (rec_eng,) = vllm_engines(
        1,
        kv_events_endpoint=f"tcp://127.0.0.1:{free_port()}",
        kv_replay_endpoint=f"tcp://127.0.0.1:{free_port()}",
    )
    eng_a, eng_b = vllm_engines(2)
    phase("engines")
    tmp = tmp_path_factory.mktemp("proof")
    rec_store, ab_store, lib = tmp / "record.sqlite", tmp / "ab.sqlite", tmp / "library.jsonl"
    work = workload()
    # 1. the recording: one fresh engine behind the gateway
    gw = Gateway(rec_store, rec_eng.url, "R", "record", library=lib, kv=True)
    recorded = []
    for n, (tenant, j, q) in enumerate(work):
        u = gw.chat(tenant, f"rec-{n}", system_prompt(tenant, j), q)
        recorded.append((u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]))
    gw_log = gw.stop()
    rec_eng.stop()  # free the CPU for the A/B
    phase("recording")
    # 2. the advisor on the recording: the table printed, the same as JSON in a file
    text = cli(
        rec_store,
        "advise",
        *("--objective", "slo", "--slo-ttft-s", "0.05", "--slo-penalty", "0.01"),
        *("--versus-top-k", str(NAIVE_K), "--json", str(tmp / "advice.json")),
    )
    adv = json.loads((tmp / "advice.json").read_text())
    k = int(adv["warm_keys"])
    phase("advise")

    # 3. the A/B: warm-ups from the recording's hot keys (both at once), then the same requests
    def warm(arm: str, url: str, top: int) -> str:
        said = cli(
            rec_store,
            *("warmup", "--engine", url, "--from", "hot", "--library", str(lib)),
            *("--top-k", str(top), "--rate", "0", "--trigger", "replica_start", "--quiet"),
            replica=f"{arm.lower()}-0",
        )
        m = re.search(r"warm-up run (\w+): ok, (\d+) prefixes", said)
        assert m, said
        return m.group(1)

    with ThreadPoolExecutor(2) as ex:
        futs = {
            arm: ex.submit(warm, arm, e.url, top)
            for arm, e, top in (("A", eng_a, NAIVE_K), ("B", eng_b, k))
        }
        runs = {arm: f.result() for arm, f in futs.items()}
    phase("warm-ups")
    gws = {
        arm: Gateway(ab_store, eng.url, arm, "proof") for arm, eng in (("A", eng_a), ("B", eng_b))
    }
    replayed = []
    probes: dict[str, list[tuple[float, float]]] = {"A": [], "B": []}
    for n, (tenant, j, q) in enumerate(work):
        order = "AB" if n % 2 == 0 else "BA"  # neither arm always goes first
        if n % 16 == 8:
            # the engines' own speed, outside the A/B (straight to the engine, not recorded): the
            # same never-seen prompt on both, cold and then cached
            for arm in order:
                eng = (eng_a, eng_b)[arm == "B"]
                cold = probe_ttft(eng.url, f"probe {n}")
                probes[arm].append((cold, probe_ttft(eng.url, f"probe {n}")))
        for arm in order:
            u = gws[arm].chat(tenant, f"{arm}-{n}", system_prompt(tenant, j), q)
            replayed.append(
                dict(
                    arm=arm,
                    n=n,
                    tenant=tenant,
                    j=j,
                    prompt=u["prompt_tokens"],
                    cached=u["prompt_tokens_details"]["cached_tokens"],
                )
            )
    logs = {arm: g.stop() for arm, g in gws.items()}
    phase("A/B replay")
    yield dict(
        adv=adv,
        text=text,
        k=k,
        work=work,
        recorded=recorded,
        replayed=replayed,
        runs=runs,
        gw_log=gw_log,
        capacity=engine_capacity(eng_a.url),
        rec_store=rec_store,
        ab_store=ab_store,
        lib=lib,
        tmp=tmp,
        logs=logs,
        engines={"A": eng_a, "B": eng_b},
        probes=probes,
        t_start=t_start,
        phases=phases,
    )


def _warm_orders(proof) -> dict[str, list[tuple[str, int]]]:
    """(tenant, prompt) pairs each arm's warm-up run wrote, in the order it wrote them (its recorded
    warmed keys, oldest first)."""
    lib = read_library(proof["lib"])
    h = KeyHasher(SECRET.encode()).hash
    by_hash = {}
    for key, (_, _t, prefix) in lib.items():
        m = re.match(r"(\w+) desk (\d+) ", prefix[0][1])
        by_hash[h(key)] = (m.group(1), int(m.group(2)))
    wk = EmbeddedSource(proof["rec_store"]).frame("warmed_keys")
    return {
        arm: list(dict.fromkeys(
            by_hash[x] for x in wk[wk.run_id == run].sort_values("warmed_at", kind="stable")["key_hash"]))
        for arm, run in proof["runs"].items()
    }


def _warmed(proof) -> dict[str, set[tuple[str, int]]]:
    return {arm: set(order) for arm, order in _warm_orders(proof).items()}


def test_the_recommendation_is_a_warm_set_size_and_lead_time(proof):
    adv, work = proof["adv"], proof["work"]
    print("\n" + proof["text"])
    keys = {(t, j) for t, j, _ in work}
    assert adv["layer"] == "prefix_kv" and adv["keys"] == len(keys) == 80
    assert adv["objective"] == "slo" and adv["lead_s"] > 0
    # the recording's own first reads missed, the later ones hit: the replay without warm-up
    # reproduces its hit rate, and no request missed a prefix read before
    assert adv["re_miss_share"] == 0
    assert abs(adv["replayed_hit_rate"] - adv["recorded_hit_rate"]) < 0.01
    assert proof["k"] != NAIVE_K and 0 < proof["k"] <= len(keys)


def test_each_request_hits_exactly_when_its_prefix_was_warmed_or_read_before(proof):
    warmed = _warmed(proof)
    assert len(warmed["A"]) == NAIVE_K and len(warmed["B"]) == proof["k"]
    seen: dict[str, set] = {"A": set(), "B": set()}
    per_tenant: dict[tuple[str, str], list[int]] = {}
    for r in proof["replayed"]:
        key = (r["tenant"], r["j"])
        expect_hit = key in warmed[r["arm"]] or key in seen[r["arm"]]
        # a ~1700-token prefix read from the cache, or nothing (no two prompts share a block)
        assert r["cached"] >= 1024 if expect_hit else r["cached"] == 0, r
        seen[r["arm"]].add(key)
        t = per_tenant.setdefault((r["arm"], r["tenant"]), [0, 0])
        t[0] += r["cached"]
        t[1] += r["prompt"]
    # the A/B store's per-tenant token counts are the engines' own
    lk = EmbeddedSource(proof["ab_store"]).frame("lookups")
    lk = lk[lk.layer == "prefix_kv"]
    for (arm, tenant), (hit, total) in per_tenant.items():
        g = lk[(lk.variant == arm) & (lk.tenant == tenant)]
        assert g.loc[g.result == "hit", "count"].sum() == hit
        assert g.loc[g.result.isin(["hit", "miss"]), "count"].sum() == total
    for e in proof["engines"].values():
        c = e.counters()
        assert c["vllm:prefix_cache_hits_total"] >= sum(
            r["cached"] for r in proof["replayed"] if proof["engines"][r["arm"]] is e
        )


def test_the_predicted_difference_lies_within_the_measured_ci(proof):
    """The token hit rate is predicted and asserted within the A/B's CI. TTFT is predicted in
    seconds at the recording's engine speed and relative to the top-k's TTFT; on this shared
    machine an engine's speed moves with the other work on it, between the recording and the A/B
    and between the two arms' engines (the probes measure both), which the A/B's request-level CI
    does not include: the TTFT figures are printed, and only the direction is asserted."""
    adv = proof["adv"]
    vs = adv["versus"]
    rep = report_for(EmbeddedSource(proof["ab_store"]), "proof", primary="hit rate (prefix_kv)")
    res = {r.metric: r for r in rep.results}
    hr, tt = res["hit rate (prefix_kv)"], res["TTFT per request (s)"]
    lo, hi = vs["ttft_per_request_ci"]
    rlo, rhi = vs["ttft_relative_ci"]
    wk = EmbeddedSource(proof["rec_store"]).frame("warmup_runs").set_index("run_id")
    dur = {
        arm: float(wk.loc[run, "ended"] - wk.loc[run, "started"])
        for arm, run in proof["runs"].items()
    }
    line = adv["ttft_line"]
    pr = {arm: np.median(np.array(v), axis=0) for arm, v in proof["probes"].items()}
    # the prefill of one ~1500-token prefix on engine A during the A/B (probe cold − cached),
    # against the recording's line for the same tokens
    tok = np.mean(list(adv["prefix_tokens"].values()))
    prefill_a, prefill_rec = pr["A"][0] - pr["A"][1], line["per_token_s"] * tok
    at_ab_speed = vs["ttft_per_request_s"] * prefill_a / prefill_rec
    rows = [
        f"B (top-{proof['k']}, recommended) - A (top-{NAIVE_K}), "
        f"{rep.units.get('A')} / {rep.units.get('B')} requests per arm",
        "| metric | predicted (95 % CI) | measured B-A | 95 % CI |",
        "|---|---|---|---|",
        f"| token hit rate | {vs['hit_rate']:+.4f} | {hr.abs_effect:+.4f} | "
        f"{hr.abs_low:+.4f} to {hr.abs_high:+.4f} |",
        f"| TTFT per request (s) | {vs['ttft_per_request_s']:+.4f} ({lo:+.4f} to {hi:+.4f}) at "
        f"the recording's speed; {at_ab_speed:+.4f} at engine A's A/B speed (probes) | "
        f"{tt.abs_effect:+.4f} | {tt.abs_low:+.4f} to {tt.abs_high:+.4f} |",
        f"| TTFT per request, relative | {vs['ttft_relative']:+.1%} ({rlo:+.1%} to {rhi:+.1%}) | "
        f"{tt.rel_effect:+.1%} | {tt.rel_low:+.1%} to {tt.rel_high:+.1%} |",
        f"| warm-up duration (s) | {adv['lead_s']:.1f} (B), {adv['lead_s'] - vs['warm_s']:.1f} (A)"
        f" | {dur['B']:.1f} (B), {dur['A']:.1f} (A), the two at once | wall clock, not asserted |",
        f"mean TTFT per request: recording {line['mean_ttft_s']:.3f} s; A/B arm A "
        f"{tt.control:.3f} s, B {tt.treatment:.3f} s",
        f"probes (median of {len(proof['probes']['A'])}, cold / cached, s): engine A "
        f"{pr['A'][0]:.3f} / {pr['A'][1]:.3f}, engine B {pr['B'][0]:.3f} / {pr['B'][1]:.3f}; "
        f"recording's line {line['fixed_s'] + prefill_rec:.3f} / {line['fixed_s']:.3f}",
        "phases (s): " + ", ".join(f"{k} {v:.0f}" for k, v in proof["phases"].items()),
    ]
    print("\n" + "\n".join(rows))
    assert hr.abs_low <= vs["hit_rate"] <= hr.abs_high
    assert hr.abs_low > 0  # the recommendation's extra hits are real
    # TTFT: the predicted direction, and a measured interval that admits it
    assert vs["ttft_per_request_s"] < 0 and vs["ttft_relative"] < 0
    assert tt.abs_low < 0 and tt.rel_low < 0


def _tokens(url: str, messages: list[dict]) -> list[int]:
    """The engine's own tokens of a chat (its chat template, with the generation prompt)."""
    r = httpx.post(url + "/tokenize", json={"model": "tiny", "messages": messages}, timeout=60)
    r.raise_for_status()
    return r.json()["tokens"]


def _prompt_chains(trace, work, url: str) -> dict[tuple[str, int], list[int]]:
    """Each prompt's blocks its warm-up computes and a request of it can read: the warm-up sends
    the system message alone, so a request shares the full blocks before the first token where
    the two chats' tokens (the engine's /tokenize) part; the chain is the recording's first
    request of the prompt cut there."""
    out: dict[tuple[str, int], list[int]] = {}
    B = trace.block_size
    for i, (tenant, j, q) in enumerate(work):
        if (tenant, j) in out:
            continue
        system = {"role": "system", "content": system_prompt(tenant, j)}
        warm = _tokens(url, [system])
        req = _tokens(url, [system, {"role": "user", "content": q}])
        assert len(req) == trace.prompt[i]  # the same tokens the engine counted
        short = min(len(warm), len(req))
        same = next((n for n in range(short) if warm[n] != req[n]), short)  # tokens the two share
        lo = int(trace.offsets[i])
        assert same // B <= trace.full[i]
        out[(tenant, j)] = trace.h[lo : lo + same // B].tolist()
    return out


def test_the_trace_evaluation_predicts_each_arm(proof):
    """The paired warm-up evaluation's replay, at the A/B's one restart: the recording's block
    trace (the engine's KV events, through `warmscope gateway --kv-events`) replayed through the
    exact vLLM pool of the A/B engines' capacity, preloaded with each arm's warm set (the prompts
    its warm-up run wrote, as their block chains, in the order the run wrote them). Predicted:
    every replayed request's cached tokens; measured: what each engine reported. The prediction
    sits in the report beside the measured A/B; the difference must lie in the A/B's CI and
    every request must be predicted to the token (the engines hold 16,384 blocks: the recording,
    the warm-ups and the probes, which the recording does not hold, evict nothing)."""
    from warmscope.analysis.whatif.warmup import warmed_cached_tokens
    from warmscope.sources.trace_store import read_store_trace

    trace = read_store_trace(proof["rec_store"])
    work, recorded = proof["work"], proof["recorded"]
    # the trace is the recording, request by request (sent one at a time, in order)
    assert len(trace) == len(work), proof["gw_log"][-3000:]
    assert trace.prompt.tolist() == [p for p, _ in recorded]
    assert trace.cached.tolist() == [c for _, c in recorded]
    chains = _prompt_chains(trace, work, proof["engines"]["A"].url)
    assert all(len(c) * trace.block_size >= 1024 for c in chains.values())
    orders = _warm_orders(proof)
    cap = proof["capacity"]
    assert cap and cap > 1
    rows, pred_rate, meas_rate, exact, per_request = [], {}, {}, {}, {}
    for arm, order in orders.items():
        pred = warmed_cached_tokens(trace, [chains[p] for p in order], cap)
        meas = np.array([r["cached"] for r in proof["replayed"] if r["arm"] == arm])
        prompts = np.array([r["prompt"] for r in proof["replayed"] if r["arm"] == arm])
        assert prompts.tolist() == trace.prompt.tolist()  # the same requests, in the same order
        pred_rate[arm], meas_rate[arm] = pred.sum() / prompts.sum(), meas.sum() / prompts.sum()
        exact[arm] = int((pred == meas).sum())
        per_request[arm] = (pred, meas)
        rows.append(f"| {arm} ({len(order)} prompts warmed) | {pred_rate[arm]:.4f} | {meas_rate[arm]:.4f} | "
                    f"{exact[arm]}/{len(pred)} |")
    rep = report_for(EmbeddedSource(proof["ab_store"]), "proof", primary="hit rate (prefix_kv)")
    hr = {r.metric: r for r in rep.results}["hit rate (prefix_kv)"]
    diff = pred_rate["B"] - pred_rate["A"]
    print("\n" + "\n".join([
        f"the paired evaluation's replay on the recording's block trace ({len(trace)} requests, "
        f"{trace.n_blocks:,} blocks, engines of {cap:,} blocks), beside the measured A/B:",
        "| arm | predicted token hit rate | measured | requests predicted to the token |",
        "|---|---|---|---|",
        *rows,
        f"B-A: predicted {diff:+.4f}; measured {hr.abs_effect:+.4f} (95 % CI {hr.abs_low:+.4f} to "
        f"{hr.abs_high:+.4f}); the advisor's prediction {proof['adv']['versus']['hit_rate']:+.4f}",
    ]))
    assert hr.abs_low <= diff <= hr.abs_high
    for arm, (pred, meas) in per_request.items():  # every request, to the token
        wrong = [(n, int(p), int(m)) for n, (p, m) in enumerate(zip(pred, meas, strict=True)) if p != m]
        assert not wrong, (arm, "request, predicted, measured", wrong)


def test_no_prompt_text_in_the_stores(proof):
    blobs = [p.read_bytes() for p in Path(proof["tmp"]).glob("*.sqlite*")]
    assert blobs and sum(len(b) for b in blobs) > 10_000
    for blob in blobs:
        assert SECRET_WORD.encode() not in blob and b"turbine" not in blob
