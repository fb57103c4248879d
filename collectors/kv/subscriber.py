"""The ZMQ subscriber: one SUB socket per engine, a daemon thread, gap repair, no raising.

vLLM's publisher *connects* when its endpoint names a host
(``tcp://127.0.0.1:PORT``) and binds when it names ``*``; the subscriber does the
other: it binds the engine's endpoint in the first case and connects to the
engine's host in the second. It never binds every interface unless told to.

Each engine's batches are numbered; a batch whose number is ahead of the one
expected is a gap (a subscriber that joined late, a message lost while it was
away): the missing batches are asked from the engine's replay socket (ROUTER,
``replay_endpoint``), applied in order, and what the engine no longer has is
counted as unrepaired. A number behind the one expected is an engine restart:
that engine's residency is cleared (its cache is empty) and the missing start
of the new stream is repaired the same way.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import zmq

from .attribution import KVState
from .decode import Batch, DecodeStats, decode_message

__all__ = ["engine_capacity", "EngineSpec", "KVSubscriber", "discover"]

log = logging.getLogger("warmscope.kv")
_END_SEQ = b"\xff" * 8


@dataclass
class EngineSpec:
    """One engine's event stream: ``endpoint`` as configured in the engine's
    ``--kv-events-config`` and its ``replay_endpoint`` (None: no repair)."""

    name: str
    endpoint: str
    replay_endpoint: str | None = None
    host: str = "127.0.0.1"  # where an engine that binds (``tcp://*:PORT``) is reached


def _host_of(url: str) -> str:
    return urllib.parse.urlsplit(url).hostname or "127.0.0.1"


def discover(url: str, name: str | None = None, timeout_s: float = 5.0) -> list[EngineSpec]:
    """An engine's publishers from its ``GET /kv_event_sources`` (one per data-parallel rank)."""
    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    with urllib.request.urlopen(base + "/kv_event_sources", timeout=timeout_s) as r:
        cfg = json.loads(r.read())
    host = _host_of(base)
    out = []
    if isinstance(cfg, dict) and "endpoint" in cfg:
        cfg = {"0": cfg}
    for rank, c in sorted((cfg or {}).items()):
        if not isinstance(c, dict) or not c.get("endpoint"):
            continue
        n = name or base
        out.append(
            EngineSpec(
                n if len(cfg) == 1 else f"{n}#dp{rank}",
                str(c["endpoint"]),
                c.get("replay_endpoint"),
                host,
            )
        )
    return out


_NUM_GPU_BLOCKS = re.compile(r'^vllm[:_]cache_config_info\{[^}]*num_gpu_blocks="(\d+)"', re.M)


def engine_capacity(url: str, timeout_s: float = 5.0) -> int | None:
    """The engine's KV cache in blocks (vLLM's ``num_gpu_blocks``, block 0 its null block), from
    the ``vllm:cache_config_info`` gauge of its ``/metrics``; None when it does not say."""
    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    try:
        with urllib.request.urlopen(base + "/metrics", timeout=timeout_s) as r:
            text = r.read(4 << 20).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    m = _NUM_GPU_BLOCKS.search(text)
    return int(m[1]) if m else None


def _replay_address(ep: str, host: str) -> str:
    return ep.replace("*", host, 1) if "*" in ep else ep


@dataclass
class _Source:
    spec: EngineSpec
    sock: Any
    expected: int | None = None
    last_ts: float = 0.0
    next_probe: float = 0.0  # monotonic time at which a quiet engine's replay socket is asked
    probe_wait: float = 0.0  # seconds to the next probe: doubles while probes find nothing
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            (
                "batches",
                "gaps",
                "missed_batches",
                "repaired",
                "unrepaired",
                "restarts",
                "duplicates",
                "caught_up",
                "tail_repaired",
            ),
            0,
        )
    )


