"""This checkout against a previous release, in the same run: the simulator, the quick path, the demo.

    python -m bench.bench_release --previous DIR [--what sim,quick,demo] [--hours 24] [--repeat 2]

DIR is a checkout of the previous release (e.g. ``git worktree add /tmp/prev 5b37789``). Its source folders
are put under a ``warmscope`` namespace of their own (a folder of links on PYTHONPATH, ahead of this
checkout's editable install), so the same interpreter and packages run either release. Each figure is taken
for both releases in turn, in fresh processes, and printed with its ratio (this / previous) and the load
average, because on a shared machine only the ratio within one run means anything:

* **sim**: the demo's day (``warmscope demo``'s settings: three pools, both traps; ``--hours`` of it) simulated
  into a new store with the default parallel layout; wall and CPU seconds per million requests.
* **quick**: the quick path (every test that needs no service and is not slow), as each release runs it:
  the previous one's ``pytest -m QUICK`` in its checkout, this one's ``bash scripts/test.sh --quick``.
* **demo**: ``bash scripts/demo.sh`` from a fresh clone of each release's commit (its own ``.venv`` installed
  from scratch, pip's download cache as the machine has it) until the dashboard answers HTTP 200.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("model", "collectors", "sources", "analysis", "simulator", "app")
QUICK = "not engine and not redis and not prometheus and not browser and not slow"

# One demo day in a fresh process; prints its figures as JSON. argv: hours, store path.
_SIM = """
import json, resource, sys, time
from warmscope.app.cli.main import demo_world
from warmscope.simulator import simulate
import warmscope.simulator as s
hours, path = float(sys.argv[1]), sys.argv[2]
cfg, faults = demo_world(hours, now=1.75e9)
t = time.perf_counter()
day = simulate(cfg, path, faults)
cpu = sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))
print(json.dumps({"requests": day.requests, "wall": time.perf_counter() - t, "cpu": cpu, "code": s.__file__}))
"""


def namespace(checkout: Path, tmp: Path) -> Path:
    """A folder whose ``warmscope/`` links to ``checkout``'s source folders (put it on PYTHONPATH)."""
    ns = tmp / f"ns-{checkout.name}"
    (ns / "warmscope").mkdir(parents=True, exist_ok=True)
    for name in SOURCES:
        link = ns / "warmscope" / name
        if not link.exists():
            link.symlink_to(checkout.resolve() / name)
    return ns


