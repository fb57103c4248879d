"""Each trap detector on a simulation with that trap injected (the evaluation's
single-trap scenarios), and the detectors' silence on a clean run."""

import pytest
from warmscope.analysis.traps import detect_all
from warmscope.collectors import EmbeddedStore
from warmscope.simulator import SimConfig

from bench.eval_rca import BASE, HOURS, WIN, run, scenarios
from tests.conftest import simulated_store

SINGLE = [s for s in scenarios(9) if len(s.faults) == 1]


@pytest.mark.slow  # a simulation per trap
@pytest.mark.parametrize("sc", SINGLE, ids=[s.name for s in SINGLE])
def test_detector_names_the_injected_trap(sc, tmp_path):
    row = run(sc, tmp_path)
    assert row["trap_ok"], (sc.faults, row["detected"])


@pytest.mark.slow  # a simulation
def test_no_trap_on_a_clean_run(tmp_path):
    cfg = SimConfig.load(hours=HOURS, rps=6.0, tenants=6, replicas=2, seed=77, peak_warmup_at_h=-1)
    simulated_store(tmp_path / "clean.sqlite", cfg, workers=1)
    st = EmbeddedStore(tmp_path / "clean.sqlite", readonly=True)
    frames = {n: st.frame(n) for n in ("lookups", "writes", "hot_keys", "warmup_runs", "warmed_keys")}
    t0 = cfg.start
    verdicts = detect_all(frames, (t0 + WIN[0], t0 + WIN[1]), (t0 + BASE[0], t0 + BASE[1]))
    assert [v.trap for v in verdicts if v.detected] == []
    assert len(verdicts) == 7 and all(v.evidence for v in verdicts)
