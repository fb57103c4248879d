"""The ZMQ subscriber against an in-process publisher on 127.0.0.1 that speaks vLLM's
protocol: PUB connecting to the subscriber's bound endpoint, ROUTER replay socket."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import zmq
from warmscope.collectors.kv import EngineSpec, KVSubscriber, KVWatcher

from tests.collectors.kv_events import payload, removed, stored, toks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Publisher:
    """vLLM's ZmqEventPublisher in miniature: numbered batches, a replay buffer, ROUTER."""

    def __init__(self, endpoint: str, replay: str) -> None:
        self.ctx = zmq.Context.instance()
        self.pub = self.ctx.socket(zmq.XPUB)  # a PUB that also tells when a subscriber is in
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.connect(endpoint)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(replay)
        self.buffer: list[tuple[int, bytes]] = []
        self.seq = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            if not self.router.poll(20):
                continue
            client, _, start = self.router.recv_multipart()
            s0 = int.from_bytes(start, "big")
            with self.lock:
                buf = list(self.buffer)
            for seq, pl in buf:
                if seq >= s0:
                    self.router.send_multipart([client, b"", b"", seq.to_bytes(8, "big"), pl])
            self.router.send_multipart([client, b"", b"", b"\xff" * 8, b""])

    def wait_subscribed(self, timeout_s: float = 10.0) -> None:
        assert self.pub.poll(int(timeout_s * 1000)), "no subscriber connected"
        assert self.pub.recv()[:1] == b"\x01"

    def publish(self, events, ts: float, live: bool = True, keep: bool = True) -> int:
        seq, self.seq = self.seq, self.seq + 1
        pl = payload(events, ts)
        with self.lock:
            if keep:
                self.buffer.append((seq, pl))
        if live:
            self.pub.send_multipart([b"", seq.to_bytes(8, "big"), pl])
        return seq

    def restart(self) -> None:
        self.seq = 0
        with self.lock:
            self.buffer = []

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        self.pub.close(0)
        self.router.close(0)


def wait_for(cond, timeout: float = 5.0) -> None:
    t = time.monotonic() + timeout
    while not cond() and time.monotonic() < t:
        time.sleep(0.02)
    assert cond()


@pytest.fixture
def pair():
    spec = EngineSpec("e1", f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}")
    sub = KVSubscriber([spec], replay_timeout_s=2.0).start()
    pub = Publisher(spec.endpoint, spec.replay_endpoint)
    pub.wait_subscribed()  # from here on nothing published live is dropped
    yield spec, sub, pub
    sub.stop()
    pub.close()


def test_gaps_are_repaired_from_the_replay_socket_or_counted(pair):
    spec, sub, pub = pair
    idx = sub.state.indexes["e1"]
    pub.publish([stored([1], None, toks(1))], 1.0)               # seq 0
    pub.publish([stored([2], 1, toks(2))], 2.0, live=False)      # seq 1: lost, in the buffer
    pub.publish([stored([3], 2, toks(3))], 3.0, live=False)      # seq 2: lost, in the buffer
    pub.publish([stored([4], 3, toks(4))], 4.0)                  # seq 3: the gap shows
    wait_for(lambda: sub.stats()["batches"] == 4)
    st = sub.stats()
    assert (st["gaps"], st["missed_batches"], st["repaired"], st["unrepaired"]) == (1, 2, 2, 0)
    assert [idx.row(h)["depth"] for h in (1, 2, 3, 4)] == [0, 1, 2, 3]  # applied in order
    pub.publish([removed([4])], 5.0, live=False, keep=False)     # seq 4: gone for good
    pub.publish([removed([3])], 6.0)                             # seq 5
    wait_for(lambda: sub.stats()["batches"] == 5)
    st = sub.stats()
    assert (st["gaps"], st["missed_batches"], st["repaired"], st["unrepaired"]) == (2, 3, 2, 1)
    assert idx.copies(4) == 1 and idx.copies(3) == 0  # the lost removal stays unknown


def test_restart_clears_and_garbage_is_counted(pair):
    spec, sub, pub = pair
    idx = sub.state.indexes["e1"]
    for i in range(3):
        pub.publish([stored([10 + i], None, toks(i))], 1.0 + i)
    wait_for(lambda: idx.resident_blocks() == 3)
    pub.pub.send_multipart([b"", (3).to_bytes(8, "big"), b"\xc1\xc1 not msgpack"])
    pub.pub.send_multipart([b"only one frame"])
    pub.restart()                                                 # the engine restarts: seq 0
    pub.publish([stored([20], None, toks(9))], 50.0)
    # the restart is counted before the new batch is applied: wait for both
    wait_for(lambda: sub.stats()["restarts"] == 1 and idx.copies(20) == 1)
    st = sub.stats()
    assert st["decode_errors"] == 2 and st["bad_payload"] == 1 and st["bad_frames"] == 1
    # the old blocks are gone (remembered as removed at the restart), the new one is there
    assert idx.resident_blocks() == 1 and idx.copies(20) == 1
    assert all(idx.removed_at(10 + i) is not None for i in range(3))
    assert st["errors"] == 0


