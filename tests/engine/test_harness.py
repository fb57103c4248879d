"""The real-engine harness: vLLM's CPU build serving the tiny model with prefix
caching, counted per request and on /metrics, stopped without leftovers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from warmscope.simulator import real_engine

pytestmark = pytest.mark.engine

SYSTEM = ("You are a helpful assistant for the acme support desk. Answer briefly and cite the "
          "manual. ") * 4


def test_engine_serves_prefix_cache_hits_and_stops_clean(vllm_engines):
    (eng,) = vllm_engines(1)
    before = eng.counters()
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "ticket 5 invoice"}]
    first = eng.chat(msgs)["usage"]
    second = eng.chat(msgs)["usage"]
    assert first["prompt_tokens"] == second["prompt_tokens"] > 2 * real_engine.BLOCK_SIZE
    assert first["prompt_tokens_details"]["cached_tokens"] == 0      # a fresh engine: all cold
    hit = second["prompt_tokens_details"]["cached_tokens"]
    # the repeat hits every whole block of the prompt but the last partial one
    assert hit > 0 and hit % real_engine.BLOCK_SIZE == 0 and hit < second["prompt_tokens"]
    after = eng.counters()
    hits = after["vllm:prefix_cache_hits_total"] - before.get("vllm:prefix_cache_hits_total", 0)
    queries = after["vllm:prefix_cache_queries_total"] - before.get("vllm:prefix_cache_queries_total", 0)
    assert hits == hit                                       # the engine counts what it returned
    assert queries == first["prompt_tokens"] + second["prompt_tokens"]
    om = eng.metrics_text(openmetrics=True)
    assert "prefix_cache_hits" in om
    # the model info vLLM wrote while starting is kept for the next engine's start (vLLM then
    # skips inspecting the model in a subprocess of its own)
    written = sorted((eng.run_dir / "vllm-cache" / "modelinfos").glob("*.json"))
    assert written
    for f in written:
        assert (real_engine.home() / "vllm-modelinfos" / f.name).read_bytes() == f.read_bytes()
    pid, run_dir = eng.proc.pid, eng.run_dir
    eng.stop()
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)                                    # the whole group is gone
    assert not run_dir.exists()
    assert eng.proc is None


def test_install_and_model_live_in_the_harness_folder():
    if not real_engine.installed():
        pytest.skip("vLLM not installed")
    home = real_engine.home()
    assert real_engine.python().resolve().is_relative_to(home.resolve()) or \
        str(real_engine.python()).startswith(str(home))
    model = real_engine.model_dir()
    assert str(model).startswith(str(home))
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in model.iterdir()}


def test_a_dead_engine_reports_its_log():
    if not real_engine.installed():
        pytest.skip("vLLM not installed")
    eng = real_engine.VLLMEngine(max_model_len=-5, startup_timeout_s=120)   # rejected by vLLM
    with pytest.raises(real_engine.EngineError, match="exited with code") as err:
        eng.start()
    assert "max_model_len" in str(err.value) or "max-model-len" in str(err.value)  # the log tail
    run_dir = eng.run_dir
    eng.stop()
    assert eng.proc is None and run_dir is not None and not run_dir.exists()


# A stand-in engine for the reaper test: the harness's own start/stop and pid
# file, around a process group that answers /health and has a helper, as vLLM does.
STAND_IN = r"""
import http.server, subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])   # a helper in the same group
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


class StandIn(real_engine.VLLMEngine):
    def command(self, model):
        return [sys.executable, "-c", STAND_IN, str(self.port)]


OWNER = """
import sys, time
from pathlib import Path
from tests.engine.test_harness import StandIn
eng = StandIn(runs=Path(sys.argv[1]), log=lambda s: None, startup_timeout_s=60).start()
print(eng.proc.pid, eng.run_dir, flush=True)
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"   # a zombie
    except OSError:
        return True


def test_an_engine_left_by_a_killed_process_is_reaped_and_nothing_else(tmp_path):
    if not real_engine.installed():
        pytest.skip("vLLM not installed")
    runs = tmp_path / "runs"
    live = StandIn(runs=runs, log=lambda s: None, startup_timeout_s=60).start()   # its owner (us) runs
    root = Path(__file__).resolve().parents[2]
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(runs)], stdout=subprocess.PIPE, text=True,
                             cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True, cwd=tmp_path)
    try:
        pgid, run_dir = owner.stdout.readline().split()
        pgid, run_dir = int(pgid), Path(run_dir)
        owner_start = real_engine._start_time(owner.pid)
        owner.kill()                                       # killed before it could stop its engine
        owner.wait()
        members = real_engine._group_members(pgid, run_dir)
        assert len(members) == 2                           # the engine and its helper outlived it
        # a pid file naming a group that does not run in its folder (pid reuse, a bystander)
        other = runs / "vllm-other"
        other.mkdir()
        (other / real_engine.PIDFILE).write_text(json.dumps({"pgid": bystander.pid, "owner": owner.pid,
                                                             "owner_start": owner_start}))
        unknown = runs / "vllm-being-set-up"                # no pid file yet: not touched
        unknown.mkdir()
        said = []
        assert real_engine.reap_stale(said.append, runs) == 2   # the stale engine and the bystander's file
        assert all(_gone(pid) for pid in members)
        assert real_engine._group_members(pgid, run_dir) == []
        assert not run_dir.exists() and not other.exists()
        assert len(said) == 1 and str(run_dir) in said[0]  # only the real leftover was stopped
        assert bystander.poll() is None                    # never signalled
        assert live.proc.poll() is None and live.run_dir.exists()   # its owner still runs
        assert unknown.exists()
    finally:
        bystander.kill()
        owner.kill()
        live_dir = live.run_dir
        live.stop()
    assert not live_dir.exists()