class KVSubscriber:
    """Subscribes to ``engines`` and feeds ``state`` from a daemon thread.

    ``stats()`` gives the counts; faults are logged once per kind."""

    def __init__(
        self,
        engines: list[EngineSpec],
        state: KVState | None = None,
        replay_timeout_s: float = 1.0,
        context: Any = None,
        catch_up: bool = True,
        idle_probe_s: float = 5.0,
    ) -> None:
        self.engines = engines
        # A batch dropped at the end of a burst shows as a gap only when the engine sends
        # again; an engine quiet for idle_probe_s is asked for what it sent after the last
        # batch applied (0: never).
        self.idle_probe_s = idle_probe_s
        self.state = state or KVState([e.name for e in engines])
        for e in engines:
            if e.name not in self.state.indexes:
                raise ValueError(f"engine {e.name!r} is not in the state's engines")
        self.replay_timeout_s = replay_timeout_s
        # At start, ask each engine's replay socket for all it still has (a subscriber
        # that starts after its engines, or again after a crash, rebuilds their residency).
        self.catch_up = catch_up
        self.decode_stats = DecodeStats()
        self._ctx = context or zmq.Context.instance()
        self._sources: list[_Source] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._logged: set[str] = set()
        self.errors = 0
        self.lock = threading.Lock()  # held while a batch is applied

    # ------------------------------------------------------------ lifecycle
    def start(self) -> KVSubscriber:
        self._stop.clear()
        self._ready.clear()
        self._thread = threading.Thread(target=self._run, daemon=True, name="warmscope-kv")
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> KVSubscriber:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _open(self) -> None:
        for spec in self.engines:
            sock = self._ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.setsockopt(zmq.RCVHWM, 100_000)
            sock.setsockopt(zmq.LINGER, 0)
            ep = spec.endpoint
            try:
                if "*" in ep:
                    sock.connect(ep.replace("*", spec.host, 1))
                else:
                    sock.bind(ep)
            except zmq.ZMQError as e:
                self._fault(
                    "socket", f"cannot open {ep} for engine {spec.name}: {e}{_ephemeral_hint(ep)}"
                )
                sock.close(0)
                continue
            self._sources.append(_Source(spec, sock))

    def _run(self) -> None:
        try:
            self._open()
        finally:
            self._ready.set()
        if self.catch_up:
            for src in self._sources:
                self._catch_up(src)
        poller = zmq.Poller()
        by_sock = {}
        for s in self._sources:
            poller.register(s.sock, zmq.POLLIN)
            by_sock[s.sock] = s
        try:
            while not self._stop.is_set():
                try:
                    ready = dict(poller.poll(100))
                    for sock in ready:
                        src = by_sock[sock]
                        for _ in range(1000):  # take what is queued, then look at the others
                            try:
                                frames = sock.recv_multipart(zmq.NOBLOCK)
                            except zmq.Again:
                                break
                            self._message(src, frames)
                    self.state.resolve_pending()
                    if self.idle_probe_s > 0:
                        self._probe_idle(ready)
                except Exception as e:  # never into the host
                    self.errors += 1
                    self._fault("internal", f"error while reading events: {type(e).__name__}: {e}")
                    time.sleep(0.05)
        finally:
            for s in self._sources:
                s.sock.close(0)
            self._sources = []

    def _probe_idle(self, ready: dict[Any, Any]) -> None:
        """Ask quiet engines' replay sockets for batches after the last one applied.

        A batch dropped at the end of a burst (or every batch of an engine whose connection came
        up after it sent) shows as a gap only when the engine sends again. An engine quiet for
        ``idle_probe_s`` is asked; while probes find nothing the wait doubles (up to 64 times
        ``idle_probe_s``), and a message sets it back."""
        now = time.monotonic()
        base = self.idle_probe_s
        for src in self._sources:
            if src.sock in ready or src.probe_wait == 0.0:
                src.probe_wait = base
                src.next_probe = now + base
                continue
            ep = src.spec.replay_endpoint
            if not ep or now < src.next_probe:
                continue
            start = src.expected or 0
            got = self._replay(src, _replay_address(ep, src.spec.host), start, 1 << 62, quiet=True)
            tail = [seq for seq in sorted(got) if seq >= start]
            src.probe_wait = base if tail else min(src.probe_wait * 2, 64 * base)
            src.next_probe = time.monotonic() + src.probe_wait
            if not tail:
                continue
            src.counts["gaps"] += 1
            for seq in tail:
                expected = src.expected or 0
                if seq > expected:  # the replay buffer no longer holds the ones between
                    lost = seq - expected
                    src.counts["missed_batches"] += lost
                    src.counts["unrepaired"] += lost
                src.counts["missed_batches"] += 1
                src.counts["repaired"] += 1
                src.counts["tail_repaired"] += 1
                self._apply(src, got[seq])

    # ------------------------------------------------------------ messages
    def _message(self, src: _Source, frames: list[bytes]) -> None:
        batch = decode_message(frames, self.decode_stats)
        if batch is None:
            self._fault(
                "decode",
                f"an event message from {src.spec.name} could not be read "
                f"(counted: {self.decode_stats.as_dict()})",
            )
            return
        if self.decode_stats.unknown_event:
            self._fault(
                "unknown_event",
                f"events of an unknown type from {src.spec.name} "
                f"were skipped: {sorted(self.decode_stats.unknown_types)}",
            )
        exp = src.expected
        if exp is not None and batch.seq < exp and batch.ts <= src.last_ts:
            src.counts["duplicates"] += 1  # already applied (it came through a replay too)
            return
        if exp is not None and batch.seq < exp:
            src.counts["restarts"] += 1
            self._fault(
                "restart",
                f"engine {src.spec.name} restarted (batch {batch.seq} after "
                f"{exp - 1}); its residency is cleared",
            )
            with self.lock:
                self.state.engine_restarted(src.spec.name)
            exp = 0
        if exp is None:
            exp = 0  # the stream starts at 0: earlier batches were missed (joined late)
        if batch.seq > exp:
            self._repair(src, exp, batch.seq)
        self._apply(src, batch)

    def _apply(self, src: _Source, batch: Batch) -> None:
        with self.lock:
            self.state.apply(src.spec.name, batch)
        src.counts["batches"] += 1
        src.expected = batch.seq + 1
        src.last_ts = max(src.last_ts, batch.ts)

    def _catch_up(self, src: _Source) -> None:
        ep = src.spec.replay_endpoint
        if not ep or self._stop.is_set():
            return
        got = self._replay(src, _replay_address(ep, src.spec.host), 0, 1 << 62, quiet=True)
        if not got:
            return
        first = min(got)
        if first > 0:  # the engine's buffer no longer starts at 0
            src.counts["gaps"] += 1
            src.counts["missed_batches"] += first
            src.counts["unrepaired"] += first
            self._fault(
                "gap",
                f"{first} early event batches of {src.spec.name} are no longer "
                "in its replay buffer; residency may be stale until the blocks are "
                "stored or removed again",
            )
        for seq in sorted(got):
            if src.expected is not None and seq < src.expected:
                continue
            if src.expected is not None and seq > src.expected:
                self._repair(src, src.expected, seq)
            self._apply(src, got[seq])
        src.counts["caught_up"] += len(got)

    def _repair(self, src: _Source, start: int, upto: int) -> None:
        missing = upto - start
        src.counts["gaps"] += 1
        src.counts["missed_batches"] += missing
        got: dict[int, Batch] = {}
        ep = src.spec.replay_endpoint
        if ep:
            got = self._replay(src, _replay_address(ep, src.spec.host), start, upto)
        for seq in sorted(got):
            self._apply(src, got[seq])
        src.counts["repaired"] += len(got)
        lost = missing - len(got)
        if lost:
            src.counts["unrepaired"] += lost
            why = "no replay endpoint" if not ep else "not in its buffer"
            self._fault(
                "gap",
                f"{lost} event batches from {src.spec.name} were lost and could "
                f"not be replayed ({why}); residency may be stale until the blocks are "
                "stored or removed again",
            )

    def _replay(
        self, src: _Source, ep: str, start: int, upto: int, quiet: bool = False
    ) -> dict[int, Batch]:
        got: dict[int, Batch] = {}
        d = self._ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        try:
            d.connect(ep)
            d.send_multipart([b"", start.to_bytes(8, "big")])
            deadline = time.monotonic() + self.replay_timeout_s
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not d.poll(int(left * 1000) + 1):
                    if quiet and not got:
                        break  # an engine not (yet) up at start: its first batch repairs
                    self._fault(
                        "replay",
                        f"the replay socket {ep} of {src.spec.name} did not "
                        "finish answering in time",
                    )
                    break
                frames = d.recv_multipart()
                if len(frames) != 4:
                    self.decode_stats.bad_frames += 1
                    continue
                if frames[2] == _END_SEQ:
                    break
                b = decode_message(frames[1:], self.decode_stats)
                if b is not None and start <= b.seq < upto:
                    got[b.seq] = b
        except zmq.ZMQError as e:
            self._fault("replay", f"replay from {ep} failed: {e}")
        finally:
            d.close(0)
        return got

    def _fault(self, kind: str, msg: str) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("warmscope kv-events: %s", msg)

    # ------------------------------------------------------------ stats
    def stats(self) -> dict[str, Any]:
        per_engine: dict[str, Any] = {}
        totals = dict.fromkeys(
            (
                "batches",
                "gaps",
                "missed_batches",
                "repaired",
                "unrepaired",
                "restarts",
                "resident_blocks",
            ),
            0,
        )
        for src in list(self._sources):
            idx = self.state.indexes[src.spec.name]
            row: dict[str, Any] = dict(src.counts)
            row["next_seq"] = src.expected or 0
            row["resident_blocks"] = idx.resident_blocks()
            row["dropped_rows"] = dict(idx.dropped)
            row["faults"] = dict(idx.faults)
            per_engine[src.spec.name] = row
            for k in totals:
                totals[k] += row[k]
        per_salt: dict[str, dict[str, int]] = {}
        engine_salt: dict[tuple[str, str], dict[str, int]] = {}
        dropped: dict[str, int] = {}
        with self.lock:
            for name, idx in self.state.indexes.items():
                for salt, c in idx.per_salt().items():
                    engine_salt[(name, salt)] = dict(c)
                    acc = per_salt.setdefault(salt, dict.fromkeys(c, 0))
                    for k, v in c.items():
                        acc[k] += v
                for k, v in idx.dropped.items():
                    dropped[k] = dropped.get(k, 0) + v
        return {
            **totals,
            **self.decode_stats.as_dict(),
            "decode_errors": self.decode_stats.bad_frames
            + self.decode_stats.bad_payload
            + self.decode_stats.bad_event,
            "errors": self.errors,
            "dropped_rows": dropped,
            "per_salt": per_salt,
            "engine_salt": engine_salt,
            "engines": per_engine,
            "attribution": dict(self.state.counts),
            "class_tokens": dict(self.state.class_tokens),
        }


def _ephemeral_hint(endpoint: str) -> str:
    """Why a bind of a port in the kernel's ephemeral range can fail, and what to do."""
    try:
        port = int(endpoint.rsplit(":", 1)[1])
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split()[:2])
    except (OSError, ValueError, IndexError):
        return ""
    if not low <= port <= high:
        return ""
    return (
        f" (port {port} is in the kernel's ephemeral range {low}-{high}: an engine that keeps "
        "retrying its connect can be given it as its own source port and hold it; use a port "
        f"below {low})"
    )
