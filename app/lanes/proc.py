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


class LogRing:
    def __init__(self, *, max_lines: int, file: Path | None) -> None:
        self.lines: deque[str] = deque(maxlen=max_lines)
        self._fh: IO[str] | None = None
        if file is not None:
            file.parent.mkdir(parents=True, exist_ok=True)
            self._fh = file.open("a", encoding="utf-8", errors="replace")
        self.last_output = time.monotonic()

    def add(self, line: str) -> None:
        self.lines.append(line)
        self.last_output = time.monotonic()
        if self._fh is not None:
            try:
                self._fh.write(line + "\n")
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
        self._readers = [
            asyncio.create_task(self._read(proc.stdout, "out")),
            asyncio.create_task(self._read(proc.stderr, "err")),
        ]

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    async def spawn(
        cls, argv: tuple[str, ...], *, env: dict[str, str], ring: LogRing, on_port: Callable[[int], None]
    ) -> EngineProcess:
        proc = await asyncio.create_subprocess_exec(
            *argv,
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
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line longer than the buffer: keep what we can
                raw = await stream.read(65536)
            if not raw:
                return
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if tag == "out" and line.startswith('{"switchyard"'):
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    msg = json.loads(line)
                    if msg["switchyard"] == "listening":
                        self._on_port(int(msg["port"]))
            self.ring.add(line)

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
