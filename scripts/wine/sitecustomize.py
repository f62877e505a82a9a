"""Installed only into the Windows test Python under wine (scripts/wine-setup.sh), never shipped.

wine 8.0 lacks KERNEL32.CopyFile2, and Python 3.12's shutil.copy2 calls it whenever `_winapi` has it:
the process aborts. Without the attribute shutil takes its portable path (copyfile + copystat), which is
what it does on every Windows before 8 too.
"""

import sys

if sys.platform == "win32":
    import _winapi

    if hasattr(_winapi, "CopyFile2"):
        del _winapi.CopyFile2
