"""One engine child process: spawned without a shell in its own process group, output kept.

stdout/stderr lines go to a ring buffer and an append-only log file; `last_output` tells the
readiness check that the engine is still making progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO

from app.core.platform import procs
from app.core.settings import Settings

BATCH_INTERVAL_S = 0.05  # well under what fills a pipe buffer at the engine's log rate


# An engine starts from an allow-list of the server's environment, never the whole of it: a desktop
# session or a CI holds cloud keys, database URLs and tokens that an engine has no use for.
_PASS_NAMES = frozenset(
    {
        # the process basics
        "PATH", "HOME", "USER", "LOGNAME", "USERNAME", "SHELL", "TMPDIR", "TEMP", "TMP", "TZ", "TERM",
        "LANG", "LANGUAGE", "XDG_RUNTIME_DIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME",
        "LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH", "DYLD_FALLBACK_LIBRARY_PATH", "SSL_CERT_FILE", "SSL_CERT_DIR",
        # Windows: without these a process cannot load its DLLs or find its profile
        "SYSTEMROOT", "SYSTEMDRIVE", "WINDIR", "COMSPEC", "PATHEXT", "USERPROFILE", "APPDATA", "LOCALAPPDATA",
        "PROGRAMDATA", "PROGRAMFILES", "PROGRAMFILES(X86)", "COMMONPROGRAMFILES", "NUMBER_OF_PROCESSORS",
        "PROCESSOR_ARCHITECTURE", "PROCESSOR_IDENTIFIER", "OS",
        # where a Python-packaged engine finds itself and the Hugging Face cache (never the token)
        "PYTHONPATH", "PYTHONHOME", "PYTHONUNBUFFERED", "PYTHONIOENCODING", "PYTHONUTF8",
        "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY",
        "GPU_DEVICE_ORDINAL", "DO_NOT_TRACK", "NO_COLOR",
    }
)  # fmt: skip
# families of GPU, runtime and threading switches (device selection, allocator and kernel options)
_PASS_PREFIXES = (
    "LC_", "CUDA_", "NVIDIA_", "HIP_", "ROCR_", "ROCM_", "HSA_", "ZE_", "ONEAPI_", "SYCL_", "VK_", "METAL_",
    "MTL_", "MLX_", "GGML_", "LLAMA_", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "BLIS_", "VECLIB_", "RAYON_",
    "TORCH_", "PYTORCH_", "NCCL_", "TRITON_", "VLLM_", "SGLANG_",
)  # fmt: skip
# ... less any member of those families that holds a credential (llama-server reads LLAMA_API_KEY, vLLM
# VLLM_API_KEY: passed on, they would also lock the gateway out of its own engine)
_SECRET_MARKS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")


def _allowed(name: str) -> bool:
    upper = name.upper()  # Windows names are case-insensitive
    if upper in _PASS_NAMES:
        return True
    return upper.startswith(_PASS_PREFIXES) and not any(mark in upper for mark in _SECRET_MARKS)


def engine_env(
    base: Mapping[str, str] | None = None,
    *,
    kind: str | None = None,
    passed: Iterable[str] = (),
    extra: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, str]:
    """The environment an engine of lane `kind` starts with: the allow-listed part of `base` (default:
    the server's environment) over this OS's defaults (procs.engine_env_defaults), the names in `passed`
    (settings.engine_env_pass) copied from `base`, then `extra[kind]` (settings.engine_env). A kind sets
    what its engine needs itself on top of this."""
    src = os.environ if base is None else base
    env = procs.engine_env_defaults()
    env.update((name, value) for name, value in src.items() if _allowed(name))
    for name in passed:  # the user's choice: passed even when it looks like a secret
        if name in src:
            env[name] = src[name]
    if extra is not None and kind is not None:
        env.update(extra.get(kind, {}))
    return env


def settings_env(settings: Settings, *, kind: str) -> dict[str, str]:
    """engine_env for lane `kind` with the user's additions from the settings."""
    return engine_env(kind=kind, passed=settings.engines.engine_env_pass, extra=settings.engines.engine_env)


class LogRing:
    def __init__(self, *, max_lines: int, file: Path | None) -> None:
        self.lines: deque[str] = deque(maxlen=max_lines)
        self._fh: IO[str] | None = None
        if file is not None:
            file.parent.mkdir(parents=True, exist_ok=True)
            self._fh = file.open("a", encoding="utf-8", errors="replace")
        self.last_output = time.monotonic()
        self.added = 0  # lines ever added: a reader marks where its part begins (`since`)

    def add(self, line: str) -> None:
        self.add_many([line])

    def add_many(self, lines: list[str]) -> None:
        """Append lines to the ring and the log file with one write (engines log a lot per request)."""
        if not lines:
            return
        self.lines.extend(lines)
        self.added += len(lines)
        self.last_output = time.monotonic()
        if self._fh is not None:
            try:
                self._fh.write("\n".join(lines) + "\n")
                self._fh.flush()
            except OSError as exc:  # a full disk must not stall the engine's pipe: keep the ring only
                self._fh = None
                self.lines.append(f"--- switchyard: log file writing stopped: {exc.strerror or exc}")

    def tail(self, n: int = 20) -> list[str]:
        return list(self.lines)[-n:] if n > 0 else []

    def since(self, mark: int) -> list[str]:
        """The lines added after `added` was `mark` (those still in the ring)."""
        return self.tail(min(self.added - mark, len(self.lines)))

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class EngineProcess:
    def __init__(
        self, proc: asyncio.subprocess.Process, ring: LogRing, on_port: Callable[[int], None]
    ) -> None:
        self.proc = proc
        self.ring = ring
        self._on_port = on_port
        self.batch_output = False
        self.group: procs.ProcessGroup | None = None  # set by spawn; an adopted process has none
        # set when the engine says on stdout that it serves (our workers do): no health polling needed
        self.reported_ready = asyncio.Event()
        self._readers = [
            asyncio.create_task(self._read(proc.stdout, "out")),
            asyncio.create_task(self._read(proc.stderr, "err")),
        ]

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    async def spawn(
        cls,
        argv: tuple[str, ...],
        *,
        env: dict[str, str],
        ring: LogRing,
        on_port: Callable[[int], None],
        cwd: str | None = None,
        stop_pipe: bool | None = None,
    ) -> EngineProcess:
        """Start an engine in a group of its own. `stop_pipe` (default: this OS's way, see
        procs.stop_by_pipe) gives it a standard input whose closing asks it to stop."""
        pipe = procs.stop_by_pipe() if stop_pipe is None else stop_pipe
        if pipe:
            env = {**env, procs.STOP_PIPE_ENV: "1"}
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            stdin=asyncio.subprocess.PIPE if pipe else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            # a group of its own (POSIX: a session; Windows: a process group, then a Job Object): a stop
            # ends the engine and anything it spawned, and on Windows the server's death ends the job
            **procs.spawn_options(),
        )
        engine = cls(proc, ring, on_port)
        try:
            engine.group = procs.ProcessGroup(proc.pid)
        except OSError:
            proc.kill()  # an engine we cannot hold would outlive the server on Windows: never keep one
            await proc.wait()
            raise
        return engine

    async def _read(self, stream: asyncio.StreamReader | None, tag: str) -> None:
        if stream is None:
            return
        pending = b""
        pipe = self._pipe(1 if tag == "out" else 2)
        while True:
            if self.batch_output:
                # once the engine serves, its per-request chatter is read in batches: waking the gateway's
                # event loop for every log line costs it CPU per request. The pipe itself is left unread
                # meanwhile (the kernel holds the lines), else the loop still wakes for each write.
                if pipe is not None:
                    pipe.pause_reading()
                await asyncio.sleep(BATCH_INTERVAL_S)
                if pipe is not None:
                    pipe.resume_reading()
            # whole chunks, not lines: one wake-up for everything the engine wrote since the last one
            raw = await stream.read(1 << 20)
            if not raw:
                if pending:
                    self._take(pending, tag)
                return
            data = pending + raw
            cut = data.rfind(b"\n")
            if cut < 0 and len(data) <= 65536:
                pending = data
                continue
            if cut < 0:  # a runaway line without a newline: keep it in pieces
                cut = len(data)
            pending = data[cut + 1 :]
            self._take(data[:cut], tag)

    def _pipe(self, fd: int) -> asyncio.ReadTransport | None:
        """The read transport of the child's `fd`, where the loop exposes it (asyncio's and uvloop's do)."""
        transport = getattr(self.proc, "_transport", None)
        get = getattr(transport, "get_pipe_transport", None)
        pipe = get(fd) if get is not None else None
        return pipe if hasattr(pipe, "pause_reading") and hasattr(pipe, "resume_reading") else None

    def _take(self, chunk: bytes, tag: str) -> None:
        """Whole lines of one read: decoded and split once, appended to the ring in one go."""
        text = chunk.decode("utf-8", errors="replace")
        if "\r" in text:  # CRLF endings (the chunk's last newline is cut off already)
            text = text.replace("\r\n", "\n").removesuffix("\r")
        lines = text.split("\n")
        if tag == "out" and '{"switchyard"' in text:
            for line in lines:
                if line.startswith('{"switchyard"'):
                    self._control(line)
        self.ring.add_many(lines)

    def _control(self, line: str) -> None:
        with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
            msg = json.loads(line)
            if msg["switchyard"] == "listening":
                self._on_port(int(msg["port"]))
                if msg.get("ready") is True:
                    self.reported_ready.set()

    async def drain_output(self, wait_s: float = 1.0) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*self._readers, return_exceptions=True), wait_s)

    def _close_stop_pipe(self) -> bool:
        stdin = self.proc.stdin
        if stdin is None or stdin.is_closing():
            return False
        stdin.close()  # the worker reads end-of-file and leaves (parentwatch.watch_stop_pipe)
        return True

    async def terminate(self, *, grace: float) -> int:
        """Ask the engine to stop (its stop pipe closed where it has one, else SIGTERM to the group, or
        Ctrl-Break on Windows), wait `grace` seconds, then kill the group (SIGKILL; the Job Object ended on
        Windows). Returns the exit code. Where no ask can be delivered (Windows without a console and no
        stop pipe) the group is killed at once: the server never waits on an engine's own teardown there
        (llama.cpp's took 107 s under wine)."""
        group = self.group or procs.ProcessGroup(self.proc.pid)
        if self.proc.returncode is None:
            if not (self._close_stop_pipe() or group.ask_to_stop()):
                group.kill()
            try:
                await asyncio.wait_for(self.proc.wait(), grace)
            except TimeoutError:
                group.kill()
                await self.proc.wait()
        # the leader may be gone while children of the group linger
        group.kill()
        group.close()
        await self.drain_output()
        return self.proc.returncode if self.proc.returncode is not None else -1
