"""Long computations the dashboard runs in a child process, so that they do not share the server's
interpreter (and its lock) with the page runs, at a lower CPU priority. No Streamlit here: the child
imports only the sources and the analysis it needs."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pandas as pd

# The frames the alert conditions read (analysis.alerts.evaluate and its trap detectors),
# besides the hot keys, which they read from hot_keys_since(start, end) on.
ALERT_FRAMES = ("lookups", "writes", "warmup_runs", "warmed_keys", "early_keys")
Reader = Callable[[str, float, float, "float | None"], pd.DataFrame]
# What the sources are built from (the app's ``data.config()``): store path, whether it exists,
# the remote sources' URLs.
Config = tuple[str, bool, tuple[tuple[str, str], ...]]
# The frames the Advisor's tuning reads (per flush over the range; runs from an hour before).
ADVISOR_FRAMES = (
    "lookups",
    "warmup_runs",
    "warmed_keys",
    "hot_keys",
    "gauges",
    "faults",
    "histograms",
)


_one_at_a_time = threading.Semaphore(1)


def submit(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """``fn(*args)`` in a fresh child process (spawned, daemonic: it ends with the server, mid-work
    or not), one such process at a time; the future holds its result or its exception."""
    fut: Future[Any] = Future()

    def watch() -> None:
        import multiprocessing

        with _one_at_a_time:
            ctx = multiprocessing.get_context("spawn")
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_child, args=(send, fn, args), daemon=True, name="warmscope-background"
            )
            try:
                proc.start()
                send.close()
                ok, value = recv.recv()
            except EOFError:
                proc.join()
                fut.set_exception(
                    RuntimeError(f"the background process ended early (exit code {proc.exitcode})")
                )
                return
            except Exception as e:
                fut.set_exception(e)
                return
            proc.join()
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)

    threading.Thread(target=watch, name="warmscope-background-watch", daemon=True).start()
    return fut


def _child(conn: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:  # page runs in the server come first when the machine is busy
        os.nice(10)
    except OSError:
        pass
    try:
        result = (True, fn(*args))
    except Exception as e:
        result = (False, e)
    try:
        conn.send(result)
    except OSError:  # nobody waits any more (the page or the server went away)
        pass
    except Exception as e:  # an exception (or result) that does not pickle: its text
        with contextlib.suppress(OSError):
            conn.send((False, RuntimeError(f"{type(e).__name__}: {e}")))
    finally:
        conn.close()


def overview_frame_names() -> tuple[str, ...]:
    """What the overview's analyses read: the alert conditions' frames and every score dimension's
    (the ``frames`` each one declares in ``analysis.dimensions.DIMENSIONS``), hot keys apart."""
    from warmscope.analysis.dimensions import DIMENSIONS

    dims = [f for d in DIMENSIONS for f in d.frames if f not in ALERT_FRAMES]
    return ALERT_FRAMES + tuple(dict.fromkeys(dims))


def overview_frames(
    read: Reader, start: float, end: float, step: float | None
) -> dict[str, pd.DataFrame]:
    """The frames the alert conditions and the score card read over [start, end), through
    ``read(name, start, end, step)``: the app's cached ``data.frame`` in the server, the sources
    in the child."""
    from warmscope.analysis.alerts import hot_keys_since

    fr = {n: read(n, start, end, step) for n in overview_frame_names()}
    fr["hot_keys"] = read("hot_keys", max(start, hot_keys_since(start, end)), end, None)
    return fr


def source_reader(src: Any) -> Reader:
    """``read`` over a composite source: a frame no backend holds comes back empty."""
    from warmscope.sources import empty_frame

    def read(name: str, start: float, end: float, step: float | None) -> pd.DataFrame:
        return empty_frame(name) if src.owner(name) is None else src.frame(name, start, end, step)

    return read


def advisor_frames(read: Reader, start: float, end: float) -> dict[str, pd.DataFrame]:
    """What the Advisor reads: :data:`ADVISOR_FRAMES` per flush over [start, end), the warm-up runs
    from an hour before (a replica's start-up warm-up runs before its first request)."""
    fr = {n: read(n, start, end, None) for n in ADVISOR_FRAMES}
    fr["warmup_runs"] = read("warmup_runs", start - 3600.0, end, None)
    return fr


def advice(
    cfg: Config,
    start: float,
    end: float,
    budget: float | None,
    objective: str | None,
    penalty: float | None,
) -> tuple[object, object, object]:
    """The Advisor's tuning over [start, end) (``analysis.advisor.advise``: Bayesian optimisation
    over replays of the recorded traffic, tens of seconds), from the sources ``cfg`` names:
    (recommendation, replayed curves with the recorded parameters, with the recommended ones), or
    (None, why, the replay's fidelity) when there is no recommendation."""
    from warmscope.analysis.advisor import NoRecommendation, advise
    from warmscope.analysis.replay import curves
    from warmscope.analysis.value import values_for
    from warmscope.sources import from_env

    path, _, urls = cfg
    src = from_env(dict(urls), store_path=path)
    fr = advisor_frames(source_reader(src), start, end)
    vm = values_for(src, fr, start, end, None, penalty, objective)
    try:
        rec = advise(fr, budget_gpu_s=budget, objective=objective, values=vm)
    except NoRecommendation as e:
        return None, str(e), e.fidelity
    if rec.model is None:  # advise() fits one from the frames: always there here
        raise ValueError("the recommendation carries no replay model to draw its curves")
    return rec, curves(rec.model, rec.base), curves(rec.model, rec.params)


def alert_history(
    cfg: Config,
    start: float,
    end: float,
    step: float | None,
    every: float,
    lookback: float,
) -> pd.DataFrame:
    """``analysis.alert_history`` over [start, end), reading the frames from ``start - lookback``
    (at resolution ``step``) from the sources ``cfg`` names (the app's ``data._config()``: store
    path, whether it exists, the remote sources' URLs)."""
    from warmscope.analysis.alert_history import alert_history as history
    from warmscope.sources import from_env

    path, _, urls = cfg
    src = from_env(dict(urls), store_path=path)
    fr = overview_frames(source_reader(src), start - lookback, end, step)
    return history(fr, start, end, every=every, lookback=lookback)
