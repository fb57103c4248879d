"""Import each module named on stdin as the first of its project's modules, each in a child forked
from this interpreter; print one JSON line per module: [name, exit code, error].

    python import_each.py PREFIX PRELOAD... < module names

Before forking, this interpreter imports the PRELOAD modules (the standard library's and the
third-party ones the project imports), so a child spends its time on the project's own modules
rather than on importing pandas, plotly and Streamlit again (a fresh interpreter per module took
~84 s of CPU for 139 modules, this ~11 s). No module named PREFIX or PREFIX.* may be loaded
before a child starts: each child imports its module first among them, so an import cycle that
only bites in one order still fails there."""

from __future__ import annotations

import importlib
import json
import os
import sys


def main() -> None:
    prefix, preload = sys.argv[1], sys.argv[2:]
    for name in preload:
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - a preload that fails is imported by the child
            pass
    own = [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")]
    if own:
        sys.exit(f"{prefix} modules were loaded before the children: {own[:5]}")
    for line in sys.stdin:
        mod = line.strip()
        if not mod:
            continue
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: import, say what failed, exit without cleanup
            os.close(r)
            code, msg = 0, ""
            try:
                importlib.import_module(mod)
            except BaseException as e:  # noqa: BLE001 - every failure is the answer
                code, msg = 1, f"{type(e).__name__}: {e}"
            os.write(w, msg.encode()[:4000])
            os._exit(code)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            msg = f.read().decode(errors="replace")
        _, status = os.waitpid(pid, 0)
        print(json.dumps([mod, os.waitstatus_to_exitcode(status), msg]), flush=True)


if __name__ == "__main__":
    main()
