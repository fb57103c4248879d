"""`warmscope demo --engine vllm`: the simulator's traffic shapes against a real
vLLM engine, so real prefix-cache hits can be watched as they arrive.

What it does:

1. installs vLLM's CPU build and builds the tiny model (once, about 4 minutes;
   see :mod:`simulator.real_engine`) and starts an engine on a free loopback
   port — or uses the OpenAI-compatible engine given with ``--engine-url``;
2. starts Prometheus (when the ``prometheus`` binary is installed) scraping the
   engine every 2 s with the project's ``rules/`` loaded, and the dashboard in
   engine-only mode reading it;
3. sends the simulator's traffic: tenants with Zipf-weighted popularity, each
   with its own prompt templates (summarise, chat, RAG Q&A, …) whose system
   prompt is shared by every request of that tenant and template, and Zipf-
   distributed fills — so popular prompts repeat and hit whole 32-token blocks;
4. prints, every ``--every`` seconds, the engine's own counters: requests,
   prompt and cached tokens, the hit rate since the start and over the last
   interval, and the tenants with the most cached tokens.

Ctrl-C (or ``--duration``) stops the traffic, the dashboard, Prometheus and the
engine it started.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TextIO

import numpy as np

__all__ = ["add_arguments", "run", "Traffic"]

_WORDS = (
    "report invoice contract summary ticket policy refund chapter section figure table customer "
    "order shipment warranty release feature request account billing meeting agenda design review"
).split()
SCALE = (
    8  # the simulator's prompt lengths are for 8k-context models; the tiny model has 2048 tokens
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("real engine (--engine vllm)")
    g.add_argument(
        "--engine",
        choices=["vllm"],
        help="send simulator-shaped traffic to a real engine instead of "
        "simulating one: 'vllm' runs vLLM's CPU build with a tiny model (installed once, ~4 min)",
    )
    g.add_argument(
        "--engine-url",
        help="use this running OpenAI-compatible engine (e.g. http://127.0.0.1:8000) "
        "instead of starting one; its /metrics must be vLLM's",
    )
    g.add_argument(
        "--rps",
        type=float,
        default=6.0,
        help="mean requests per second sent to the engine (default 6)",
    )
    g.add_argument(
        "--duration",
        type=float,
        default=None,
        help="stop after this many seconds (default: run until Ctrl-C)",
    )
    g.add_argument(
        "--every", type=float, default=10.0, help="seconds between progress lines (default 10)"
    )
    g.add_argument("--seed", type=int, default=7, help="traffic seed (default 7)")


class Traffic:
    """Simulator-shaped chat requests: (tenant, messages)."""

    def __init__(self, seed: int = 7, tenants: int = 6) -> None:
        from warmscope.simulator import SimConfig
        from warmscope.simulator.traffic import TEMPLATES, make_tenants, tenant_weights

        self.rng = np.random.default_rng(seed)
        self.tenants = make_tenants(SimConfig.load(tenants=tenants, seed=seed), self.rng)
        self.weights = tenant_weights(len(self.tenants))
        self.templates = TEMPLATES

    def _text(self, key: str, n_words: int) -> str:
        r = np.random.default_rng(_stable(key))
        return " ".join(_WORDS[i] for i in r.integers(0, len(_WORDS), n_words))

    def next(self) -> tuple[str, list[dict[str, str]]]:
        from warmscope.simulator.traffic import pick_template

        t = self.tenants[int(self.rng.choice(len(self.tenants), p=self.weights))]
        tpl = self.templates[pick_template(t, float(self.rng.random()))]
        system = f"You are the {tpl.name} assistant of {t.name}. " + self._text(
            f"sys:{t.name}:{tpl.name}", tpl.sys_tokens // SCALE
        )
        fill = int((self.rng.zipf(1.25) - 1) % 4000)  # popular fills repeat
        lo, hi = tpl.query_tokens
        query = self._text(f"fill:{t.name}:{tpl.name}:{fill}", max(4, (lo + hi) // 2 // SCALE))
        return t.name, [{"role": "system", "content": system}, {"role": "user", "content": query}]


def _stable(key: str) -> int:
    import zlib

    return zlib.crc32(key.encode())


def _counters(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("#"):
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0].replace(":", "_")
            if name in ("vllm_prefix_cache_hits_total", "vllm_prefix_cache_queries_total"):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _chat(base_url: str, model: str, messages: list[dict[str, str]]) -> tuple[int, int]:
    """One chat completion's prompt tokens and cached prompt tokens."""
    body = json.dumps(
        {"model": model, "messages": messages, "max_tokens": 1, "temperature": 0}
    ).encode()
    req = urllib.request.Request(
        base_url + "/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        usage = json.loads(r.read())["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return int(usage["prompt_tokens"]), int(cached)


def _served_model(url: str) -> str:
    with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=10) as r:
        model: str = json.loads(r.read())["data"][0]["id"]
        return model


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_prometheus(engine_url: str, tmp: Path) -> tuple[subprocess.Popen[bytes] | None, str]:
    binary = shutil.which("prometheus")
    if not binary:
        return None, ""
    rules_dir = Path(__file__).resolve().parents[2] / "rules"  # app/cli/ -> the checkout
    rules = sorted(str(p) for p in rules_dir.glob("*.yml")) if rules_dir.is_dir() else []
    target = engine_url.split("://", 1)[-1].rstrip("/")
    (tmp / "prometheus.yml").write_text(
        "global: {scrape_interval: 2s, evaluation_interval: 10s}\n"
        f"rule_files: {json.dumps(rules)}\n"
        f"scrape_configs:\n  - job_name: vllm\n    static_configs: [{{targets: ['{target}']}}]\n"
    )
    port = _free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc, f"http://127.0.0.1:{port}"


