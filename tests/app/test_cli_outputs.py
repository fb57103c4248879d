"""What the CLI writes never destroys what it reads, and contradictory or unchecked options are
refused with one line: found by a new user's walk through every command."""

from __future__ import annotations

import hashlib
import json
import sqlite3

import pytest
from warmscope.app.cli.main import main
from warmscope.sources.trace_file import read_trace


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A simulated half hour (the default A/B experiment, two pools) with each pool's block trace, and two
    traps from 00:15 to 00:30 (a regression with several causes for rca)."""
    folder = tmp_path_factory.mktemp("outputs")
    path = folder / "s.sqlite"
    assert main(["--store", str(path), "simulate", "--hours", "0.5", "--workers", "1", "--quiet",
                 "--block-trace", str(folder / "bt.jsonl"),
                 "--fault", "kv_fixed_len:replica=a-0@00:15-00:30;min_tokens=4096",
                 "--fault", "key_explosion:tenant=acme@00:15-00:30"]) == 0
    return path


def digest(path) -> str:
    """A database's contents (opening one may move its write-ahead log into the file: its bytes
    change, its rows do not)."""
    con = sqlite3.connect(path)
    try:
        return hashlib.sha256("\n".join(con.iterdump()).encode()).hexdigest()
    finally:
        con.close()


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_no_output_option_writes_over_the_store_it_reads(store, capsys):
    before = digest(store)
    s = str(store)
    cases = [
        (["report", "ab", "--out", s], "--out"),
        (["report", "ab", "--out", str(store.with_name("r.html")), "--markdown", s], "--markdown"),
        (["trace", "export", "--out", s], "--out"),
        (["rca", "--window", "2026-11-28T00:00..2026-11-28T00:10", "--export", s], "--export"),
        (["advise", "--quiet", "--block-trace", "--json", s], "--json"),
    ]
    for argv, flag in cases:
        assert main(["--store", s, *argv]) == 2, argv
        err = one_line(capsys)
        assert f"{flag} {s} is the store this command reads; give another path" in err, err
    assert digest(store) == before  # not a byte changed
    assert not store.with_name("r.html").exists()  # refused before anything was written


def test_an_output_is_never_written_over_another_database(store, tmp_path, capsys):
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t(x)").connection.commit()
    before = digest(other)
    assert main(["--store", str(store), "trace", "export", "--out", str(other)]) == 2
    assert f"--out {other} is a SQLite database (a store?)" in one_line(capsys)
    assert main(["--store", str(store), "simulate", "--hours", "0.1", "--out", str(tmp_path / "n.sqlite"),
                 "--faults-out", str(other)]) == 2
    assert "--faults-out" in one_line(capsys)
    assert digest(other) == before and not (tmp_path / "n.sqlite").exists()


def test_the_html_report_and_the_markdown_one_cannot_be_one_file(store, tmp_path, capsys):
    out = tmp_path / "x.md"  # the Markdown defaults to --out with .md: the same file
    assert main(["--store", str(store), "report", "ab", "--out", str(out)]) == 2
    assert "would both be" in one_line(capsys) and not out.exists()
    html, md = tmp_path / "r.html", tmp_path / "r.md"
    assert main(["--store", str(store), "report", "ab", "--out", str(html)]) == 0
    capsys.readouterr()
    assert html.read_text().lstrip().lower().startswith("<!doctype html") and md.read_text().startswith("#")


def test_fresh_and_append_together_are_refused(store, capsys):
    before = digest(store)
    assert main(["--store", str(store), "simulate", "--hours", "0.1", "--fresh", "--append"]) == 2
    assert "--fresh replaces the store and --append adds to it; pass one" in one_line(capsys)
    assert digest(store) == before


def test_a_second_trace_is_not_imported_into_a_store_that_holds_one(store, tmp_path, capsys):
    trace = store.with_name("bt-A.jsonl")
    target = tmp_path / "t.sqlite"
    assert main(["--store", str(target), "trace", "import", str(trace), "--align", "keep"]) == 0
    said = capsys.readouterr().out
    rows, blocks = sqlite3.connect(target).execute(
        "SELECT count(*), sum(length(h)) / 8 FROM block_trace").fetchone()  # 8 bytes per block hash
    assert f"imported {rows:,} requests ({blocks:,} block references" in said  # what the store holds
    assert rows == len(read_trace(trace).t) > 0
    for again in (trace, store.with_name("bt-B.jsonl")):  # the same file twice, or a second trace
        assert main(["--store", str(target), "trace", "import", str(again)]) == 2
        assert f"already holds a block trace ({rows:,} requests)" in one_line(capsys)
    assert sqlite3.connect(target).execute("SELECT count(*) FROM block_trace").fetchone()[0] == rows


def test_rca_on_a_store_checks_its_options_and_honours_max_causes(store, capsys):
    base = ["--store", str(store), "rca", "--window", "2026-11-28T00:05..2026-11-28T00:15"]
    assert main(base + ["--dims", "tenant", "nonsense"]) == 2
    assert "--dims nonsense: not a dimension of the store's lookups; use some of: tenant layer" in one_line(capsys)
    assert main(base + ["--dims", "tenant", "tenant"]) == 2
    assert "named twice" in one_line(capsys)
    for flag in ("--max-depth", "--max-causes"):
        assert main(base + [flag, "0"]) == 2
        assert f"{flag} must be at least 1" in one_line(capsys)
    regression = ["--store", str(store), "rca", "--window", "2026-11-28T00:15..2026-11-28T00:30", "--compact"]
    assert main(regression) == 0
    assert len(json.loads(capsys.readouterr().out)) > 1  # several causes (7 when written)...
    assert main(regression + ["--max-causes", "1"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 1  # ...and the one asked for


def test_advise_json_on_a_trace_without_ttft_writes_null_not_nan(store, tmp_path, capsys):
    """A simulator's block trace has no TTFT, so no cost per token: the JSON says null (it used to
    fail with "Out of range float values are not JSON compliant")."""
    out = tmp_path / "advice.json"
    trace = store.with_name("bt-A.jsonl")
    assert main(["advise", "--quiet", "--trace", str(trace), "--capacity", "512", "--restarts", "30",
                 "--json", str(out)]) == 0
    text = out.read_text()
    assert "NaN" not in text
    doc = json.loads(text)
    assert set(doc) == {"evaluation", "recommendation"}
    assert "null" in text  # a figure the trace cannot give


def test_every_command_takes_store_after_its_name(store, capsys):
    assert main(["runs", "--store", str(store), "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert runs and all(r["status"] == "ok" for r in runs)
    assert main(["misses", "--store", str(store.with_name("absent.sqlite"))]) == 2
    assert "absent.sqlite" in capsys.readouterr().err


def test_a_failed_warmup_run_says_so_in_runs(store, tmp_path, capsys):
    """A warm-up against an engine that is not there fails fast, naming the URL; `runs` then shows
    that run's status instead of a verdict, and the table keeps one column per ROI window."""
    copy = tmp_path / "c.sqlite"
    src, dst = sqlite3.connect(store), sqlite3.connect(copy)
    src.backup(dst)
    src.close(), dst.close()
    warm = tmp_path / "warm.jsonl"
    warm.write_text(json.dumps({"prompt": "hello"}) + "\n")
    assert main(["--store", str(copy), "warmup", "--engine", "http://127.0.0.1:9", "--from", str(warm),
                 "--quiet", "--timeout", "2"]) == 1
    assert "(http://127.0.0.1:9)" in capsys.readouterr().err
    assert main(["--store", str(copy), "runs", "--json"]) == 0
    newest = json.loads(capsys.readouterr().out)["runs"][0]
    assert newest["status"] == "error" and newest["verdict"].startswith("no verdict: the run ended error")
    assert main(["--store", str(copy), "runs"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "unfinished" not in header and header.count("compute ROI T+5 min") == 1


def test_warmup_checks_since_rate_and_timeout_before_sending(capsys):
    from warmscope.app.cli.warmup import _hours

    assert (_hours("6h"), _hours("30m"), _hours("2d"), _hours("1.5")) == (6.0, 0.5, 48.0, 1.5)
    base = ["warmup", "--engine", "http://127.0.0.1:9", "--from", "hot", "--library", "/nonexistent"]
    for extra, msg in ((["--rate", "-1"], "--rate -1 must be positive (or 0: no limit)"),
                       (["--timeout", "0"], "--timeout 0 must be positive")):
        assert main(base + extra) == 2
        assert msg in one_line(capsys)
    with pytest.raises(SystemExit):
        main(base + ["--since", "soon"])
    assert "'soon' is neither a number of hours nor a duration (30m, 6h, 2d)" in capsys.readouterr().err


def test_the_gateway_says_at_start_when_nothing_answers_upstream(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    import httpx

    from tests.conftest import free_port

    port = free_port()
    env = dict(os.environ, WARMSCOPE_KEY_SECRET="t")
    proc = subprocess.Popen([sys.executable, "-m", "warmscope.app.cli", "--store", str(tmp_path / "g.sqlite"),
                             "gateway", "--upstream", "http://127.0.0.1:9", "--port", str(port)],
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:  # up and listening, forwarding into nothing: 502 per request
            try:
                r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=5,
                               json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
                time.sleep(0.2)
        assert r.status_code == 502
    finally:
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=30)[1]
    assert "Traceback" not in err
    assert "warmscope gateway: nothing answers at http://127.0.0.1:9 yet (ConnectError" in err
    assert "requests get HTTP 502 until the engine is up" in err
    assert err.rstrip().splitlines()[-1].startswith("warmscope gateway stopped")
    assert not err.rstrip().endswith(":")


def test_simulate_says_the_capacity_a_replay_of_each_pools_trace_needs(tmp_path, capsys):
    """`simulate --block-trace` names each pool's file and its cache's capacity in blocks (pool A: 400,000
    tokens / 512 = 781; pool B given 100,000 tokens: 195), and `whatif` runs on the line it prints."""
    assert main(["--store", str(tmp_path / "s.sqlite"), "simulate", "--hours", "0.1", "--workers", "1", "--quiet",
                 "--block-trace", str(tmp_path / "t.jsonl"), "--b-kv-capacity", "100000"]) == 0
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if "block trace:" in x]
    assert [x.split(" --capacity ")[-1] for x in lines] == ["781", "195"]
    cmd = lines[0].split(": warmscope ", 1)[1].split()
    assert main(cmd + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["capacity_blocks"] == 781


def test_usage_mistakes_name_the_fix(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([])
    assert "warmscope: give a command: demo, dashboard, simulate" in one_line(capsys)
    with pytest.raises(SystemExit):
        main(["report"])
    assert "warmscope report: give a command: ab" in one_line(capsys)
    assert main(["--store", str(tmp_path / "s.sqlite"), "simulate", "--hours", "0.1", "--speed", "10"]) == 2
    assert "--speed paces a --realtime run" in one_line(capsys) and not (tmp_path / "s.sqlite").exists()
    afile = tmp_path / "afile"
    afile.write_text("x")
    for cmd in ("grafana", "rules"):
        extra = [] if cmd == "grafana" else ["--runbook-base", "https://x/r.md"]
        assert main([cmd, "--out", str(afile), *extra]) == 1
        assert f"--out {afile} is a file; give a folder" in one_line(capsys)
    assert afile.read_text() == "x"


def test_output_into_a_closed_pipe_ends_quietly(store):
    """`warmscope runs --json | head -1`: the reader leaves early; no traceback, no 'Broken pipe' line."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-m", "warmscope.app.cli", "--store", str(store), "runs", "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # the reader is gone before the first byte
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0 and err == "", err


def test_trace_export_without_a_store_offers_what_it_takes(tmp_path, capsys):
    assert main(["--store", str(tmp_path / "none.sqlite"), "trace", "export", "--out", str(tmp_path / "t.jsonl")]) == 2
    err = one_line(capsys)
    assert "no store at" in err and "--trace" not in err  # trace export has no --trace
    assert main(["--store", str(tmp_path / "none.sqlite"), "whatif"]) == 2
    assert one_line(capsys).endswith("or pass --trace FILE")
