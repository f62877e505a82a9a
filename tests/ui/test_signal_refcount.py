"""The Qt binding must keep Python's reference counts. PySide6 6.12.0 did not: every `Signal.emit` from
Python dropped a reference to the True it returns, and every call of a method that returns nothing
(`QLabel.setText`, `setEnabled`, `QTableWidget.setItem`, ...) one to None, so a long session of events
and repaints counted them down until the interpreter aborted ("Fatal Python error: bool_dealloc" /
"none_dealloc", at quit or before: issue 20's quit defect; the docs' screenshot run aborted at its end
every time). pyproject.toml excludes 6.12.0; this test tells a leaking binding, so a future release with
the same fault is caught before it ships.

The calls run in a child process: on a leaky binding the lost references are lost for good, and once a
count reaches zero the interpreter aborts, which must not take the test run down with it. The child holds
extra references while it counts, prints the drift and leaves without finalizing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("PySide6")

CALLS = 2000

PROBE = textwrap.dedent(
    """
    import json, os, sys
    from typing import Any
    from PySide6.QtCore import QObject, Signal
    from PySide6.QtWidgets import QApplication, QLabel

    class Source(QObject):
        received = Signal(str, object)  # the shape of app.ui.bridge.Bridge.received

    class Sink(QObject):
        def __init__(self) -> None:
            super().__init__()
            self.seen = 0

        def on(self, _kind: str, _data: Any) -> None:
            self.seen += 1

    def counts() -> tuple[int, int, int]:
        return sys.getrefcount(True), sys.getrefcount(False), sys.getrefcount(None)

    n = int(sys.argv[1])
    app = QApplication([])
    ballast = [True, False, None] * (4 * n)  # no count can reach zero while this one counts
    src, sink, label = Source(), Sink(), QLabel()
    src.received.connect(sink.on)
    src.received.emit("warm", {})  # first-call caches out of the count
    label.setText("warm")
    before = counts()
    for _ in range(n):
        src.received.emit("hardware.sample", {"gpu": None})
    emitted = counts()
    for i in range(n):
        label.setText(str(i & 7))
    after = counts()
    print(json.dumps({
        "seen": sink.seen,
        "emit": [a - b for a, b in zip(emitted, before)],
        "void": [a - b for a, b in zip(after, emitted)],
    }), flush=True)
    os._exit(0)  # a leaky binding would abort in finalization; the figures are already out
    """
)


@pytest.mark.qt
def test_the_binding_keeps_reference_counts() -> None:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(CALLS)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, f"the probe failed ({done.returncode}): {done.stderr[-2000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["seen"] == CALLS + 1
    # a stray reference or two may come and go; one lost per call is thousands
    for what in ("emit", "void"):
        drift = result[what]
        assert all(abs(d) < CALLS // 10 for d in drift), f"{what}: True/False/None counts moved by {drift}"
