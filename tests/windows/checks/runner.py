"""What every check script run under the Windows CPython shares: a registry filled by `@check`, the Wine
exception for a limit that is wine's and not Windows', and the loop that runs the checks each in a folder
of its own and prints one JSON line per check ({"check", "ok", "detail" | "error" + "trace" | "wine",
"seconds"}), then {"done": true}. Checks run in one process (a python.exe start costs seconds under wine)
and each catches its own failure, so one broken check does not hide the others."""

from __future__ import annotations

import json
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

Check = Callable[[Path], object]


class Wine(Exception):
    """The check met a limit of wine, not of Windows (the message says which)."""


class Checks:
    """The checks of one script, in the order they are declared (`@checks.add`)."""

    def __init__(self) -> None:
        self.all: list[tuple[str, Check]] = []

    def add(self, fn: Check) -> Check:
        self.all.append((fn.__name__, fn))
        return fn

    def run(self, *, prefix: str, wanted: set[str]) -> int:
        """Run the `wanted` checks (every one when empty), each in its own new folder."""
        root = Path(tempfile.mkdtemp(prefix=prefix))
        for name, fn in self.all:
            if wanted and name not in wanted:
                continue
            tmp = root / name
            tmp.mkdir()
            started = time.monotonic()
            try:
                line: dict[str, object] = {"check": name, "ok": True, "detail": fn(tmp)}
            except Wine as exc:
                line = {"check": name, "ok": False, "wine": str(exc)}
            except BaseException as exc:  # SystemExit or a native abort would end the loop: report, go on
                line = {
                    "check": name,
                    "ok": False,
                    "error": f"{type(exc).__name__}: {exc}",
                    "trace": traceback.format_exc()[-2000:],
                }
            line["seconds"] = round(time.monotonic() - started, 2)
            print(json.dumps(line, default=str), flush=True)
        print(json.dumps({"done": True}), flush=True)
        return 0
