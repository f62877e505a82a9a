"""Atomic replacement of a file, and making a rename durable.

On Windows `os.replace` fails with a sharing violation (PermissionError) while another process has the
target open without FILE_SHARE_DELETE: a reader (the window reading settings.json), an antivirus scan, the
search indexer. Those holds last milliseconds, so the replace is retried for a while before it fails.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

REPLACE_TRIES_S = 5.0  # how long a Windows replace keeps trying before the sharing violation is raised
_STEP_S = 0.02


def replace(src: str | Path, dst: str | Path, *, patience_s: float = REPLACE_TRIES_S) -> None:
    """os.replace(src, dst), retried on Windows while the target is held open elsewhere."""
    if sys.platform != "win32":
        os.replace(src, dst)
        return
    deadline = time.monotonic() + patience_s
    while True:
        try:
            os.replace(src, dst)
            return
        except PermissionError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(_STEP_S)


def fsync_dir(folder: Path) -> None:
    """Make a rename or unlink in `folder` durable. A no-op on Windows, which cannot open a folder for
    fsync (NTFS journals the rename itself)."""
    if sys.platform == "win32":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
