"""core/platform, the state files and their locks, an engine's process tree and the hardware probe, run
as Windows code (checks/platform_checks.py: one python.exe for all of them)."""

from __future__ import annotations

import pytest

from tests.windows.conftest import check_names, judge
from tests.windows.wine import Result, WinePython

pytestmark = pytest.mark.timeout(400)  # the module's one python.exe run, on a loaded machine

NAMES = check_names("platform_checks.py")


@pytest.fixture(scope="module")
def results(wine: WinePython) -> Result:
    return wine.run("platform_checks.py", timeout=300)


def test_every_check_ran(results: Result) -> None:
    assert results.returncode == 0, results.tail()
    assert sorted(results.by_check()) == sorted(NAMES), results.tail()


@pytest.mark.parametrize("name", NAMES)
def test_windows(results: Result, name: str) -> None:
    judge(results, name)
