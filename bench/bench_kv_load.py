"""Load test: many simulated engines' KV-event streams into sharded subscribers.

    python -m bench.bench_kv_load [--engines 200] [--shards 4] [--publishers 2] [--batches 400]

Each simulated engine replays a stream of event batches in vLLM's wire format (ZMQ multipart
``[topic, seq, msgpack EventBatch]``, events as maps, as vLLM 0.32 sends them), made once up
front from a Zipf prefix workload over a per-engine block cache with whole-prefix LRU eviction,
so the stream's truth is known: blocks stored and removed per engine, blocks resident at the
end. Publisher processes host the engines (a PUB socket connecting to the subscriber's
endpoint, and a ROUTER replay socket, as vLLM's publisher has); subscriber processes
(``KVSubscriber``) each bind the endpoints of the engines of their shard (``crc32(engine) %
shards``). Publishers send flat out, so a subscriber that falls behind sees PUB drops and has
to repair them from the replay sockets. At the end each shard reports its counts and every
engine is checked against its stream's truth: batches applied exactly once, nothing lost
(no unrepaired gap), stores, removals and resident blocks equal.

Prints per-shard throughput (block events per second of the shard's CPU time and of wall
time) and the check; exits 1 when any engine's counts differ from its truth.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import socket
import sys
import threading
import time
import zlib
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

BLOCK = 16
SALTS = (None, "tenant-a", "tenant-b", "tenant-c")


@dataclass
class Truth:
    batches: int = 0
    stored: int = 0
    removed: int = 0
    resident: int = 0
    block_events: int = 0


def make_stream(engine: int, n_batches: int, capacity: int = 256, prefixes: int = 400,
                seed: int = 0) -> tuple[list[bytes], Truth]:
    """One engine's stream: ``n_batches`` msgpack EventBatch payloads and their truth.

    A request picks a prefix (Zipf, 2-8 blocks, one of four salts); a resident prefix is a
    hit (no event), else its blocks are stored after removing least recently used prefixes
    until they fit in ``capacity`` blocks. Every batch carries at least one event."""
    import msgspec

    enc = msgspec.msgpack.Encoder()
    rng = random.Random(seed * 1_000_003 + engine)
    weights = [1.0 / (i + 1) for i in range(prefixes)]
    lru: OrderedDict[int, int] = OrderedDict()  # prefix -> its block count
    used, t, out, truth = 0, 1000.0, [], Truth()
    while len(out) < n_batches:
        p = rng.choices(range(prefixes), weights)[0]
        t += 0.01
        if p in lru:
            lru.move_to_end(p)
            continue
        n = 2 + p % 7
        events: list[dict[str, Any]] = []
        gone: list[int] = []
        while used + n > capacity:
            q, m = lru.popitem(last=False)
            used -= m
            gone += [_hash(engine, q, i) for i in range(m)]
        if gone:
            events.append({"type": "BlockRemoved", "block_hashes": gone, "medium": "GPU"})
        hashes = [_hash(engine, p, i) for i in range(n)]
        salt = SALTS[p % len(SALTS)]
        extra: list[Any] = [None] * n
        if salt:
            extra[0] = [salt]
        events.append({"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None,
                       "token_ids": [(p * 64 + i) % 50_000 for i in range(n * BLOCK)],
                       "block_size": BLOCK, "lora_id": None, "medium": "GPU", "lora_name": None,
                       "extra_keys": extra, "group_idx": 0})
        lru[p] = n
        used += n
        truth.stored += n
        truth.removed += len(gone)
        truth.block_events += n + len(gone)
        out.append(enc.encode([t, events, 0]))
    truth.batches = len(out)
    truth.resident = used
    return out, truth


def _hash(engine: int, prefix: int, i: int) -> int:
    # distinct per engine, prefix and position; a signed 64-bit int, as vLLM's int hashes
    return ((engine * 1_000_003 + prefix) * 64 + i + 1) % (1 << 62)


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _publisher(engines: list[tuple[str, str, str, int]], n_batches: int, seed: int,
               go: Any, done: Any, hwm: int = 1000) -> None:
    """Host ``engines`` (name, endpoint, replay endpoint, index): send every stream flat out,
    round robin, then answer replay requests until ``done`` is set."""
    import zmq

    ctx = zmq.Context()
    streams, pubs, routers = [], [], []
    for _name, ep, rep, idx in engines:
        streams.append(make_stream(idx, n_batches, seed=seed)[0])
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, hwm)  # a slow subscriber sees drops, as from a real engine
        pub.setsockopt(zmq.LINGER, 0)
        pub.connect(ep)
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(rep)
        pubs.append(pub)
        routers.append(router)
    stop = threading.Event()

    def serve() -> None:
        poller = zmq.Poller()
        for r in routers:
            poller.register(r, zmq.POLLIN)
        while not stop.is_set():
            for r, _ in poller.poll(50):
                i = routers.index(r)
                client, _, start = r.recv_multipart()
                for seq in range(int.from_bytes(start, "big"), len(streams[i])):
                    r.send_multipart([client, b"", b"", seq.to_bytes(8, "big"), streams[i][seq]])
                r.send_multipart([client, b"", b"", b"\xff" * 8, b""])

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    go.wait()
    for seq in range(n_batches):
        for i, pub in enumerate(pubs):
            pub.send_multipart([b"", seq.to_bytes(8, "big"), streams[i][seq]])
    done.wait()
    stop.set()
    server.join()
    ctx.destroy(0)


def _subscriber(engines: list[tuple[str, str, str, int]], n_batches: int, ready: Any,
                out: Any, timeout_s: float) -> None:
    from warmscope.collectors.kv import EngineSpec, KVState, KVSubscriber

    specs = [EngineSpec(name, ep, rep) for name, ep, rep, _ in engines]
    state = KVState([s.name for s in specs], max_blocks=4096)
    sub = KVSubscriber(specs, state, catch_up=False, replay_timeout_s=5.0, idle_probe_s=1.0)
    t0, c0 = time.perf_counter(), time.process_time()
    sub.start()
    ready.set()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = sub.stats()
        if all(st["engines"][s.name]["batches"] >= n_batches for s in specs):
            break
        time.sleep(0.05)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    st = sub.stats()
    sub.stop()
    rows = {}
    for name, _, _, _ in engines:
        e = st["engines"][name]
        per = [c for (eng, _), c in st["engine_salt"].items() if eng == name]
        rows[name] = {k: e[k] for k in ("batches", "gaps", "repaired", "unrepaired", "duplicates",
                                        "resident_blocks")}
        rows[name]["stored"] = sum(c["stores"] for c in per)
        rows[name]["removed"] = sum(c["evictions"] for c in per)
        # rows that did not fit the resident and content tables (the removed-block and
        # seen-block memories forget their oldest by design: not a loss)
        rows[name]["dropped"] = e["dropped_rows"]["resident"] + e["dropped_rows"]["content"]
    out.put({"rows": rows, "wall": wall, "cpu": cpu, "engines": len(engines),
             "decode_errors": st["decode_errors"]})


def run(engines: int = 200, shards: int = 4, publishers: int = 2, batches: int = 400,
        seed: int = 1, timeout_s: float = 600.0, hwm: int = 1000) -> dict[str, Any]:
    """Run the load test; returns per-engine truth and counts and per-shard figures
    (``hwm``: the publishers' send queue per engine; a small one drops more)."""
    ctx = mp.get_context("spawn")
    ports = _free_ports(2 * engines)
    specs = [(f"engine-{i:04d}", f"tcp://127.0.0.1:{ports[2 * i]}",
              f"tcp://127.0.0.1:{ports[2 * i + 1]}", i) for i in range(engines)]
    by_shard: list[list[tuple[str, str, str, int]]] = [[] for _ in range(shards)]
    for s in specs:
        by_shard[zlib.crc32(s[0].encode()) % shards].append(s)
    truth = {s[0]: make_stream(s[3], batches, seed=seed)[1] for s in specs}
    q = ctx.Queue()
    readies = [ctx.Event() for _ in range(shards)]
    subs = [ctx.Process(target=_subscriber, args=(by_shard[k], batches, readies[k], q, timeout_s))
            for k in range(shards) if by_shard[k]]
    for p in subs:
        p.start()
    for k, ev in enumerate(readies):
        if by_shard[k]:
            ev.wait(120)
    go, done = ctx.Event(), ctx.Event()
    pubs = [ctx.Process(target=_publisher,
                        args=(specs[j::publishers], batches, seed, go, done, hwm))
            for j in range(publishers)]
    for p in pubs:
        p.start()
    time.sleep(2.0)  # the publishers build their streams and connect
    t0 = time.perf_counter()
    go.set()
    results = [q.get(timeout=timeout_s + 120) for _ in subs]
    elapsed = time.perf_counter() - t0
    done.set()
    for p in subs + pubs:
        p.join(30)
    rows: dict[str, Any] = {}
    for r in results:
        rows.update(r["rows"])
    return {"truth": {k: asdict(v) for k, v in truth.items()}, "rows": rows,
            "shards": [{**{k: r[k] for k in ("wall", "cpu", "engines", "decode_errors")},
                        "block_events": sum(truth[n].block_events for n in r["rows"])}
                       for r in results], "elapsed": elapsed}


def check(res: dict[str, Any]) -> list[str]:
    """The engines whose counts differ from their stream's truth (empty: nothing lost or
    double-counted)."""
    bad = []
    for name, t in res["truth"].items():
        r = res["rows"].get(name)
        if r is None:
            bad.append(f"{name}: no shard reported it")
            continue
        want = {"batches": t["batches"], "stored": t["stored"], "removed": t["removed"],
                "resident_blocks": t["resident"], "unrepaired": 0, "dropped": 0}
        got = {k: r[k] for k in want}
        if got != want:
            bad.append(f"{name}: got {got}, want {want}")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", type=int, default=200)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--publishers", type=int, default=2)
    ap.add_argument("--batches", type=int, default=400, help="event batches per engine")
    ap.add_argument("--hwm", type=int, default=1000, help="publisher send queue per engine")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    res = run(a.engines, a.shards, a.publishers, a.batches, hwm=a.hwm)
    bad = check(res)
    if a.json:
        print(json.dumps({"shards": res["shards"], "elapsed": res["elapsed"], "bad": bad}))
        return 1 if bad else 0
    tot_events = sum(t["block_events"] for t in res["truth"].values())
    gaps = sum(r["gaps"] for r in res["rows"].values())
    repaired = sum(r["repaired"] for r in res["rows"].values())
    print(f"{a.engines} engines x {a.batches} batches = {a.engines * a.batches:,} batches, "
          f"{tot_events:,} block events, into {a.shards} subscriber processes "
          f"({a.publishers} publisher processes), {res['elapsed']:.1f} s")
    print(f"{'shard':>5} {'engines':>7} {'wall s':>7} {'cpu s':>7} {'block events':>12} "
          f"{'per cpu-s':>10}")
    for k, s in enumerate(res["shards"]):
        print(f"{k:>5} {s['engines']:>7} {s['wall']:>7.1f} {s['cpu']:>7.1f} "
              f"{s['block_events']:>12,} {s['block_events'] / max(s['cpu'], 1e-9):>10,.0f}")
    print(f"PUB drops repaired from replay sockets: {repaired:,} batches in {gaps:,} gaps")
    print("check: every engine's batches, stores, removals and resident blocks equal its stream's "
          + ("truth: OK" if not bad else f"truth: {len(bad)} engines DIFFER"))
    for b in bad[:10]:
        print("  " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
