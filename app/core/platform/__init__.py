"""Everything that differs between Linux, macOS and Windows, in one place (docs/install.md says what is
proven where). The rest of app/ calls these modules and never names a POSIX-only or Windows-only API
itself; nothing here touches one at import time, so every module of app/ imports on every OS
(tests/windows/ imports all of them under the Windows CPython in wine).

Standard library only: engine workers import this from inside an engine's own environment.

  procs    spawning an engine in a group of its own, stopping and killing that group, whether a pid lives
  jobs     Windows Job Objects: an engine's process tree, killed when the server's handle closes
  parent   dying with the server: Linux's parent-death signal, /proc, kqueue-free polling on macOS, and a
           process handle on Windows
  signals  the signals that end a process cleanly, and handlers for them on an asyncio loop
  locks    exclusive file locks (fcntl.flock / msvcrt.locking)
  files    atomic replacement (retried while Windows holds the old file open), folder fsync
  ports    who holds a listening port
  stopped  whether an engine's process tree is stopped (its own /proc entries on Linux, psutil elsewhere)
  home     where the data lives per OS (%LOCALAPPDATA%\\Switchyard, ~/Library/Application Support, XDG)
"""

from __future__ import annotations

import sys

WINDOWS = sys.platform == "win32"
MACOS = sys.platform == "darwin"
LINUX = sys.platform.startswith("linux")
