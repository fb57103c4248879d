"""Trace files (the Mooncake format with warmscope's fields): what a replay relies on is checked
line by line, a written trace reads back to the same replay, and a failed write leaves nothing;
`warmscope whatif` and `warmscope trace` read them and say what is wrong in one line, exit 2."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from warmscope.analysis.whatif.replay import replay
from warmscope.app.cli.main import main
from warmscope.model.blocktrace import TraceBuilder, TraceError, chain_ids
from warmscope.sources.trace_file import read_trace, write_trace
from warmscope.sources.trace_store import read_store_trace, write_store_trace


def _write(tmp_path, rows, name="t.jsonl") -> str:
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(p)


GOOD = [
    {"timestamp": 0, "input_length": 1200, "output_length": 10, "hash_ids": [0, 1, 2]},
    {"timestamp": 5, "input_length": 1100, "output_length": 3, "hash_ids": [0, 1, 3]},
    {"timestamp": 9, "input_length": 600, "output_length": 3, "hash_ids": [0, 4]},
]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("{not json", "line 2: not JSON"),
        ({"timestamp": 1, "input_length": 512, "hash_ids": "x"}, "line 2: hash_ids must be a list"),
        ({"timestamp": "t", "input_length": 512, "hash_ids": [0]}, "line 2: timestamp must be"),
        ({"timestamp": 1, "input_length": 0, "hash_ids": []}, "line 2: input_length must be"),
        # 3 ids for 600 tokens: blocks of 512 would give 2; 256 would give 3
        ({"timestamp": 1, "input_length": 600, "hash_ids": [0, 7, 8]},
         "line 2: 3 hash ids for 600 input tokens do not match blocks of 512 tokens (3 blocks of 256"),
        # id 1 follows 0 on line 1 but 9 here
        ({"timestamp": 1, "input_length": 1024, "hash_ids": [9, 1]},
         "line 2: hash id 1 follows 9 here but 0 on line 1: the chains are not prefix-closed"),
    ],
)
def test_a_bad_line_is_named(tmp_path, bad, message):
    path = _write(tmp_path, [GOOD[0], bad])
    with pytest.raises(TraceError) as e:
        read_trace(path)
    assert message in str(e.value)


def test_time_going_backwards_and_empty_files(tmp_path):
    with pytest.raises(TraceError, match="line 2: timestamp 3 ms is before the previous line's 5"):
        read_trace(_write(tmp_path, [dict(GOOD[1]), dict(GOOD[0], timestamp=3)]))
    with pytest.raises(TraceError, match="no requests"):
        read_trace(_write(tmp_path, ["", "   "]))
    with pytest.raises(TraceError, match="cannot read the trace"):
        read_trace(tmp_path / "missing.jsonl")
    with pytest.raises(TraceError, match="the trace says block_size 32, but 512"):
        read_trace(_write(tmp_path, [dict(GOOD[0], block_size=32)]), 512)


def test_mooncake_lines_replay_with_the_partial_block_out(tmp_path):
    tr = read_trace(_write(tmp_path, GOOD))
    assert tr.block_size == 512 and len(tr) == 3
    # 1200 tokens: 2 full blocks, the third id is the partial one
    assert tr.full.tolist() == [2, 2, 1]
    # second request: ids 0, 1 shared; cap (1100 - 1) // 512 = 2 -> 2 blocks = 1024 tokens
    # third: id 0 shared, cap (600 - 1) // 512 = 1 -> 512 tokens
    assert replay(tr, 100).cached.tolist() == [0, 1024, 512]


def _recorded_trace() -> object:
    tb = TraceBuilder(16)
    a = chain_ids([1, 2, 3, 4])
    tb.add(100.0, 70, 5, a, t_end=101.5, cached=0, ttft=0.2, tenant="acme", engine="e0",
           c=chain_ids([1, 2, 3, 4], salt=9), cls=[5, 5, 5, 5])
    tb.add(102.0, 66, 2, a[:4], t_end=102.7, cached=48, ttft=0.05, tenant="bolt", engine="e1",
           salt="s-bolt", cls=[0, 0, 0, 1])
    tb.add(103.0, 40, 1, chain_ids([1, 2]), tenant="acme", engine="e0", s=chain_ids([7, 2]))
    tb.restart(102.5, "e1")
    tr = tb.build()
    tr.capacity = {"e0": 96, "e1": 96}
    return tr


def test_written_traces_read_back_to_the_same_replay(tmp_path):
    tr = _recorded_trace()
    out = tmp_path / "out.jsonl"
    assert write_trace(tr, out) == 3
    back = read_trace(out)
    assert back.block_size == 16 and back.engines == ("e0", "e1") and back.capacity == tr.capacity
    assert [back.tenants[k] for k in back.tenant] == ["acme", "bolt", "acme"]
    assert np.allclose(back.t - back.t[0], tr.t - tr.t[0])
    assert back.restarts and back.restarts[0][1] == back.engines.index("e1")
    assert back.cached.tolist() == [0, 48, -1] and math.isclose(back.ttft[0], 0.2)
    for cap in (4, 8, 50):
        assert np.array_equal(replay(back, cap).cached, replay(tr, cap).cached)
    # no digest of the recording leaves in the file: ids are small numbers in order of appearance
    first = json.loads(out.read_text().splitlines()[0])
    assert first["hash_ids"][:4] == [0, 1, 2, 3]
    # and through a store
    store = tmp_path / "s.sqlite"
    assert write_store_trace(tr, store) == 3
    st = read_store_trace(store)
    assert st.capacity == {"e0": 96, "e1": 96}
    assert np.array_equal(replay(st, 8).cached, replay(tr, 8).cached)


def test_a_failed_write_leaves_nothing(tmp_path):
    tr = _recorded_trace()
    tr.tenants = None  # a broken trace: writing it fails part way
    target = tmp_path / "x.jsonl"
    with pytest.raises(TypeError):
        write_trace(tr, target)
    assert not target.exists() and not list(tmp_path.glob("*.part"))


def test_cli_whatif_and_trace_commands(tmp_path, capsys):
    trace = _write(tmp_path, GOOD)
    store = str(tmp_path / "store.sqlite")
    # no capacity in a Mooncake file: one line saying what to pass
    assert main(["whatif", "--trace", trace]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pass --capacity BLOCKS" in err
    assert main(["whatif", "--trace", trace, "--capacity", "1"]) == 2
    assert "needs at least 2" in capsys.readouterr().err
    assert main(["whatif", "--trace", trace, "--capacity", "10", "--vllm-curve", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["trace"]["requests"] == 3 and out["capacity_blocks"] == 10
    assert out["baseline_hit_rate"] == pytest.approx((1024 + 512) / 2900)
    assert [f["fix"].split(" (")[0] for f in out["fixes"]][:3] == ["capacity ×1.5", "capacity ×2",
                                                                    "capacity ×4"]
    assert len(out["vllm_curve"]["points"]) >= 2
    # bad lines reach the user as one line, exit 2
    bad = _write(tmp_path, [GOOD[0], {"timestamp": 1, "input_length": 1024, "hash_ids": [9, 1]}],
                 "bad.jsonl")
    assert main(["whatif", "--trace", bad, "--capacity", "10"]) == 2
    assert "line 2: hash id 1 follows 9" in capsys.readouterr().err
    # import into a store, then whatif and export from it
    assert main(["--store", store, "trace", "import", trace, "--align", "keep"]) == 0
    capsys.readouterr()
    assert main(["--store", store, "whatif", "--capacity", "10", "--vllm-curve", "0"]) == 0
    text = capsys.readouterr().out
    assert "Replayed as recorded at 10 blocks per engine" in text and "What each fix buys" in text
    out_file = tmp_path / "exported.jsonl"
    assert main(["--store", store, "trace", "export", "--out", str(out_file)]) == 0
    assert "wrote 3 requests" in capsys.readouterr().out
    assert np.array_equal(replay(read_trace(out_file), 10).cached,
                          replay(read_trace(trace), 10).cached)
    # a store without a trace
    empty = str(tmp_path / "empty.sqlite")
    assert main(["--store", empty, "whatif"]) == 2
    assert "no store at" in capsys.readouterr().err
