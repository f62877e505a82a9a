"""A small real filesystem (tmpfs) for disk-full tests: mounted where the test asks, unmounted after."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` ("4m") at `path`; the test is skipped where mounting is not allowed (not root)."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.decode().strip()}); disk-full untested")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path, *, leave: int) -> Path:
    """Fill the filesystem holding `path` until `leave` bytes are free (someone else's file)."""
    import os

    st = os.statvfs(path)
    filler = path / "filler"
    filler.write_bytes(b"\0" * max(st.f_bavail * st.f_frsize - leave, 0))
    return filler
