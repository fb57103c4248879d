"""vLLM KV events: decoding and indexing rate, index memory, attribution cost.

    python -m bench.bench_kv_events [--batches 4000] [--blocks 1000000]

One run, three ratios:
  decode+index   block events (each hash of a BlockStored or BlockRemoved) decoded
                 and applied to a residency index of two engines, per second on
                 one core, against a bare ``msgspec.msgpack.Decoder.decode`` loop
                 over the same payloads (target >= 100,000 block events/s)
  memory         tracemalloc's count of what a full index of ``--blocks`` resident
                 blocks holds, per block (target <= 150 B)
  attribution    what the gateway's call adds per request (``KVState.attribute`` of a
                 judged 1,900-token request), and what judging a store costs on the
                 subscriber's thread (target <= 20 us per request)

The stream is shaped like the real engine's (vLLM 0.32: map-encoded events, 32-token
blocks): every batch stores a 16-block chain (a new request) and removes 16 blocks.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import time
import tracemalloc
from collections.abc import Callable

import msgspec
from warmscope.collectors.kv import KVState
from warmscope.collectors.kv.decode import DecodeStats, decode_message, decode_payload
from warmscope.collectors.kv.index import ResidencyIndex

from bench.common import best_ns, table


def best_cpu_ns(fn: Callable[[], None], n_ops: int, repeat: int = 3) -> float:
    """Like best_ns, in this thread's CPU time: a core's rate on a shared machine
    (wall time counts the time other processes hold the core)."""
    best = float("inf")
    for _ in range(repeat):
        t = time.thread_time_ns()
        fn()
        best = min(best, time.thread_time_ns() - t)
    return best / n_ops

BS = 32
ENC = msgspec.msgpack.Encoder()


def stream(n_batches: int, per_batch: int, seed: int = 1,
           sessions: bool = True) -> list[list[bytes]]:
    rnd = random.Random(seed)
    msgs: list[list[bytes]] = []
    live: list[int] = []
    for seq in range(n_batches):
        hashes = [rnd.getrandbits(64) for _ in range(per_batch)]
        toks = [rnd.randrange(32000) for _ in range(per_batch * BS)]
        events: list[dict[str, object]] = [{
            "type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None,
            "token_ids": toks, "block_size": BS, "lora_id": None, "medium": "GPU",
            "lora_name": None, "extra_keys": [None] * per_batch, "group_idx": 0,
            "session_id": f"s{seq}" if sessions else None}]
        if len(live) >= 4 * per_batch:
            events.insert(0, {"type": "BlockRemoved", "block_hashes": live[:per_batch],
                              "medium": "GPU", "group_idx": 0})
            live = live[per_batch:]
        live.extend(hashes)
        msgs.append([b"", seq.to_bytes(8, "big"), ENC.encode([time.time(), events, 0])])
    return msgs


def block_events(msgs: list[list[bytes]]) -> int:
    st = DecodeStats()
    n = 0
    for m in msgs:
        b = decode_message(m, st)
        assert b is not None
        n += sum(len(e[1]) for e in b.events if len(e) > 1)
    return n


def bench_rate(n_batches: int) -> list[tuple[str, float]]:
    msgs = stream(n_batches, 16)
    plain = stream(n_batches, 16, sessions=False)  # engine-only mode: nothing to judge
    n_blocks = block_events(msgs)
    dec = msgspec.msgpack.Decoder()
    payloads = [m[2] for m in msgs]

    def bare() -> None:
        for p in payloads:
            dec.decode(p)

    def decode_only() -> None:
        st = DecodeStats()
        for i, p in enumerate(payloads):
            decode_payload(p, i, st)

    states: list[KVState] = []

    def run(stream_: list[list[bytes]]) -> None:
        state = states.pop()  # a new, empty index each run (built outside the timing)
        st = DecodeStats()
        for i, m in enumerate(stream_):
            b = decode_message(m, st)
            if b is not None:
                state.apply("e1" if i % 2 else "e2", b)

    def index_only() -> None:
        run(plain)

    def full() -> None:
        run(msgs)

    cases = (("bare msgspec decode", bare), ("warmscope decode", decode_only),
             ("decode + index", index_only), ("decode + index + judge", full))
    def fresh(repeat: int) -> int:
        states[:] = [KVState(["e1", "e2"], max_blocks=200_000) for _ in range(repeat)]
        return repeat

    rows = [(name, best_cpu_ns(fn, n_blocks, repeat=fresh(3))) for name, fn in cases]
    wall = {name: best_ns(fn, n_blocks, repeat=fresh(2)) for name, fn in cases}
    print(f"\n{n_batches} batches, {n_blocks} block events (stores and removals); "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(table(rows, "bare msgspec decode", unit="cpu ns/block"))
    for name, ns in rows:
        print(f"  {name:<24} {1e9 / ns:>12,.0f} block events per CPU-second "
              f"({1e9 / wall[name]:>10,.0f} per wall second)")
    return rows


def bench_memory(n_blocks: int) -> float:
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    idx = ResidencyIndex(max_blocks=n_blocks)
    rnd = random.Random(2)
    chain = 64
    t0 = time.perf_counter()
    toks = [rnd.randrange(32000) for _ in range(chain * BS)]
    for i in range(0, n_blocks, chain):
        hashes = [rnd.getrandbits(64) for _ in range(min(chain, n_blocks - i))]
        toks[0] = i  # a new chain each time
        sb = idx.read_store(hashes, None, toks[:len(hashes) * BS], BS, None)
        idx.store(sb, None, BS, 1.0 + i)
    fill_s = time.perf_counter() - t0
    assert idx.resident_blocks() == n_blocks, idx.resident_blocks()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    per = used / n_blocks
    print(f"\nmemory: {n_blocks:,} resident blocks: {used / 2**20:.1f} MiB by tracemalloc, "
          f"{per:.1f} B per resident block (arrays: {idx.nbytes() / n_blocks:.1f} B; "
          f"filled in {fill_s:.1f} s); target <= 150 B")
    return per


def bench_attribution(n: int = 2000) -> tuple[float, float]:
    state = KVState(["e1", "e2"], max_blocks=200_000)
    msgs = stream(n, 59, seed=3)  # 59 stored blocks: a 1,900-token prompt, nothing cached
    st = DecodeStats()
    batches = [decode_message(m, st) for m in msgs]
    t0 = time.perf_counter_ns()
    for i, b in enumerate(batches):
        assert b is not None
        state.apply("e1" if i % 2 else "e2", b)
    apply_ns = (time.perf_counter_ns() - t0) / n
    sids = [f"s{i}" for i in range(n)]

    def attribute() -> None:
        for s in sids:
            state.attribute(s, 1900, 0)

    per_req = best_cpu_ns(attribute, n, repeat=5)
    print(f"\nattribution: {per_req / 1000:.2f} us CPU per request at the gateway "
          f"(wall {best_ns(attribute, n, repeat=3) / 1000:.2f} us; target <= 20 us); "
          f"the subscriber's thread spends {apply_ns / 1000:.0f} us per 59-block store "
          f"(judging and indexing)")
    return per_req, apply_ns


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=4000)
    ap.add_argument("--blocks", type=int, default=1_000_000)
    args = ap.parse_args()
    rows = dict(bench_rate(args.batches))
    per = bench_memory(args.blocks)
    att, _ = bench_attribution()
    print("\nsummary (CPU time of one thread)")
    for case in ("decode + index", "decode + index + judge"):
        print(f"  {case + ' /s':<24} {1e9 / rows[case]:>12,.0f}  target 100,000  "
              f"({rows[case] / rows['bare msgspec decode']:.1f}x a bare decode's time)")
    print(f"  bytes per resident block {per:>12.1f}  target 150")
    print(f"  attribution per request  {att / 1000:>12.2f}  us, target 20")


if __name__ == "__main__":
    main()