def test_late_subscriber_catches_up_and_skips_redelivered_batches():
    spec = EngineSpec("e1", f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}")
    pub = Publisher(spec.endpoint, spec.replay_endpoint)
    try:
        for i in range(5):  # nobody listens yet: PUB drops them, the buffer keeps them
            pub.publish([stored([100 + i], None if i == 0 else 99 + i, toks(i))], 1.0 + i)
        w = KVWatcher([spec]).start()
        try:
            wait_for(lambda: w.state.indexes["e1"].resident_blocks() == 5)
            st = w.stats()
            assert st["engines"]["e1"]["caught_up"] == 5 and st["unrepaired"] == 0
            pub.wait_subscribed()
            pub.publish([stored([200], 104, toks(7), session="s1")], 9.0)
            wait_for(lambda: w.stats()["batches"] == 6)
            # 25 tokens, 20 cached (5 blocks): cap (25 - 1) // 4 = 6, 1 block judged: cold 4,
            # partial 25 - 20 - 4 = 1
            assert w.attribute({"session_id": "s1", "prompt_tokens": 25, "cached_tokens": 20},
                               wait_s=2)["cold"] == 4
        finally:
            w.stop()
    finally:
        pub.close()


def test_engine_without_events_or_replay_never_raises():
    # an endpoint nobody publishes to, and a replay socket nobody answers
    spec = EngineSpec("quiet", f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}")
    with KVWatcher([spec]) as w:
        time.sleep(0.2)
        st = w.stats()
    assert st["batches"] == 0 and st["errors"] == 0
    # an engine URL that does not answer: logged and left out
    assert KVWatcher(["http://127.0.0.1:9"]).specs == []


def test_standalone_entry_prints_per_salt_rates(capsys):
    from warmscope.collectors.kv.__main__ import main

    ep, rep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    out: list[int] = []
    th = threading.Thread(target=lambda: out.append(main(
        ["--endpoint", f"e1={ep},{rep}", "--interval", "0.5", "--duration", "4"])))
    th.start()
    time.sleep(0.3)
    pub = Publisher(ep, rep)
    try:
        pub.wait_subscribed()
        pub.publish([stored([1, 2], None, toks(1, 2), salt="t")], 1.0)
        pub.publish([removed([2])], 2.0)
        th.join(10)
    finally:
        pub.close()
    assert out == [0]
    text = capsys.readouterr().out
    last = [ln for ln in text.splitlines() if ln.startswith("[")][-1]
    assert "batches 2 " in last and "resident blocks 1 " in last, text
    # the salt is shown as a digest, never as given
    assert "salt:" in text and " t " not in text


def test_a_batch_dropped_at_the_end_of_a_burst_is_repaired_when_the_engine_goes_quiet():
    """Nothing follows the last batch to reveal its gap: the quiet engine's replay socket is
    asked, also for an engine none of whose batches arrived live."""
    a = EngineSpec("a", f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}")
    b = EngineSpec("b", f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}")
    sub = KVSubscriber([a, b], replay_timeout_s=2.0, catch_up=False, idle_probe_s=0.3).start()
    pa, pb = Publisher(a.endpoint, a.replay_endpoint), Publisher(b.endpoint, b.replay_endpoint)
    try:
        pa.wait_subscribed()
        pb.wait_subscribed()
        pa.publish([stored([1, 2], None, toks(1, 2))], 1.0)
        pa.publish([stored([3], 2, toks(3))], 2.0, live=False)  # dropped: the burst's last
        pb.publish([stored([7], None, toks(7))], 1.0, live=False)  # b: nothing arrives live
        wait_for(lambda: sub.stats()["engines"]["a"]["batches"] == 2
                 and sub.stats()["engines"]["b"]["batches"] == 1, timeout=10)
        st = sub.stats()["engines"]
        assert st["a"]["tail_repaired"] == 1 and st["a"]["unrepaired"] == 0
        assert st["b"]["tail_repaired"] == 1 and st["b"]["unrepaired"] == 0
        assert sub.state.indexes["a"].resident_blocks() == 3  # blocks 1, 2 and 3
        assert sub.state.indexes["b"].resident_blocks() == 1
        # probes that find nothing back off: a quiet engine is not asked every 0.3 s
        time.sleep(1.5)
        assert sub.stats()["engines"]["a"]["batches"] == 2  # nothing applied twice
        assert sub.stats()["engines"]["a"]["duplicates"] == 0
    finally:
        sub.stop()
        pa.close()
        pb.close()


def test_a_port_held_by_a_self_connect_is_named_with_what_to_do(caplog):
    """An engine that starts first retries its connect to the watcher's endpoint; a retry can be
    given that very port as its source port and connect to itself, holding it. Reproduced with
    a real TCP self-connect: the watcher's bind fails, is logged with the way out, never raised.
    The tests' own ports (tests.conftest.free_port, which the engine tests' event endpoints use)
    are below the range, where the kernel never hands out a source port."""
    from tests.conftest import free_port as session_port

    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    s = socket.socket()
    s.bind(("127.0.0.1", 0))  # an ephemeral port, as a connect's source port would be
    port = s.getsockname()[1]
    assert port >= low
    s.connect(("127.0.0.1", port))  # TCP self-connect: it now holds the port
    try:
        spec = EngineSpec("e0", f"tcp://127.0.0.1:{port}", None)
        with caplog.at_level("WARNING", logger="warmscope.kv"), KVWatcher([spec]) as w:
            time.sleep(0.1)
            assert w.stats()["batches"] == 0
        msg = " ".join(r.getMessage() for r in caplog.records)
        assert f"cannot open tcp://127.0.0.1:{port}" in msg and "Address already in use" in msg
        assert "ephemeral range" in msg and f"below {low}" in msg
    finally:
        s.close()
    ports = {session_port() for _ in range(20)}
    assert all(1024 <= p < low for p in ports) and len(ports) == 20
