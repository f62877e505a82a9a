"""The gateway benchmark's optional parts: LiteLLM as a peer proxy, and profiling the gateway.

LiteLLM lives in a venv of its own under a cache dir, installed on first use of ``--peer litellm`` only;
it runs offline (the bundled model cost map) against the engine's own URL. Profiling uses py-spy when it
can be installed into the running venv, else cProfile wrapped around the server's own ``main``.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import pstats
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

# pinned: a LiteLLM release once shipped compromised, so an unreviewed newer one is not picked up
# silently; later releases' proxy extras pin helper packages (litellm-proxy, newer litellm-proxy-extras)
# that the package index reachable here lacks
LITELLM_SPEC = "litellm[proxy]==1.108.0"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "switchyard-bench"


def tree_cpu_s(pids: list[int]) -> float:
    """CPU time of these processes, all threads, from schedstat (ns); gone processes count zero."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
                    total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- LiteLLM ---------------------------------------------------------------------------------------
def litellm_python(spec: str = LITELLM_SPEC) -> Path:
    """The python of a venv that holds `spec`, created and filled on first use (minutes)."""
    venv = CACHE / "litellm-venv"
    py = venv / "bin" / "python"
    marker = venv / ".installed"
    if marker.exists() and marker.read_text() == spec:
        return py
    t0 = time.perf_counter()
    print(f"installing {spec} into {venv} (once; several minutes) ...", flush=True)
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", spec], check=True)
    marker.write_text(spec)
    print(f"installed in {time.perf_counter() - t0:.0f} s", flush=True)
    return py


class LiteLLM:
    """A LiteLLM proxy child that serves `model` by forwarding to the engine at `engine_url`."""

    def __init__(self, workdir: Path, *, model: str, engine_url: str) -> None:
        py = litellm_python()
        workdir.mkdir(parents=True, exist_ok=True)
        entry = {"model": f"openai/{model}", "api_base": f"{engine_url}/v1", "api_key": "sk-dummy"}
        config = {"model_list": [{"model_name": model, "litellm_params": entry}]}
        cfg = workdir / "litellm.yaml"
        cfg.write_text(json.dumps(config))  # JSON is YAML
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # the proxy refuses to start without a master key; a fresh one per run, sent by the client
        self.key = f"sk-{secrets.token_hex(16)}"
        env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_LOG="ERROR", NO_DOCS="True")
        env["LITELLM_MASTER_KEY"] = self.key
        self.log_path = workdir / "litellm.log"
        self._log = self.log_path.open("w")
        litellm_bin = py.parent / "litellm"
        argv = [str(litellm_bin), "--config", str(cfg), "--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = subprocess.Popen(
            argv, cwd=workdir, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.pids: list[int] = [self.proc.pid]

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.url}/health/liveliness", timeout=2) as r:
                    if r.status == 200:
                        self.pids = [self.proc.pid] + [
                            c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)
                        ]
                        return
            time.sleep(0.5)
        raise RuntimeError(f"the LiteLLM proxy did not start:\n{self.log_path.read_text()[-2000:]}")

    def cpu_s(self) -> float:
        return tree_cpu_s(self.pids)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


# ---- profiling ---------------------------------------------------------------------------------------
# cProfile around the server's own entry point: no server setting needed, works on any checkout
CPROFILE_CODE = (
    "import cProfile, sys\n"
    "out = sys.argv[1]\n"
    "sys.argv = ['switchyard'] + sys.argv[2:]\n"
    "from app.__main__ import main\n"
    "cProfile.run('main(sys.argv[1:])', out)\n"
)


def py_spy() -> str | None:
    """The py-spy binary beside this python, installed into this venv if it is missing; None if not."""
    exe = Path(sys.executable).parent / "py-spy"
    if not exe.exists():
        print("installing py-spy into this venv (--profile) ...", flush=True)
        got = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "py-spy"], check=False)
        if got.returncode != 0 or not exe.exists():
            return None
    return str(exe)


class PySpy:
    """py-spy recording the serve process; raw (collapsed) stacks, idle samples left out."""

    RATE = 250

    def __init__(self, exe: str, pid: int, out: Path) -> None:
        self.out = out
        argv = [exe, "record", "--pid", str(pid), "--rate", str(self.RATE), "--format", "raw"]
        # not --native: it counts threads blocked in epoll/futex as busy. So the event loop's own C code
        # (uvloop: callbacks, socket calls) shows as the Python frame that runs the loop, Runner.run.
        # --function: one row per function, not per line
        argv += ["--output", str(out), "--nonblocking", "--function"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(30)
        if self.proc.poll() is None:
            self.proc.kill()

    def top(self, n: int) -> list[tuple[str, float]]:
        """(function, own seconds) of the `n` leaf frames seen most often."""
        if not self.out.exists():
            err = self.proc.stderr.read() if self.proc.stderr else ""
            print(f"py-spy wrote no profile; it said:\n{err[-2000:]}")
            return []
        own: collections.Counter[str] = collections.Counter()
        for line in self.out.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            leaf = stack.split(";")[-1]
            own[leaf] += int(count)
        return [(name, c / self.RATE) for name, c in own.most_common(n)]


def cprofile_top(path: Path, n: int) -> list[tuple[str, float]]:
    """(function, own seconds) of the `n` functions with the most own time in a cProfile dump."""
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    rows = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:n]
    return [(f"{func} ({_short(file)}:{line})", tt) for (file, line, func), (_, _, tt, _, _) in rows]


def _short(file: str) -> str:
    parts = Path(file).parts
    for anchor in ("app", "site-packages", "python3.11"):
        if anchor in parts:
            return "/".join(parts[parts.index(anchor) + (anchor != "app") :])
    return file


def print_profile(top: list[tuple[str, float]], *, events: int, tool: str) -> None:
    print(f"\nprofile of switchyard serve ({tool}): top {len(top)} functions by own time, per event")
    print(f"forwarded through the gateway ({events} events, warm-up included)")
    for name, secs in top:
        print(f"{1e6 * secs / max(events, 1):>9.2f} us  {name[:130]}")
