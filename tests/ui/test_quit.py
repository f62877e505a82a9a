"""Quit is deterministic (issue 20, defect 2): opened and quit repeatedly in one process under
PYTHONDEVMODE and faulthandler, every Qt object we made is gone after each quit and the process exits 0
with no fatal error during finalization."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("qasync")

from tests.conftest import REPO, link_models

CYCLES = 2


def test_quit_leaves_no_qt_object_and_exits_cleanly(tmp_path: Path, model_store: Path) -> None:
    models = link_models(tmp_path / "models", model_store / "tiny.gguf")
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONDEVMODE": "1", "PYTHONFAULTHANDLER": "1"}
    out = subprocess.run(
        [
            sys.executable,
            "-X",
            "dev",
            "-X",
            "faulthandler",
            "-m",
            "tests.support.desktop_quit_cycles",
            str(CYCLES),
            str(models),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Fatal Python error" not in out.stderr, out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    results = json.loads(line.removeprefix("RESULT "))
    assert len(results) == CYCLES
    for r in results:
        assert r["window_deleted"] and r["left"] == [], r
        # 30,000 events a cycle through the window's bridge left True's count where it was
        assert abs(r["true_drift"]) < 1000, r
