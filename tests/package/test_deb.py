"""The Linux .deb (installers/linux/build-deb.sh): built from the bundle, installed with dpkg on this
(throwaway CI) machine, run from /usr/bin, removed, and its files checked gone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import wait_gone
from tests.support.package_bundle import REPO, Program, clean_env, ensure_bundle, wait_no_processes

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
INSTALLED = [
    Path("/opt/switchyard/switchyard"),
    Path("/usr/bin/switchyard"),
    Path("/usr/share/applications/switchyard.desktop"),
    Path("/usr/share/icons/hicolor/256x256/apps/switchyard.png"),
    Path("/usr/share/icons/hicolor/scalable/apps/switchyard.svg"),
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb (Debian/Ubuntu)"),
    pytest.mark.skipif(
        os.geteuid() != 0, reason="dpkg -i needs root (CI runs as root on a throwaway machine)"
    ),
]


def _dpkg_status() -> str:
    r = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", "switchyard"], capture_output=True, text=True, timeout=30
    )
    return r.stdout.strip() if r.returncode == 0 else ""


@pytest.mark.timeout(900)
def test_deb_installs_runs_from_usr_bin_and_removes_cleanly(tmp_path: Path) -> None:
    if "installed" in _dpkg_status().split():
        pytest.skip("a switchyard package is already installed on this machine: not touching it")
    ensure_bundle()
    deb = tmp_path / "switchyard.deb"
    r = subprocess.run(
        [str(REPO / "installers" / "linux" / "build-deb.sh")],
        env={**os.environ, "DEB_OUT": str(deb), "DEB_COMPRESS": "zstd"},  # zstd: seconds, not minutes
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    fields = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, timeout=60).stdout
    assert f"Version: {VERSION}" in fields and "Package: switchyard" in fields
    try:
        r = subprocess.run(["dpkg", "-i", str(deb)], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        assert _dpkg_status() == "install ok installed"
        for path in INSTALLED:
            assert path.exists(), path
        assert os.readlink("/usr/bin/switchyard") == "/opt/switchyard/switchyard"
        desktop = Path("/usr/share/applications/switchyard.desktop").read_text()
        assert "Exec=switchyard gui" in desktop and "Icon=switchyard" in desktop

        env = clean_env(tmp_path)
        r = subprocess.run(
            ["env", "-i", *(f"{k}={v}" for k, v in env.items()), "switchyard", "--version"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.stdout.strip() == f"switchyard {VERSION}", r.stderr
        prog = Program(["switchyard", "serve", "--port", "0"], env, cwd=tmp_path)  # found on PATH
        try:
            url = prog.wait_listening()
            with urllib.request.urlopen(url + "/api/version", timeout=30) as resp:
                assert json.loads(resp.read())["version"] == VERSION
        finally:
            assert prog.stop() == 0, prog.log()
        assert wait_gone([prog.proc.pid], 15) == []
        assert wait_no_processes(tmp_path) == []
    finally:
        removed = subprocess.run(["dpkg", "-r", "switchyard"], capture_output=True, text=True, timeout=600)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    # dpkg -r keeps a package that has maintainer scripts as "config-files" until it is purged
    assert _dpkg_status() in ("deinstall ok config-files", "unknown ok not-installed"), _dpkg_status()
    for path in INSTALLED:
        assert not path.exists() and not path.is_symlink(), f"{path} left after dpkg -r"
    assert not Path("/opt/switchyard").exists()
    purged = subprocess.run(["dpkg", "--purge", "switchyard"], capture_output=True, text=True, timeout=120)
    assert purged.returncode == 0, purged.stderr
    assert _dpkg_status() in ("", "unknown ok not-installed")
