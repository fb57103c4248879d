"""Instructions one simulator worker executes per simulated hour, this checkout against another.

    python -m bench.sim_instructions --previous DIR [--hours 1] [--pools A,B,C]

On a machine whose speed moves by a third from one run to the next, a change of a few per cent
cannot be timed; valgrind's instruction count (callgrind, no cache simulation) does not move. Each
pool's worker (a ``Simulation`` of that pool alone, on the demo's settings, writing to a store that
only counts its rows, as ``run.simulate``'s workers do) runs under valgrind for ``--hours`` and for
0.01 hours; the difference is the simulation of those hours, without the imports and the start.
Both versions run side by side (one per core). DIR is a checkout, as for ``bench.bench_release``.
About 2.5 minutes per pool and hour. A worker named by several pools (``--pools AB,C``) simulates
them together, as when two workers share the demo's three pools (``run._groups``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.bench_release import _env, namespace

# One pool's worker; argv: hours, pool.
_WORKER = """
import sys
from warmscope.app.cli.main import demo_world
from warmscope.simulator.engine import Simulation
class Rows:
    def write(self, batches):
        return sum(len(v) for v in batches.values())
    def close(self):
        pass
cfg, faults = demo_world(float(sys.argv[1]), now=1.75e9)
Simulation(cfg, Rows(), faults=faults, variants=tuple(sys.argv[2])).run(finish=False)
"""
SHORT_H = 0.01


def instructions(pythonpath: Path | None, hours: float, pool: str) -> int:
    r = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c",
                        _WORKER, str(hours), pool], env=_env(pythonpath), capture_output=True, text=True)
    m = re.search(r"Collected : (\d+)", r.stderr)
    if r.returncode or not m:
        raise SystemExit(f"valgrind run failed ({pool}, {hours} h): {r.stderr[-1500:]}")
    return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--previous", type=Path, required=True, help="a checkout of the version to compare with")
    ap.add_argument("--hours", type=float, default=1.0, help="simulated hours per pool (default 1)")
    ap.add_argument("--pools", default="A,B,C",
                    help="workers of the demo to count, each named by its pools (default A,B,C; AB: one worker "
                         "simulating pools A and B, as two workers share three pools)")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    if not (args.previous / "simulator").is_dir():
        raise SystemExit(f"{args.previous} is not a warmscope checkout (no simulator/ folder)")
    with tempfile.TemporaryDirectory(prefix="bench-instr-") as tmp:
        prev = namespace(args.previous, Path(tmp))
        totals = {"previous": 0, "this": 0}
        with ThreadPoolExecutor(max(1, min(2, os.cpu_count() or 1))) as ex:
            for pool in args.pools.split(","):
                runs = {(who, h): ex.submit(instructions, pp, h, pool)
                        for who, pp in (("previous", prev), ("this", None)) for h in (args.hours, SHORT_H)}
                got = {who: runs[(who, args.hours)].result() - runs[(who, SHORT_H)].result()
                       for who in ("previous", "this")}
                for who, n in got.items():
                    totals[who] += n
                print(f"pool {pool}: previous {got['previous'] / 1e9:.2f}, this {got['this'] / 1e9:.2f} billion "
                      f"instructions for {args.hours:g} h; ratio this/previous {got['this'] / got['previous']:.3f}",
                      flush=True)
        print(f"all pools: previous {totals['previous'] / 1e9:.2f}, this {totals['this'] / 1e9:.2f} billion; "
              f"ratio {totals['this'] / totals['previous']:.3f}")


if __name__ == "__main__":
    main()