def _env(pythonpath: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CI")}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return env


def _load() -> str:
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def _ratios(name: str, prev: list[float], cur: list[float], unit: str) -> None:
    r = [c / p for p, c in zip(prev, cur, strict=True)]
    print(
        f"{name}: previous {statistics.median(prev):.1f} {unit}, this {statistics.median(cur):.1f} {unit} "
        f"(medians of {len(r)}); ratio this/previous {statistics.median(r):.2f} "
        f"({', '.join(f'{x:.2f}' for x in r)})",
        flush=True,
    )


def bench_sim(prev_ns: Path, hours: float, repeat: int, tmp: Path) -> None:
    walls: dict[str, list[float]] = {"previous": [], "this": []}
    cpus: dict[str, list[float]] = {"previous": [], "this": []}
    for i in range(repeat):
        for who, pp in (("previous", prev_ns), ("this", None)):
            path = tmp / f"sim-{who}-{i}.sqlite"
            out = subprocess.run(
                [sys.executable, "-c", _SIM, str(hours), str(path)],
                capture_output=True,
                text=True,
                env=_env(pp),
                cwd=tmp,
            )
            for f in tmp.glob(path.name + "*"):
                f.unlink()
            if out.returncode != 0:
                sys.exit(f"bench_release: the {who} simulation failed:\n{out.stderr[-2000:]}")
            d = json.loads(out.stdout.strip().splitlines()[-1])
            per = 1e6 / d["requests"]
            walls[who].append(d["wall"] * per)
            cpus[who].append(d["cpu"] * per)
            print(
                f"sim {who} #{i + 1}: {d['requests']:,} requests in {d['wall']:.1f} s = {d['wall'] * per:.1f} s "
                f"wall, {d['cpu'] * per:.1f} s CPU per million ({d['code']}); {_load()}",
                flush=True,
            )
    _ratios("simulator, wall s per million requests", walls["previous"], walls["this"], "s")
    _ratios("simulator, CPU s per million requests", cpus["previous"], cpus["this"], "s")


def _timed(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> tuple[float, str]:
    t = time.perf_counter()
    with open(log, "w") as fh:
        rc = subprocess.run(cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - t
    tail = [
        ln
        for ln in log.read_text(errors="replace").splitlines()
        if " passed" in ln or " failed" in ln
    ]
    return wall, f"exit {rc}; {tail[-1].strip('= ') if tail else 'no summary line'}"


def bench_quick(prev: Path, prev_ns: Path, repeat: int, tmp: Path) -> None:
    walls: dict[str, list[float]] = {"previous": [], "this": []}
    for i in range(repeat):
        runs = (
            (
                "previous",
                [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", QUICK],
                prev,
                _env(prev_ns),
            ),
            ("this", ["bash", "scripts/test.sh", "--quick", "-q"], ROOT, _env(None)),
        )
        for who, cmd, cwd, env in runs:
            wall, said = _timed(cmd, cwd, env, tmp / f"quick-{who}-{i}.log")
            walls[who].append(wall)
            print(f"quick path {who} #{i + 1}: {wall:.0f} s ({said}); {_load()}", flush=True)
    _ratios("quick path, wall s", walls["previous"], walls["this"], "s")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _demo_once(commit: str, tmp: Path, label: str) -> float:
    """Seconds from ``bash scripts/demo.sh`` in a fresh clone of ``commit`` to HTTP 200 from the dashboard."""
    clone = tmp / f"clone-{label}"
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True)
    port = _free_port()
    log = open(tmp / f"demo-{label}.log", "w")
    t = time.perf_counter()
    proc = subprocess.Popen(
        ["bash", "scripts/demo.sh", "--port", str(port)],
        cwd=clone,
        env=_env(None),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        while proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                    if r.status == 200:
                        return time.perf_counter() - t
            except OSError:
                pass
            time.sleep(0.5)
        sys.exit(
            f"bench_release: the demo of {commit} exited with {proc.returncode}; see {log.name}"
        )
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
        subprocess.run(["rm", "-rf", str(clone)], check=False)
    raise AssertionError("unreachable")


def bench_demo(prev_commit: str, repeat: int, tmp: Path) -> None:
    this = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    walls: dict[str, list[float]] = {"previous": [], "this": []}
    for i in range(repeat):
        for who, commit in (("previous", prev_commit), ("this", this)):
            s = _demo_once(commit, tmp, f"{who}-{i}")
            walls[who].append(s)
            print(
                f"demo {who} ({commit[:7]}) #{i + 1}: HTTP 200 after {s:.0f} s from a fresh clone; {_load()}",
                flush=True,
            )
    _ratios("demo, s from a fresh clone to HTTP 200", walls["previous"], walls["this"], "s")


def main() -> None:
    ap = argparse.ArgumentParser(
        description="This checkout against a previous release: simulator, quick path, demo."
    )
    ap.add_argument(
        "--previous", type=Path, required=True, help="a checkout of the previous release"
    )
    ap.add_argument("--what", default="sim,quick,demo", help="comma-separated: sim, quick, demo")
    ap.add_argument(
        "--hours", type=float, default=24.0, help="simulated hours of the demo day (sim)"
    )
    ap.add_argument("--repeat", type=int, default=1, help="pairs of runs per figure")
    args = ap.parse_args()
    prev = args.previous.resolve()
    if not (prev / "simulator" / "run.py").is_file():
        sys.exit(
            f"bench_release: {prev} is not a warmscope checkout; make one with `git worktree add DIR 5b37789`"
        )
    commit = subprocess.run(
        ["git", "-C", str(prev), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    print(
        f"previous release: {prev} ({commit[:7]}); this: {ROOT}; {os.cpu_count()} cores; {_load()}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench-release-") as d:
        tmp = Path(d)
        ns = namespace(prev, tmp)
        what = set(args.what.split(","))
        if "sim" in what:
            bench_sim(ns, args.hours, args.repeat, tmp)
        if "quick" in what:
            bench_quick(prev, ns, args.repeat, tmp)
        if "demo" in what:
            bench_demo(commit, args.repeat, tmp)
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"children's CPU: {r.ru_utime + r.ru_stime:.0f} s; {_load()}")


if __name__ == "__main__":
    main()
