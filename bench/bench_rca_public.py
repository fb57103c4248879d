"""Root-cause localisation on public benchmark cases, beside the published methods.

    python -m bench.bench_rca_public [--data DIR] [--cli N] [--show]

Reads the public RCA benchmark cases from ``--data`` or ``$WARMSCOPE_RCA_CASES`` (they are not
part of the repository): 87 real-world ratio cases (a failure
rate, RobustSpot data), 100 additive cases from RiskLoc's generator (60 ``S_``, 40 ``L_``) and,
when the folder has ``squeeze/``, sparse additive cases (Squeeze's semi-synthetic data, many leaves
zero in both columns).
Scores every case with the exact-element rule of the RiskLoc and Squeeze
evaluations (TP/FP/FN summed over cases, F1 = 2TP / (2TP + FP + FN)) and prints
warmscope's F1 next to the published reference implementations' figures on the
same cases, read from the folder's ``ANCHORS.md``. Times are per case in-process
(file reading excluded; wall and CPU); ``--cli N`` also times ``warmscope rca`` as a process on N
cases of each set (process start, CSV reading and JSON output included).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from warmscope.analysis.rootcause import localize

REPO = Path(__file__).resolve().parents[1]
CASES_ENV = "WARMSCOPE_RCA_CASES"
DEFAULT: Path | None = Path(os.environ[CASES_ENV]) if os.environ.get(CASES_ENV) else None


def norm(element: dict) -> str:
    return "&".join(sorted(f"{k}={v}" for k, v in element.items()))


def cases(data: Path, name: str):
    for c in json.loads((data / name / "truth.json").read_text()):
        yield c["case"], c["dims"], data / name / c["case"], {norm(e) for e in c["causes"]}


def anchors(data: Path) -> dict[str, dict[str, str]]:
    """Published F1 per algorithm and set, from ANCHORS.md's two tables."""
    out: dict[str, dict[str, str]] = {"ratio": {}, "S": {}, "L": {}}
    section = None
    for line in (data / "ANCHORS.md").read_text().splitlines():
        if line.startswith("## Ratio"):
            section = "ratio"
        elif line.startswith("## Additive"):
            section = "additive"
        elif line.startswith("## "):
            section = None
        if not line.startswith("| ") or section is None:
            continue
        cells = [c.strip().replace("*", "") for c in line.strip().strip("|").split("|")]
        if cells[0] in ("algorithm", "") or set(cells[0]) <= set("-"):
            continue
        if section == "ratio":
            out["ratio"][cells[0]] = cells[1]
        else:
            for key, cell in (("S", cells[1]), ("L", cells[3])):
                m = re.match(r"([0-9.]+)", cell)
                out[key][cells[0]] = m.group(1) if m else "–"
    return out


def score(data: Path, name: str, match: str = "", show: bool = False, every: int = 1) -> dict:
    """F1 over the set's cases whose name starts with ``match`` (every ``every``-th of them)."""
    tp = fp = fn = 0
    times, cpu = [], []
    k = -1
    for case, dims, path, truth in cases(data, name):
        if match and not case.startswith(match):
            continue
        k += 1
        if k % every:
            continue
        df = pd.read_csv(path, dtype={d: str for d in dims}, keep_default_na=False)
        t, c = time.perf_counter(), time.process_time()
        if name == "ratio":
            loc = localize(
                df, dims, v_num="real_num", v_den="real_den", f_num="exp_num", f_den="exp_den"
            )
        else:
            loc = localize(df, dims, v="real", f="predict")
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        pred = {norm(c.element) for c in loc.causes}
        hit = len(pred & truth)
        tp, fp, fn = tp + hit, fp + len(pred) - hit, fn + len(truth) - hit
        if show and pred != truth:
            print(f"  {case}: predicted {sorted(pred)} true {sorted(truth)}")
    return {
        "f1": 2 * tp / max(2 * tp + fp + fn, 1),
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "n": len(times),
        "median_s": float(np.median(times)),
        "max_s": float(np.max(times)),
        "median_cpu": float(np.median(cpu)),
    }


