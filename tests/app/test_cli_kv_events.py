"""`warmscope kv-events` against an in-process publisher speaking vLLM's protocol: it prints
per-salt rates and records the engine × salt block counts in the store (kv_blocks)."""

from __future__ import annotations

import threading
import time

from warmscope.app.cli.main import main
from warmscope.sources import EmbeddedSource

from tests.collectors.kv_events import removed, stored, toks
from tests.collectors.test_kv_subscriber import Publisher, free_port


def test_kv_events_records_block_counts_per_engine_and_salt(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WARMSCOPE_KEY_SECRET", "test-secret")
    store = tmp_path / "kv.sqlite"
    ep, rep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    out: list[int] = []
    th = threading.Thread(target=lambda: out.append(main(
        ["--store", str(store), "kv-events", "--endpoint", f"e1={ep},{rep}", "--interval", "0.5",
         "--duration", "4"])))
    th.start()
    time.sleep(0.5)
    pub = Publisher(ep, rep)
    try:
        pub.wait_subscribed()
        # salted chain of 3 blocks, an unsalted one of 2; then 1 salted block removed
        pub.publish([stored([11, 12, 13], None, toks(1, 2, 3), salt="acme")], 1.0)
        pub.publish([stored([21, 22], None, toks(4, 5))], 2.0)
        pub.publish([removed([13])], 3.0)
        th.join(15)
    finally:
        pub.close()
    assert out == [0]
    captured = capsys.readouterr()
    text = captured.out
    assert "batches 3 " in text.splitlines()[-3] or "batches 3 " in text, text
    assert "no KV event arrived" not in captured.err
    kv = EmbeddedSource(str(store)).frame("kv_blocks")
    assert set(kv["engine"]) == {"e1"}
    by = kv.groupby("salt")[["stored", "evicted"]].sum()
    salted = [s for s in by.index if s.startswith("salt:")]
    assert len(salted) == 1 and "acme" not in "".join(kv["salt"])  # a digest, never the salt
    # stored: 3 salted + 2 unsalted blocks; evicted: the one salted block removed
    assert by.loc[salted[0], "stored"] == 3 and by.loc[salted[0], "evicted"] == 1
    assert by.loc["unsalted", "stored"] == 2 and by.loc["unsalted", "evicted"] == 0
    # resident at the last report: 2 salted + 2 unsalted
    last = kv[kv["ts"] == kv["ts"].max()]
    assert int(last["resident"].sum()) == 4


def test_kv_events_without_engines_says_what_to_pass(capsys):
    assert main(["kv-events"]) == 2
    err = capsys.readouterr().err
    assert "--engine http://HOST:PORT" in err and "Traceback" not in err
    assert main(["kv-events", "--endpoint", "nonsense"]) == 2
    assert "is not NAME=ENDPOINT" in capsys.readouterr().err


def test_a_watch_that_received_nothing_says_so(tmp_path, capsys):
    port = free_port()  # nothing publishes there
    assert main(["--store", str(tmp_path / "kv.sqlite"), "kv-events", "--endpoint", f"e=tcp://127.0.0.1:{port}",
                 "--interval", "0.5", "--duration", "1", "--no-record"]) == 0
    err = capsys.readouterr().err
    assert f"no KV event arrived from e (tcp://127.0.0.1:{port})" in err
