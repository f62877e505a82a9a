"""Run under the Windows CPython (tests/windows/test_wine_engines.py): the `bin` runtime's llama.cpp
release for Windows, fetched as Windows code from a local stand-in of GitHub's releases API.

Usage: engine_checks.py [CHECK...]; SWITCHYARD_RELEASES_API names the stand-in; each check's engines folder is
a new one under a path with spaces. One JSON line per check (checks/runner.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.windows.checks.runner import Checks

CHECKS = Checks()
check = CHECKS.add


@check
def the_windows_release_is_fetched_unpacked_and_runs(root: Path) -> object:
    """This machine's key (windows-x86_64-cpu) picks the manifest's Windows zip; its sha256 is checked, it
    is unpacked under the engines folder, the .exe is found in upstream's build\\bin and runs."""
    from app.hardware.probe import probe
    from app.lanes.install.releases import ReleaseFetcher, load_releases, platform_key

    hardware = probe()
    key = platform_key(hardware.os, hardware.arch, "cpu")
    assert key == "windows-x86_64-cpu", key
    spec = load_releases()["llama-server"]
    pin = spec.asset(key)
    assert pin is not None and pin.name.endswith("-bin-win-cpu-x64.zip"), pin
    installed = ReleaseFetcher(root).fetch(spec, key=key)
    assert installed.binary.name == "llama-server.exe", installed.binary
    assert installed.binary.is_file() and installed.binary.parent.name == "bin", installed.binary
    done = subprocess.run(
        [str(installed.binary), "--version"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "standin" in done.stdout + done.stderr, (done.returncode, done.stdout)
    again = ReleaseFetcher(root, offline=True).fetch(spec, key=key)  # cached: no network needed now
    assert again.binary == installed.binary
    return {"key": key, "asset": pin.name, "binary": str(installed.binary), "version": done.stdout.strip()}


def main() -> int:
    return CHECKS.run(prefix="sy win engines ", wanted=set(sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
