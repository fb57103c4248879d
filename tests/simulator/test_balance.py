"""The parallel run keeps its pools' workers abreast (simulator/run.py ``_Balance``): a worker that runs ahead
of the slowest yields, one scheduling-priority (nice) step at a time, on real processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest
from warmscope.simulator import run


def _idle(stop) -> None:
    stop.wait(60)


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="no setpriority on this system")
def test_a_worker_ahead_of_the_slowest_yields_one_nice_step_at_a_time():
    ctx = mp.get_context("fork")
    stop = ctx.Event()
    procs = [ctx.Process(target=_idle, args=(stop,), daemon=True) for _ in range(3)]
    for p in procs:
        p.start()
    try:
        ticks = [ctx.Value("i", 0) for _ in procs]
        base = os.getpriority(os.PRIO_PROCESS, 0)  # the children start where this process is

        def steps() -> list[int]:
            return [os.getpriority(os.PRIO_PROCESS, p.pid) - base for p in procs]

        # 1,000 ticks in the run: a worker may run 1 % (10 ticks) ahead of the slowest
        bal = run._Balance(procs, ticks, 1000)
        ticks[0].value, ticks[1].value, ticks[2].value = 40, 30, 25  # 15 and 5 ahead of the slowest
        bal()
        assert steps() == [1, 0, 0]
        bal()  # at most one look a second: nothing changes yet
        assert steps()[0] == 1
        bal.next = time.monotonic()  # a second later, still ahead: one more step
        ticks[1].value = 36  # now 11 ahead
        bal()
        assert steps() == [2, 1, 0]
        for _ in range(10):  # never past the cap
            bal.next = 0.0
            bal()
        assert steps()[0] == min(run._MAX_NICE, 19 - base)
    finally:
        stop.set()
        for p in procs:
            p.join(10)
