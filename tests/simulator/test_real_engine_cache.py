"""The model info one vLLM engine wrote is kept and copied into the next engine's cache root
(simulator/real_engine.py), without a vLLM: the files are what vLLM reads and writes."""

from __future__ import annotations

import json

from warmscope.simulator import real_engine

NAME = "vllm-model_executor-models-llama-LlamaForCausalLM.json"


def _info(hash_: str) -> bytes:
    return json.dumps({"hash": hash_, "modelinfo": {"architectures": ["LlamaForCausalLM"]}}).encode()


def test_kept_info_is_seeded_into_a_new_cache_root_and_a_newer_one_replaces_it(tmp_path, monkeypatch):
    monkeypatch.setenv("WARMSCOPE_VLLM_HOME", str(tmp_path / "home"))
    first, second = tmp_path / "run1" / "vllm-cache", tmp_path / "run2" / "vllm-cache"
    real_engine._seed_modelinfos(first)  # nothing kept yet: nothing copied, no error
    assert not (first / "modelinfos").exists()
    (first / "modelinfos").mkdir(parents=True)
    (first / "modelinfos" / NAME).write_bytes(_info("a"))
    real_engine._keep_modelinfos(first)
    kept = tmp_path / "home" / "vllm-modelinfos" / NAME
    assert kept.read_bytes() == _info("a")
    real_engine._seed_modelinfos(second)
    assert (second / "modelinfos" / NAME).read_bytes() == _info("a")
    # vLLM found the copy stale (its source changed) and wrote a new one: that one is kept
    (second / "modelinfos" / NAME).write_bytes(_info("b"))
    real_engine._keep_modelinfos(second)
    assert kept.read_bytes() == _info("b")
    assert [p.name for p in kept.parent.iterdir()] == [NAME]  # no temporary file left


def test_an_unwritable_home_never_fails_a_start(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.write_text("a file where the folder would be")
    monkeypatch.setenv("WARMSCOPE_VLLM_HOME", str(home))
    cache = tmp_path / "run" / "vllm-cache"
    (cache / "modelinfos").mkdir(parents=True)
    (cache / "modelinfos" / NAME).write_bytes(_info("a"))
    real_engine._keep_modelinfos(cache)  # cannot keep it: swallowed
    real_engine._seed_modelinfos(cache)
    assert (cache / "modelinfos" / NAME).read_bytes() == _info("a")
