"""Run under the Windows CPython (tests/windows/test_wine_engines.py): the `bin` runtime's llama.cpp
release for Windows, fetched as Windows code from a local stand-in of GitHub's releases API.

Usage: engine_checks.py ROOT (the engines folder); SWITCHYARD_RELEASES_API names the stand-in. One JSON line
per check, as in platform_checks.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import traceback
from pathlib import Path


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


CHECKS = [the_windows_release_is_fetched_unpacked_and_runs]


def main() -> int:
    root = Path(sys.argv[1])
    for fn in CHECKS:
        started = time.monotonic()
        try:
            line: dict[str, object] = {"check": fn.__name__, "ok": True, "detail": fn(root)}
        except BaseException as exc:
            line = {
                "check": fn.__name__,
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}",
                "trace": traceback.format_exc()[-2000:],
            }
        line["seconds"] = round(time.monotonic() - started, 2)
        print(json.dumps(line, default=str), flush=True)
    print(json.dumps({"done": True}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
