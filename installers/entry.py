"""The frozen program's entry point (build.spec). Worker processes are answered first, before the
command line's heavy imports, so a lane starts as quickly from the bundle as from `python -m`."""

from __future__ import annotations

import sys


def _main() -> int:
    from app.core.frozen import MODULE_COMMAND, run_module

    if len(sys.argv) > 1 and sys.argv[1] == MODULE_COMMAND:
        return run_module(sys.argv[2:])
    from app.__main__ import main

    return main()


if __name__ == "__main__":
    raise SystemExit(_main())
