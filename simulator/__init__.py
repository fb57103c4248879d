"""warmscope's emulated GPU inference stack: demo data and ground truth.

A virtual-time simulation of replicas serving tenants through weights, LoRA,
embedding, prefix-KV and response caches, with warm-up strategies under A/B
test and injectable cold-start traps. All telemetry goes through
``collectors`` — the wrappers a user would put in their service.

Example::

    from warmscope.simulator import SimConfig, Simulation, parse_fault
    cfg = SimConfig.load(hours=2, strategy_a="none", strategy_b="static_topk", seed=3)
    sim = Simulation(cfg, "var/sim.sqlite", faults=[parse_fault("bypass:tenant=acme@01:00-01:30")])
    summary = sim.run()
"""

from __future__ import annotations

from .config import STRATEGIES, SimConfig
from .engine import Simulation, Summary
from .faults import TRAPS, Fault, parse_fault
from .run import simulate

__all__ = [
    "SimConfig",
    "Simulation",
    "Summary",
    "Fault",
    "parse_fault",
    "simulate",
    "TRAPS",
    "STRATEGIES",
]
