"""What the OpenAI-compatible instrumentation and the gateway add per request.

1. Client: the same chat completion (non-streamed and streamed) through a
   plain ``httpx.Client`` and through one with :class:`InstrumentedTransport`,
   both over an in-process transport that returns a canned vLLM reply, so
   the difference is the instrumentation alone (µs per request, and the ratio),
   in interleaved random-order rounds, by CPU time (robust to other processes
   on a loaded machine) and by the wall clock; and the recorder by itself.
   The whole measurement is repeated (``--repeat``): each repeat's figures are
   printed, and the verdict is taken from the median of the repeats.
2. The median request to the tiny model on a real vLLM engine (``--engine URL``,
   or one started here when vLLM is installed; ``--no-engine`` skips it): the
   added µs as a share of it (target: at most 50 µs and under 1 %).
3. Gateway: requests straight to an upstream vs through ``warmscope gateway``
   in front of it (each in its own process), interleaved over loopback HTTP
   in this run; added latency at P50/P99.

    python -m bench.bench_client [--n 5000] [--repeat 5] [--engine URL | --no-engine]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx
from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.openai_client import InstrumentedTransport
from warmscope.collectors.pipeline import Telemetry

SYSTEM = "You are the support bot of a parts shop. Answer in one line. " * 8
BODY = {"model": "tiny", "max_tokens": 1, "messages": [{"role": "system", "content": SYSTEM},
                                                        {"role": "user", "content": "Where is my parcel?"}]}
USAGE = {"prompt_tokens": 512, "completion_tokens": 1, "total_tokens": 513,
         "prompt_tokens_details": {"cached_tokens": 480}}
REPLY = json.dumps({"id": "c", "object": "chat.completion", "model": "tiny", "usage": USAGE,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                 "finish_reason": "length"}]}).encode()
SSE = b"".join([b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":null}\n\n',
                b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"ok"}}],"usage":null}\n\n',
                b'data: {"id":"c","choices":[],"usage":' + json.dumps(USAGE).encode() + b'}\n\n',
                b"data: [DONE]\n\n"])


def canned(request: httpx.Request) -> httpx.Response:
    if b'"stream"' in request.content:
        return httpx.Response(200, stream=httpx.ByteStream(SSE), headers={"content-type": "text/event-stream"})
    # a body still to be read, as from the network
    return httpx.Response(200, stream=httpx.ByteStream(REPLY), headers={"content-type": "application/json"})


def telemetry(folder: str) -> Telemetry:
    """A pipeline writing to an embedded store in ``folder`` (flushed only when
    closed: nothing runs beside the measured requests)."""
    cfg = CollectorConfig.load(env={}, exporter="embedded", store_path=folder + "/b.sqlite", key_secret="bench")
    return Telemetry(cfg, background=False)


def client_overhead(n: int, rounds: int = 150) -> dict[str, float]:
    """µs per request of each case, from ``rounds`` short batches with the
    plain and the instrumented client in random order within each round. Each
    batch is timed twice: by this thread's CPU time (what the instrumentation
    costs; time spent waiting while other processes run is not counted) and by
    the wall clock. The added time is the median of the per-round differences
    (load changes hit both cases of a round alike), with their quartiles."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        tel = telemetry(folder)
        try:
            return _client_overhead(tel, n, rounds)
        finally:
            tel.close()  # the pipeline's rows written to its store, as a service's pipeline at exit