def cli_times(data: Path, name: str, n: int, match: str = "") -> tuple[list[float], list[float]]:
    """Wall and CPU seconds (the child's user + system time) per `warmscope rca` call on ``n``
    cases spread evenly over the set (names starting with ``match``)."""
    # The package's own entry (the installed console script may belong to another checkout).
    exe = [sys.executable, "-m", "warmscope.app.cli"]
    # An installed package runs from compiled bytecode (pip compiles on install); with
    # PYTHONDONTWRITEBYTECODE set every call would compile ~50 modules again (~0.2 s). The
    # children may write __pycache__, and one untimed call writes it before the timed ones.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([*exe, "rca", "--help"], capture_output=True, env=env)
    out, cpu = [], []
    chosen = [c for c in cases(data, name) if c[0].startswith(match)]
    for _case, dims, path, _ in chosen[:: max(1, len(chosen) // n)][:n]:
        cmd = [*exe, "rca", str(path), "--dims", *dims, "--compact"]
        cmd += (
            [
                "--v-num",
                "real_num",
                "--v-den",
                "real_den",
                "--f-num",
                "exp_num",
                "--f-den",
                "exp_den",
            ]
            if name == "ratio"
            else ["--v", "real", "--f", "predict"]
        )
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        out.append(time.perf_counter() - t)
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime)
        json.loads(r.stdout)
    return out, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--data",
        type=Path,
        default=DEFAULT,
        help=f"case folder: ratio/ and additive/ with truth.json, and ANCHORS.md "
        f"(default ${CASES_ENV})",
    )
    ap.add_argument(
        "--cli",
        type=int,
        default=0,
        metavar="N",
        help="also time `warmscope rca` on N cases per set",
    )
    ap.add_argument(
        "--show", action="store_true", help="print the cases that are not exactly right"
    )
    args = ap.parse_args()
    if args.data is None:
        print(
            f"no case folder: give --data DIR or set {CASES_ENV} to the folder of the public "
            "RCA benchmark "
            "cases (ratio/ and additive/ with truth.json, and ANCHORS.md)",
            file=sys.stderr,
        )
        return 2
    if not (args.data / "ANCHORS.md").exists():
        print(
            f"no RCA benchmark cases at {args.data} (ANCHORS.md missing): give --data DIR or "
            f"set {CASES_ENV}",
            file=sys.stderr,
        )
        return 2
    pub = anchors(args.data)
    rows = [
        ("additive S (60)", "additive", "S_", "S", "RiskLoc"),
        ("additive L (40)", "additive", "L_", "L", "RiskLoc"),
        ("ratio (87)", "ratio", "", "ratio", "RobustSpot"),
    ]
    if (args.data / "squeeze" / "truth.json").exists():
        rows.append(("squeeze (sparse)", "squeeze", "", "squeeze", ""))
    res = {}
    print(
        f"{'set':<18}{'warmscope F1':>13}{'TP/FP/FN':>14}{'median s':>10}{'cpu s':>7}{'max s':>8}"
        "   published F1 on the same cases"
    )
    for label, name, match, key, _best in rows:
        r = res[label] = score(args.data, name, match, args.show)
        others = ", ".join(f"{a} {f}" for a, f in pub.get(key, {}).items() if f not in ("", "–"))
        print(
            f"{label:<18}{r['f1']:>13.3f}{r['tp']:>6}/{r['fp']}/{r['fn']:<5}{r['median_s']:>10.3f}"
            f"{r['median_cpu']:>7.3f}{r['max_s']:>8.3f}   {others}"
        )
    s, l_ = res["additive S (60)"], res["additive L (40)"]
    tp, fp, fn = s["tp"] + l_["tp"], s["fp"] + l_["fp"], s["fn"] + l_["fn"]
    print(
        f"{'additive all (100)':<18}{2 * tp / (2 * tp + fp + fn):>13.3f}{tp:>6}/{fp}/{fn:<5}"
        f"{'':>18}   RiskLoc {pub['S'].get('RiskLoc', '?')} (S) / "
        f"{pub['L'].get('RiskLoc', '?')} (L)"
    )
    if args.cli:
        every: list[float] = []
        for label, name, match in (
            ("additive S", "additive", "S_"),
            ("additive L", "additive", "L_"),
            ("ratio", "ratio", ""),
            ("squeeze", "squeeze", ""),
        ):
            if not (args.data / name / "truth.json").exists():
                continue
            t, c = cli_times(args.data, name, args.cli, match)
            every += t
            print(
                f"warmscope rca as a process, {label}: median {np.median(t):.3f} s wall "
                f"({np.median(c):.3f} s "
                f"CPU), max {np.max(t):.3f} s over {len(t)} cases"
            )
        print(
            f"warmscope rca as a process, every timed case: median {np.median(every):.3f} s wall "
            f"over {len(every)} cases (target < 0.8 s)"
        )
        print(
            f"load average now: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores "
            "(wall times grow with it)"
        )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())