def _start_dashboard(prom_url: str, port: int, address: str, tmp: Path) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ, WARMSCOPE_PROMETHEUS_URL=prom_url, WARMSCOPE_STORE=str(tmp / "no-store.sqlite")
    )
    env.pop("WARMSCOPE_REDIS_URL", None)
    main = Path(__file__).resolve().parents[1] / "dashboard" / "main.py"
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(main),
            "--server.headless",
            "true",
            "--server.port",
            str(port),
            "--server.address",
            address,
            "--browser.gatherUsageStats",
            "false",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Run the live demo; returns the exit code."""
    from warmscope.simulator import real_engine

    if args.rps <= 0 or args.every <= 0 or (args.duration is not None and args.duration <= 0):
        print("warmscope demo: --rps, --every and --duration must be positive", file=sys.stderr)
        return 2
    engine = None
    procs: list[subprocess.Popen[bytes]] = []
    tmp = Path(tempfile.mkdtemp(prefix="warmscope-engine-demo-"))
    try:
        if args.engine_url:
            url = args.engine_url.rstrip("/").removesuffix("/v1")
            try:
                model = _served_model(url)
                _counters(url)
            except (OSError, ValueError, KeyError, IndexError) as e:
                print(
                    f"warmscope demo: no OpenAI-compatible engine with vLLM metrics at {url} "
                    f"({e}); start one or drop --engine-url to let the demo start vLLM",
                    file=sys.stderr,
                )
                return 1
        else:
            print(
                "starting vLLM's CPU build with a tiny model (the first run installs it: about 4 "
                "minutes; each start: 1-2 minutes)…",
                file=sys.stderr,
            )
            engine = real_engine.VLLMEngine().start()
            url, model = engine.url, engine.model
            print(f"vLLM ready at {engine.base_url} in {engine.startup_s:.0f} s", file=sys.stderr)
        if not args.no_dashboard:
            prom, prom_url = _start_prometheus(url, tmp)
            if prom is None:
                print(
                    "prometheus is not installed: no dashboard, progress lines only "
                    "(scripts/test.sh installs it)",
                    file=sys.stderr,
                )
            else:
                procs.append(prom)
                procs.append(_start_dashboard(prom_url, args.port, args.address, tmp))
                print(
                    f"Prometheus at {prom_url} scrapes the engine every 2 s; dashboard "
                    f"(engine-only mode) on http://{args.address}:{args.port} — the hit rate "
                    "appears after the first scrapes",
                    file=sys.stderr,
                )
        return _drive(url, model, args, out)
    except real_engine.EngineError as e:
        print(f"warmscope demo: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        if engine is not None:
            engine.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _drive(url: str, model: str, args: argparse.Namespace, out: TextIO) -> int:
    traffic = Traffic(seed=args.seed)
    lock = threading.Lock()
    stop = threading.Event()
    per_tenant: dict[str, list[int]] = {}
    errors = [0]  # failed requests
    last_error = [""]
    base = url + "/v1"
    interval = 1.0 / args.rps

    def worker(seed: int) -> None:
        rnd = np.random.default_rng(seed)
        while not stop.is_set():
            with lock:
                tenant, messages = traffic.next()
            try:
                prompt, cached = _chat(base, model, messages)
                with lock:
                    s = per_tenant.setdefault(tenant, [0, 0, 0])
                    s[0] += 1
                    s[1] += prompt
                    s[2] += cached
            except (OSError, ValueError, KeyError) as e:
                with lock:
                    errors[0] += 1
                    last_error[0] = str(e)[:120]
            stop.wait(float(rnd.exponential(interval * 4)))  # four workers: args.rps in total

    c0 = _counters(url)
    t0 = time.monotonic()
    workers = [
        threading.Thread(target=worker, args=(args.seed * 100 + i,), daemon=True) for i in range(4)
    ]
    for w in workers:
        w.start()
    print(
        f"sending simulator-shaped traffic ({len(traffic.tenants)} tenants, ~{args.rps:g} req/s) "
        f"to {base}; Ctrl-C stops",
        file=sys.stderr,
    )
    last = c0
    try:
        while args.duration is None or time.monotonic() - t0 < args.duration:
            time.sleep(min(args.every, max(0.1, (args.duration or 1e9) - (time.monotonic() - t0))))
            now = _counters(url)
            h = now.get("vllm_prefix_cache_hits_total", 0) - c0.get(
                "vllm_prefix_cache_hits_total", 0
            )
            q = now.get("vllm_prefix_cache_queries_total", 0) - c0.get(
                "vllm_prefix_cache_queries_total", 0
            )
            dh = now.get("vllm_prefix_cache_hits_total", 0) - last.get(
                "vllm_prefix_cache_hits_total", 0
            )
            dq = now.get("vllm_prefix_cache_queries_total", 0) - last.get(
                "vllm_prefix_cache_queries_total", 0
            )
            last = now
            with lock:
                n = sum(s[0] for s in per_tenant.values())
                top = sorted(per_tenant.items(), key=lambda kv: -kv[1][2])[:3]
                err = f"; {errors[0]} failed ({last_error[0]})" if errors[0] else ""
            tops = ", ".join(f"{k} {v[2] / v[1]:.0%}" for k, v in top if v[1])
            print(
                f"{time.monotonic() - t0:5.0f} s  requests {n:,}  prompt tokens {q:,.0f}  cached "
                f"{h:,.0f}  hit rate {h / q if q else 0:.1%} (last {args.every:g} s: "
                f"{dh / dq if dq else 0:.1%})  top tenants: {tops or '–'}{err}",
                file=out,
                flush=True,
            )
    finally:
        stop.set()
        for w in workers:
            w.join(70)
    return 0
