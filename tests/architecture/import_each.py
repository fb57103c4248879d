"""Import each module named on stdin as the first of its project's modules, each in a child forked
from this interpreter; print one JSON line per module: [name, exit code, error].

    python import_each.py PREFIX PRELOAD... < module names

Before forking, this interpreter imports the PRELOAD packages (the top-level standard and
third-party packages the project imports), so a child spends its time on the project's own modules
rather than on importing pandas, plotly and Streamlit again (a fresh interpreter per module took
~84 s of CPU for 139 modules, this ~29 s). Only top-level packages are preloaded: a submodule that
importing its package does not load (``concurrent.futures``) is not loaded in the child either,
so a module that uses one without importing it still fails as in a fresh interpreter. (What a
preloaded package itself imports is loaded, as it would be by the first import of that package.)
No module named PREFIX or PREFIX.* may be loaded before a child starts: each child imports its
module first among them, so an import cycle that only bites in one order still fails there. A
child that takes over CHILD_LIMIT_S seconds is ended by an alarm and reported (exit code -14)."""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys

CHILD_LIMIT_S = int(os.environ.get("WARMSCOPE_IMPORT_LIMIT_S", "120"))


def main() -> None:
    prefix, preload = sys.argv[1], sys.argv[2:]
    nested = [n for n in preload if "." in n]
    if nested:
        sys.exit(f"only top-level packages are preloaded, not {nested[:3]}")
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
            signal.alarm(CHILD_LIMIT_S)  # a hanging import ends with SIGALRM, named in the output
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
