"""The real-engine harness: vLLM's CPU build serving the tiny model with prefix
caching, counted per request and on /metrics, stopped without leftovers."""

from __future__ import annotations

import os

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
