"""The root-cause evaluation: 36 simulated fault scenarios (single
and two-trap, 1–3 dimensions deep, varying rate, tenants and seeds), scored
against the injected ground truth."""

import pytest

from bench.eval_rca import evaluate
from tests.conftest import simulated_store


@pytest.mark.slow  # 36 simulations
@pytest.mark.timeout(1500)  # about 6 min on two idle cores to simulate; seconds with the stores kept
def test_rca_f1_and_trap_identification_reach_ninety_percent(tmp_path):
    # each scenario's store (and its fault-free twin) is simulated once per simulator version and kept
    df = evaluate(36, tmp_path, sim=lambda cfg, path, faults: simulated_store(path, cfg, faults, workers=1))
    rca = df["f1"].dropna()
    single = df[df["single"]]
    assert len(rca) >= 28 and len(df) >= 30
    assert rca.mean() >= 0.9, df[["scenario", "f1", "predicted", "expected"]].to_string()
    assert single["trap_ok"].mean() >= 0.9, df[["scenario", "trap_ok", "detected"]].to_string()
    assert df[~df["single"]]["trap_ok"].mean() >= 0.75
