"""The `bin` runtime's llama.cpp for Windows, as Windows code (checks/engine_checks.py): the manifest's
Windows zip, laid out as upstream packs it (build/bin/llama-server.exe), served by a local stand-in of
GitHub's releases API, fetched, verified, unpacked and run. The .exe is a stand-in built here with
mingw-w64 that answers --version: no model runs in it (the real one is 30 MB and needs the network)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from app.lanes.install.releases import load_releases
from tests.support.release_host import ReleaseHost, zip_asset
from tests.windows.conftest import judge
from tests.windows.wine import Result, WinePython

pytestmark = pytest.mark.timeout(400)

STANDIN_EXE = r"""
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--version") == 0) {
        printf("version: 9999 (standin)\nbuilt with mingw-w64 for x86_64-w64-mingw32\n");
        return 0;
    }
    fprintf(stderr, "a stand-in llama-server: only --version\n");
    return 2;
}
"""


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReleaseHost]:
    work = tmp_path_factory.mktemp("windows release")
    (work / "standin.c").write_text(STANDIN_EXE)
    exe = work / "llama-server.exe"
    subprocess.run(
        ["x86_64-w64-mingw32-gcc", "-O2", "-o", str(exe), str(work / "standin.c")], check=True, timeout=120
    )
    spec = load_releases()["llama-server"]
    pin = spec.asset("windows-x86_64-cpu")
    assert pin is not None
    with ReleaseHost() as h:
        h.publish(spec.repo, spec.tag, pin.name, zip_asset("llama-server.exe", script=exe.read_bytes()))
        yield h


@pytest.fixture(scope="module")
def results(wine: WinePython, host: ReleaseHost) -> Result:
    return wine.run("engine_checks.py", env={"SWITCHYARD_RELEASES_API": host.url}, timeout=300)


def test_the_windows_llama_cpp_release(results: Result, host: ReleaseHost) -> None:
    assert results.returncode == 0, results.tail()
    judge(results, "the_windows_release_is_fetched_unpacked_and_runs")
    downloads = [hit for hit in host.hits if hit.endswith(".zip")]
    assert len(downloads) == 1, host.hits  # once; the second fetch came from the cache
