"""Exclusive locks on an open file: `fcntl.flock` on POSIX, `msvcrt.locking` on the first byte on Windows.

Both are taken on a descriptor, so two descriptors of one file exclude each other even within one
process (two threads each opening the lock file). Neither is reentrant.
"""

from __future__ import annotations

import os
import sys
import time

# msvcrt's blocking mode gives up after about 10 s; a holder keeps our locks for milliseconds to minutes
# (a download), so waiting is a loop of non-blocking tries
_WIN_RETRY_S = 0.05


def lock(fd: int, *, wait: bool = True) -> None:
    """Take the exclusive lock of `fd`; with wait=False raise BlockingIOError when another holds it."""
    if sys.platform == "win32":
        import msvcrt

        while True:
            os.lseek(fd, 0, os.SEEK_SET)  # msvcrt locks from the current position
            try:
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
                return
            except OSError as exc:
                if not wait:
                    raise BlockingIOError(exc.errno, "the file is locked by another process") from exc
            time.sleep(_WIN_RETRY_S)
    else:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)


def unlock(fd: int) -> None:
    """Release the lock `lock` took on `fd` (closing the descriptor releases it too)."""
    if sys.platform == "win32":
        import msvcrt

        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
    else:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_UN)
