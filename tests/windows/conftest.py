"""The Windows tier: this checkout's code run as Windows code under wine (tests/windows/wine.py).

`make test` runs it with the rest (so CI does); `make test-windows` runs it alone. A machine where the
wine environment cannot be made fails here with the setup's output: the tier is never skipped silently.
"""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.windows.wine import CHECKS, Result, WinePython


@pytest.fixture(scope="session")
def wine() -> Iterator[WinePython]:
    try:
        wine = WinePython.setup()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"the Windows tier needs wine and the Windows Python (scripts/wine-setup.sh): {exc}")
    keeper = wine.keeper()
    try:
        yield wine
    finally:
        keeper.stdin.close()  # type: ignore[union-attr]
        try:
            keeper.wait(timeout=30)
        except subprocess.TimeoutExpired:
            keeper.kill()
            keeper.wait()


def check_names(script: str) -> list[str]:
    """The functions a check script registers with @check, read without running it (collection time)."""
    tree = ast.parse((CHECKS / script).read_text(encoding="utf-8"))
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and any(isinstance(d, ast.Name) and d.id == "check" for d in node.decorator_list)
    ]


def judge(result: Result, name: str) -> None:
    """Pass, fail with the check's own error, or xfail with wine's reason for a limit that is wine's."""
    line = result.by_check().get(name)
    if line is None:
        pytest.fail(f"the Windows check {name} reported nothing\n{result.tail()}")
    if line.get("ok"):
        return
    if "wine" in line:
        pytest.xfail(f"wine, not Windows: {line['wine']}")
    pytest.fail(f"{name} failed under Windows: {line.get('error')}\n{line.get('trace', '')}")


def home_for(tmp: Path) -> Path:
    home = tmp / "Switchyard home with spaces"
    home.mkdir(parents=True, exist_ok=True)
    return home
