"""Pinned llama.cpp releases against a local releases host: download, sha256 verification (a tampered
asset is refused and removed), unpacking both upstream layouts, caching, offline, `latest`, and
`--pull-only`'s function."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.errors import EngineInstallError, EngineUnavailableError
from app.core.settings import Settings
from app.lanes.install.releases import AssetPin, ReleaseFetcher, ReleaseSpec, load_releases
from app.lanes.install.runtimes import choose_runtime, pull_only
from tests.lanes.install.test_runtimes_build import XEON
from tests.support.release_host import ReleaseHost, tar_asset, zip_asset

REPO = "ggml-org/llama.cpp"
KEY = "linux-x86_64-cpu"


@pytest.fixture(scope="module")
def host() -> Iterator[ReleaseHost]:
    with ReleaseHost() as h:
        yield h


def spec(tag: str, name: str, sha256: str = "") -> ReleaseSpec:
    return ReleaseSpec("llama-server", REPO, tag, {KEY: AssetPin(name, sha256)})


def test_download_verify_unpack_and_cache(host: ReleaseHost, tmp_path: Path) -> None:
    name = "llama-b100-bin-ubuntu-x64.zip"
    digest = host.publish(REPO, "b100", name, zip_asset())
    f = ReleaseFetcher(tmp_path, api=host.url)
    got = f.fetch(spec("b100", name, digest), key=KEY)
    assert got.binary == tmp_path / "llama-server-bin" / "b100" / KEY / "build" / "bin" / "llama-server"
    assert os.access(got.binary, os.X_OK) and got.sha256 == digest
    assert (got.binary.parent / "libggml-base.so").is_file()  # the libraries beside it
    before = len(host.hits)
    again = ReleaseFetcher(tmp_path, api=host.url, offline=True).fetch(spec("b100", name, digest), key=KEY)
    assert again == got and len(host.hits) == before  # cached: no request at all, offline or not


def test_tampered_asset_is_refused_and_removed(host: ReleaseHost, tmp_path: Path) -> None:
    name = "llama-b101-bin-ubuntu-x64.zip"
    host.publish(REPO, "b101", name, zip_asset(), digest="sha256:" + "0" * 64)
    f = ReleaseFetcher(tmp_path, api=host.url)
    with pytest.raises(EngineInstallError, match="refused and removed"):
        f.fetch(spec("b101", name), key=KEY)
    assert not (tmp_path / "llama-server-bin" / "b101").exists()
    assert list((tmp_path / "llama-server-bin" / ".downloads").iterdir()) == []
    # the manifest's own pin wins over a digest the host publishes
    real = host.publish(REPO, "b102", "llama-b102-bin-ubuntu-x64.zip", zip_asset())
    with pytest.raises(EngineInstallError, match="expected " + "f" * 64):
        f.fetch(spec("b102", "llama-b102-bin-ubuntu-x64.zip", "f" * 64), key=KEY)
    assert f.fetch(spec("b102", "llama-b102-bin-ubuntu-x64.zip", real), key=KEY).sha256 == real


def test_no_digest_anywhere_is_refused(host: ReleaseHost, tmp_path: Path) -> None:
    host.publish(REPO, "b103", "llama-b103-bin-ubuntu-x64.zip", zip_asset(), digest=None)
    with pytest.raises(EngineInstallError, match="no published sha256"):
        ReleaseFetcher(tmp_path, api=host.url).fetch(spec("b103", "llama-b103-bin-ubuntu-x64.zip"), key=KEY)


def test_offline_and_unreachable_say_what_to_do(host: ReleaseHost, tmp_path: Path) -> None:
    before = len(host.hits)
    with pytest.raises(EngineUnavailableError, match=r"offline.*--pull-only"):
        ReleaseFetcher(tmp_path, api=host.url, offline=True).fetch(spec("b100", "x.zip"), key=KEY)
    assert len(host.hits) == before
    with pytest.raises(EngineUnavailableError, match="cannot reach the releases API"):
        ReleaseFetcher(tmp_path, api="http://127.0.0.1:9", timeout_s=2).fetch(spec("b100", "x.zip"), key=KEY)


def test_latest_is_resolved_through_the_api_and_tarballs_unpack(host: ReleaseHost, tmp_path: Path) -> None:
    host.publish(REPO, "b200", "llama-b200-bin-ubuntu-x64.tar.gz", tar_asset(top="llama-b200"), latest=True)
    pinned = spec("b100", "llama-b100-bin-ubuntu-x64.tar.gz", "e" * 64)  # another tag's pin is not used
    f = ReleaseFetcher(tmp_path, api=host.url)
    got = f.fetch(pinned, key=KEY, tag="latest")
    assert got.tag == "b200" and got.binary.relative_to(tmp_path).parts[-2:] == ("llama-b200", "llama-server")
    assert f.newest_cached(pinned, key=KEY) == got


def test_an_archive_that_climbs_out_is_refused(host: ReleaseHost, tmp_path: Path) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("../../evil/llama-server", b"#!/bin/sh\n")
    host.publish(REPO, "b104", "llama-b104-bin-ubuntu-x64.zip", buf.getvalue())
    with pytest.raises(EngineInstallError, match="outside its own folder"):
        ReleaseFetcher(tmp_path, api=host.url).fetch(spec("b104", "llama-b104-bin-ubuntu-x64.zip"), key=KEY)
    assert not (tmp_path.parent / "evil").exists()


def test_pull_only_fetches_the_manifest_pin_then_bin_is_chosen(
    host: ReleaseHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pin = load_releases()["llama-server"]
    name = pin.assets[KEY].name
    host.publish(REPO, pin.tag, name, zip_asset())
    monkeypatch.setenv("SWITCHYARD_RELEASES_API", host.url)
    settings = Settings.flat(runtime="bin")
    assert choose_runtime(settings, XEON).runtime is None  # not downloaded yet: a start would refuse
    lines = pull_only(settings, XEON)
    assert pin.tag in lines[0] and KEY in lines[0]
    choice = choose_runtime(settings, XEON)
    assert choice.runtime == "bin" and choice.build == "cpu" and choice.binary is not None
    assert Path(choice.binary).is_file()
    assert "nothing to pull" in pull_only(Settings.flat(runtime="xllamacpp"), XEON)[0]


def test_a_failed_update_leaves_the_release_in_use(host: ReleaseHost, tmp_path: Path) -> None:
    name = "llama-b300-bin-ubuntu-x64.zip"
    pinned = spec("b300", name, host.publish(REPO, "b300", name, zip_asset()))
    f = ReleaseFetcher(tmp_path, api=host.url)
    first = f.fetch(pinned, key=KEY)
    host.publish(
        "ggml-org/llama.cpp", "b301", "llama-b301-bin-ubuntu-x64.zip", b"junk", digest="sha256:" + "1" * 64
    )
    host.latest[REPO] = "b301"
    with pytest.raises(EngineInstallError):
        f.fetch(pinned, key=KEY, tag="latest")
    assert f.cached(pinned, key=KEY) == first and f.newest_cached(pinned, key=KEY) == first
    host.latest[REPO] = "b200"  # as the earlier test left it


def test_serve_pull_only_and_doctor_from_the_command_line(
    host: ReleaseHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`serve --pull-only` fetches what runtime bin needs and exits; `doctor` then lists bin as chosen."""
    pin = load_releases()["llama-server"]
    host.publish(REPO, pin.tag, pin.assets[KEY].name, zip_asset())
    env = dict(os.environ, SWITCHYARD_RELEASES_API=host.url)
    cmd = [sys.executable, "-m", "app"]
    r = subprocess.run(
        [*cmd, "serve", "--pull-only", "--runtime", "bin"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert pin.tag in r.stdout
    (Path(env["SWITCHYARD_HOME"]) / "settings.json").write_text(json.dumps({"runtime": "bin"}))
    r = subprocess.run([*cmd, "doctor", "--json"], env=env, capture_output=True, text=True, timeout=120)
    rows = {row["runtime"]: row for row in json.loads(r.stdout)["runtimes"]}
    assert rows["bin"]["state"] == "chosen", rows
