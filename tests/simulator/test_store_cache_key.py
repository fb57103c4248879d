"""The simulated-store cache's key (tests/conftest.py: simulator_version) covers every source file
a simulation runs, and only those: a store is rebuilt when the simulation's code changes, not when
the engine harness or the gateway does."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import simulation_sources, simulator_version

ROOT = Path(__file__).resolve().parents[2]

# Simulations with every strategy and every trap, a block trace and both layouts (one process and
# pools in workers); prints the project's source files this process loaded.
_RUN = """
import json, sys
from pathlib import Path
from warmscope.simulator import SimConfig, TRAPS, parse_fault, simulate
from warmscope.simulator.engine import Simulation
from warmscope.collectors.store import EmbeddedStore
out = Path(sys.argv[1])
faults = [parse_fault(t) for t in TRAPS]
for i, (a, b, c) in enumerate([("none", "static_topk", "predictive"), ("semantic", "none", "")]):
    cfg = SimConfig.load(hours=0.25, rps=4, strategy_a=a, strategy_b=b, strategy_c=c,
                         restart_every_h=0.1, content_drift_h=0.1)
    simulate(cfg, out / f"s{i}.sqlite", faults, workers=1 + i)
cfg = SimConfig.load(hours=0.1, rps=4)
Simulation(cfg, EmbeddedStore(out / "t.sqlite"), block_trace=out / "trace.jsonl").run()
root = Path(sys.argv[2]).resolve()
print(json.dumps(sorted(
    str(Path(m.__file__).resolve().relative_to(root)) for m in list(sys.modules.values())
    if getattr(m, "__file__", None) and Path(m.__file__).resolve().is_relative_to(root)
)))
"""


@pytest.mark.slow  # three short simulations in a fresh interpreter
def test_a_simulation_imports_no_source_the_key_leaves_out(tmp_path):
    res = subprocess.run([sys.executable, "-c", _RUN, str(tmp_path), str(ROOT)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    loaded = {Path(p) for p in json.loads(res.stdout.strip().splitlines()[-1])}
    keyed = {p.relative_to(ROOT) for p in simulation_sources(ROOT)}
    ran = {p for p in loaded if p.parts[0] in ("model", "collectors", "sources", "simulator")}
    assert len(ran) > 20, sorted(ran)
    assert ran <= keyed, sorted(ran - keyed)


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / "src"
    for folder in ("model", "collectors", "sources", "simulator"):
        shutil.copytree(ROOT / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_the_key_moves_with_the_simulation_and_not_with_the_engine_harness(tmp_path):
    copy = _copy(tmp_path)
    keyed = {p.relative_to(copy).as_posix() for p in simulation_sources(copy)}
    assert {"simulator/engine.py", "collectors/aggregator.py", "model/records.py",
            "sources/trace_file.py", "collectors/__init__.py"} <= keyed
    assert not {"simulator/real_engine.py", "collectors/gateway.py",
                "collectors/kv/subscriber.py", "sources/prometheus.py"} & keyed
    before = simulator_version(copy)
    with open(copy / "simulator" / "real_engine.py", "a") as f:
        f.write("\n# a change to the engine harness\n")
    assert simulator_version.__wrapped__(copy) == before
    with open(copy / "collectors" / "aggregator.py", "a") as f:
        f.write("\n# a change to what the simulation runs\n")
    assert simulator_version.__wrapped__(copy) != before