def _client_overhead(tel: Telemetry, n: int, rounds: int) -> dict[str, float]:
    import random

    plain = httpx.Client(base_url="http://engine", transport=httpx.MockTransport(canned))
    inst = httpx.Client(base_url="http://engine",
                        transport=InstrumentedTransport(httpx.MockTransport(canned), telemetry=tel))
    batch = max(n // rounds, 5)
    rng = random.Random(7)
    out = {}
    for name, body in (("non-streamed", BODY), ("streamed", {**BODY, "stream": True})):
        def run(c, body=body):
            w, t = time.perf_counter_ns(), time.thread_time_ns()
            for _ in range(batch):
                with c.stream("POST", "/v1/chat/completions", json=body) as r:
                    for _ in r.iter_bytes():
                        pass
            return ((time.thread_time_ns() - t) / batch / 1000.0, (time.perf_counter_ns() - w) / batch / 1000.0)
        run(plain), run(inst)  # warm
        pairs = []
        for _ in range(rounds):
            if rng.random() < 0.5:
                p, i = run(plain), run(inst)
            else:
                i, p = run(inst), run(plain)
            pairs.append((p, i))
        for j, clock in ((0, "cpu"), (1, "wall")):
            d = sorted(i[j] - p[j] for p, i in pairs)
            out[f"{name} {clock} plain"] = statistics.median(p[j] for p, _ in pairs)
            out[f"{name} {clock} instrumented"] = statistics.median(i[j] for _, i in pairs)
            out[f"{name} {clock} added"] = statistics.median(d)
            out[f"{name} {clock} q1"], out[f"{name} {clock} q3"] = d[len(d) // 4], d[3 * len(d) // 4]
    st = inst._transport.recorder.stats
    assert st["recorded"] > 0 and st["no_usage"] == 0, st
    out["recorder"] = recorder_alone(tel, rounds)
    plain.close()
    inst.close()
    return out


def recorder_alone(tel: Telemetry, rounds: int, batch: int = 50) -> float:
    """µs per request of the recorder by itself (parse the request, key, read
    the usage, count), on the same canned exchange, median over rounds."""
    from warmscope.collectors.llm import LLMRecorder

    rec = LLMRecorder(tel)
    req = httpx.Request("POST", "http://engine/v1/chat/completions", json=BODY)
    raw, hdrs = req.content, req.headers

    def one() -> float:
        t = time.thread_time_ns()
        for _ in range(batch):
            ex = rec.begin("POST", "/v1/chat/completions", hdrs, raw)
            ex.response(200, "application/json")
            ex.feed(REPLY)
            ex.finish()
        return (time.thread_time_ns() - t) / batch / 1000.0

    one()
    return statistics.median(one() for _ in range(rounds))


def engine_median(url: str, n: int = 40) -> float:
    with httpx.Client(base_url=url, timeout=60) as c:
        times = []
        for _ in range(n):
            t = time.perf_counter()
            c.post("/v1/chat/completions", json=BODY).raise_for_status()
            times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def _free_port() -> int:
    import socket

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return int(sk.getsockname()[1])


def _spawn(args: list[str], url: str, env: dict | None = None):
    """A server in its own process (as deployed; in-process threads would
    measure the GIL instead), returned once it answers."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return proc
        except httpx.TransportError:
            if proc.poll() is not None:
                raise RuntimeError(f"{args} exited: {proc.stderr.read().decode()[-500:]}") from None
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{args} did not answer within 60 s")


def gateway_latency(upstream: str, n: int) -> tuple[list[float], list[float]]:
    import os
    import tempfile

    port = _free_port()
    env = dict(os.environ, WARMSCOPE_STORE=tempfile.mkdtemp() + "/gw.sqlite", WARMSCOPE_KEY_SECRET="bench")
    gw_url = f"http://127.0.0.1:{port}"
    gw = _spawn(["-m", "warmscope.app.cli", "gateway", "--upstream", upstream, "--port", str(port)], gw_url, env)
    direct, via = [], []
    try:
        with httpx.Client(timeout=60) as c:
            for i in range(n + 20):
                for base, acc in ((upstream, direct), (gw_url, via)):   # interleaved: the same load on both
                    t = time.perf_counter()
                    c.post(base + "/v1/chat/completions", json=BODY).raise_for_status()
                    if i >= 20:
                        acc.append((time.perf_counter() - t) * 1e6)
    finally:
        gw.terminate()
        gw.wait(30)
    return direct, via


def serve_canned(port: int) -> None:
    """An upstream that answers every completion at once with the canned reply."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def reply(request):
        await request.body()
        return Response(REPLY, media_type="application/json")

    uvicorn.run(Starlette(routes=[Route("/v1/chat/completions", reply, methods=["POST", "GET"])]),
                host="127.0.0.1", port=port, log_level="warning")


def q(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=5000,
                    help="requests per client case and repeat (default 5000, in 150 rounds)")
    ap.add_argument("--repeat", type=int, default=5,
                    help="times the client measurement is repeated; the verdict is the median of the repeats "
                         "(default 5)")
    ap.add_argument("--gateway-n", type=int, default=400, help="requests per gateway case (default 400)")
    ap.add_argument("--engine", help="a running vLLM engine's URL (default: start one if vLLM is installed)")
    ap.add_argument("--no-engine", action="store_true", help="skip the real-engine figures")
    ap.add_argument("--serve-canned", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.repeat < 1 or args.n < 1:
        ap.error("--n and --repeat must be at least 1")
    if args.serve_canned:
        return serve_canned(args.serve_canned)

    import os

    print(f"load average at start: {os.getloadavg()[0]:.1f} (2-core machine figures scale with it)")
    print(f"client instrumentation, in-process canned engine reply, {args.repeat} repeats (CPU time; added = "
          "median of the per-round differences in random-order rounds):")
    reps = []
    for k in range(args.repeat):
        r = client_overhead(args.n)
        reps.append(r)
        print(f"  repeat {k + 1}: non-streamed added {r['non-streamed cpu added']:5.1f} µs "
              f"(plain {r['non-streamed cpu plain']:6.1f})  streamed added {r['streamed cpu added']:5.1f} µs "
              f"(plain {r['streamed cpu plain']:6.1f})  load {os.getloadavg()[0]:.1f}")
    r = {k: statistics.median(x[k] for x in reps) for k in reps[0]}
    print(f"median of the {args.repeat} repeats (each figure's median over the repeats; [quartiles of the "
          "per-round differences, likewise]):")
    added = {}
    for name in ("non-streamed", "streamed"):
        for clock, what in (("cpu", "CPU time "), ("wall", "wall clock")):
            p, i, a = r[f"{name} {clock} plain"], r[f"{name} {clock} instrumented"], r[f"{name} {clock} added"]
            if clock == "cpu":
                added[name] = a
            print(f"  {name:<13} {what} plain {p:7.1f} µs/request  instrumented {i:7.1f} µs/request  "
                  f"added {a:6.1f} µs [{r[f'{name} {clock} q1']:.1f}, {r[f'{name} {clock} q3']:.1f}]  "
                  f"ratio {i / p:5.3f}x")
    print(f"  the recorder by itself (no HTTP, CPU time): {r['recorder']:.1f} µs/request "
          f"({100 * r['recorder'] / r['non-streamed cpu plain']:.1f} % of a plain request's CPU time)")
    worst = max(added.values())
    print(f"  target at most 50 µs added (CPU time, median of the repeats): "
          f"{'met' if worst <= 50 else 'NOT met'} ({worst:.1f} µs)")

    port = _free_port()
    up = f"http://127.0.0.1:{port}"
    upstream = _spawn(["-m", "bench.bench_client", "--serve-canned", str(port)], up + "/v1/chat/completions")
    try:
        d, v = gateway_latency(up, args.gateway_n)
    finally:
        upstream.terminate()
        upstream.wait(30)
    print(f"gateway, loopback upstream answering at once ({args.gateway_n} requests each, interleaved):")
    for p in (50, 99):
        print(f"  P{p}: direct {q(d, p) / 1000:6.2f} ms  via gateway {q(v, p) / 1000:6.2f} ms  "
              f"added {(q(v, p) - q(d, p)) / 1000:6.2f} ms")

    if not args.no_engine:
        real_engine_figures(args, max(added.values()))
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


def real_engine_figures(args: argparse.Namespace, worst: float) -> None:
    eng = None
    url = args.engine
    if url is None:
        from warmscope.simulator import real_engine

        if not real_engine.installed():
            print("real engine: vLLM not installed (python -m warmscope.simulator.real_engine install); skipped")
            return
        eng = real_engine.VLLMEngine(log=lambda s: None).start()
        url = eng.url
    try:
        med = engine_median(url)
        print(f"real engine (tiny model): median request {med / 1000:.1f} ms; instrumentation adds "
              f"{worst:.1f} µs = {100 * worst / med:.3f} % of it")
        d, v = gateway_latency(url, min(args.gateway_n, 100))
        for p in (50, 99):
            print(f"  gateway to the engine P{p}: direct {q(d, p) / 1000:6.2f} ms  via gateway "
                  f"{q(v, p) / 1000:6.2f} ms  added {(q(v, p) - q(d, p)) / 1000:6.2f} ms")
    finally:
        if eng is not None:
            eng.stop()


if __name__ == "__main__":
    main()
