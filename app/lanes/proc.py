"""One engine child process: spawned without a shell in its own process group, output kept.

stdout/stderr lines go to a ring buffer and an append-only log file; `last_output` tells the
readiness check that the engine is still making progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO

BATCH_INTERVAL_S = 0.05  # well under what fills a pipe buffer at the engine's log rate


# Names an engine never needs and that may hold credentials (an engine inherits the rest of the
# server's environment: PATH, locale, CUDA_VISIBLE_DEVICES, HF_HUB_OFFLINE ...).
_SECRET_NAMES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "SWITCHYARD_API_KEY")
_SECRET_SUFFIXES = ("_TOKEN", "_API_KEY", "_SECRET", "_PASSWORD", "_PASSWD")
_SECRET_PREFIXES = ("SWITCHYARD_REMOTE_KEY_",)  # remote lanes' keys (app/lanes/remote_store.py)


def engine_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment an engine starts with: the server's, less anything that looks like a secret.

    Proxy variables are kept but stripped too where they carry a password (`http://u:p@host`)."""
    env = dict(os.environ if base is None else base)
    for name in list(env):
        upper = name.upper()
        if upper in _SECRET_NAMES or upper.endswith(_SECRET_SUFFIXES) or upper.startswith(_SECRET_PREFIXES):
            del env[name]
        elif upper.endswith("_PROXY") and "@" in env[name]:
            del env[name]
    return env


class LogRing:
    def __init__(self, *, max_lines: int, file: Path | None) -> None:
        self.lines: deque[str] = deque(maxlen=max_lines)
        self._fh: IO[str] | None = None
        if file is not None:
            file.parent.mkdir(parents=True, exist_ok=True)
            self._fh = file.open("a", encoding="utf-8", errors="replace")
        self.last_output = time.monotonic()

    def add(self, line: str) -> None:
        self.add_many([line])

    def add_many(self, lines: list[str]) -> None:
        """Append lines to the ring and the log file with one write (engines log a lot per request)."""
        if not lines:
            return
        self.lines.extend(lines)
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
    ) -> EngineProcess:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,  # own process group: stop kills the engine and anything it spawned
        )
        return cls(proc, ring, on_port)

    async def _read(self, stream: asyncio.StreamReader | None, tag: str) -> None:
        if stream is None:
            return
        pending = b""
        while True:
            if self.batch_output:
                # once the engine serves, its per-request chatter is read in batches: waking the gateway's
                # event loop for every log line costs it milliseconds of CPU per request
                await asyncio.sleep(BATCH_INTERVAL_S)
            # whole chunks, not lines: one wake-up for everything the engine wrote since the last one
            raw = await stream.read(1 << 20)
            if not raw:
                if pending:
                    self._take([pending], tag)
                return
            parts = (pending + raw).split(b"\n")
            pending = parts.pop()
            if len(pending) > 65536:  # a runaway line without a newline: keep it in pieces
                parts.append(pending)
                pending = b""
            self._take(parts, tag)

    def _take(self, parts: list[bytes], tag: str) -> None:
        lines = [p.decode("utf-8", errors="replace").rstrip("\r") for p in parts]
        if tag == "out":
            for line in lines:
                if line.startswith('{"switchyard"'):
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        msg = json.loads(line)
                        if msg["switchyard"] == "listening":
                            self._on_port(int(msg["port"]))
        self.ring.add_many(lines)

    async def drain_output(self, wait_s: float = 1.0) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*self._readers, return_exceptions=True), wait_s)

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    async def terminate(self, *, grace: float) -> int:
        """SIGTERM to the group, wait `grace` seconds, then SIGKILL the group. Returns the exit code."""
        if self.proc.returncode is None:
            self._signal_group(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), grace)
            except TimeoutError:
                self._signal_group(signal.SIGKILL)
                await self.proc.wait()
        # the leader may be gone while children of the group linger
        self._signal_group(signal.SIGKILL)
        await self.drain_output()
        return self.proc.returncode if self.proc.returncode is not None else -1
