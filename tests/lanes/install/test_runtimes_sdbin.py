"""sd-server from stable-diffusion.cpp's pinned release (runtime `bin`) against the local releases host: the
asset in upstream layout (a stand-in sd-server inside), downloaded by `--pull-only` only when a library model
runs on the sd.cpp lane, verified (a tampered asset refused and removed), cached, the offline error, the
order (sd_server_path, then bin and path as the runtime setting orders them), and a real `serve` that
generates images through the release's sd-server with the official openai client."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from PIL import Image

from app.core.errors import EngineInstallError, EngineUnavailableError
from app.core.paths import Paths
from app.core.settings import Settings
from app.lanes.engines.plan import StartContext
from app.lanes.engines.sdcpp import SDCppKind, locate_sd_server, sd_install
from app.lanes.install.releases import ReleaseFetcher, load_releases
from app.lanes.install.runtimes import pull_only, sd_key
from app.library.model import ModelEntry
from tests.conftest import running_server
from tests.lanes.install.test_runtimes_build import H200, XEON
from tests.support.modelgen import write_diffusers
from tests.support.release_host import ReleaseHost, sd_zip_asset, zip_asset

SPEC = load_releases()["sd-server"]
LLAMA = load_releases()["llama-server"]
KEY = "linux-x86_64-cpu"
STANDIN_VERSION = "stable-diffusion.cpp version standin-1, commit 0000000"


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> Iterator[ReleaseHost]:
    with ReleaseHost() as h:
        monkeypatch.setenv("SWITCHYARD_RELEASES_API", h.url)
        yield h


@pytest.fixture
def image_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no sd-server on PATH unless a test puts one
    models = tmp_path / "models"
    write_diffusers(models / "sd15")
    return models


def fake_binary(folder: Path, *, version: str) -> Path:
    """An sd-server that only answers `--version`: enough to tell which one was found."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "sd-server"
    exe.write_text(f"#!{sys.executable}\nprint({version!r})\n")
    exe.chmod(0o755)
    return exe


def sd_hits(host: ReleaseHost) -> list[str]:
    return [h for h in host.hits if SPEC.repo in h]


def release_folder() -> Path:
    return Paths.from_env().home / "engines" / "sd-server-bin"


def sd_entry(models: Path) -> ModelEntry:
    return ModelEntry("sd15", models / "sd15", None, None, format="diffusers", kind_name="image")


def test_pull_only_downloads_verifies_and_unpacks_sd_server_then_the_lane_runs_it(
    host: ReleaseHost, image_models: Path
) -> None:
    digest = host.publish(SPEC.repo, SPEC.tag, SPEC.assets[KEY].name, sd_zip_asset())
    host.publish(LLAMA.repo, LLAMA.tag, LLAMA.assets[KEY].name, zip_asset())
    settings = Settings.flat(models_dirs=(image_models,), runtime="bin")
    before = sd_install(settings, XEON)
    assert not before.installed and "is not downloaded: run `switchyard serve --pull-only`" in before.note
    lines = pull_only(settings, XEON)
    assert LLAMA.tag in lines[0]  # llama.cpp's release, as before, and sd-server's with it
    assert SPEC.tag in lines[1] and "sd15" in lines[1] and digest[:12] in lines[1]
    binary = release_folder() / SPEC.tag / KEY / "sd-server"
    assert os.access(binary, os.X_OK) and (binary.parent / "libstable-diffusion.so").is_file()
    got = sd_install(settings, XEON)
    assert got.installed and got.version == f"{STANDIN_VERSION} at {binary}"
    assert got.note == f"runtime bin: release {SPEC.tag}, asset {SPEC.assets[KEY].name}"
    plan = SDCppKind().build(sd_entry(image_models), settings, StartContext(ppid=1, port=5100, hardware=XEON))
    assert plan.argv[5] == str(binary) and plan.runtime == "bin"
    assert plan.env["LD_LIBRARY_PATH"].split(os.pathsep)[0] == str(binary.parent)  # its libraries
    # a second pull, even offline, uses what is there: no request at all
    asked = len(sd_hits(host))
    again = pull_only(Settings.flat(models_dirs=(image_models,), runtime="bin", offline=True), XEON)
    assert str(binary) in again[1] and len(sd_hits(host)) == asked


def test_a_tampered_asset_is_refused_and_removed(host: ReleaseHost, image_models: Path) -> None:
    host.publish(SPEC.repo, SPEC.tag, SPEC.assets[KEY].name, sd_zip_asset(), digest="sha256:" + "0" * 64)
    settings = Settings.flat(models_dirs=(image_models,), runtime="xllamacpp")  # no llama.cpp release to pull
    with pytest.raises(EngineInstallError, match="refused and removed"):
        pull_only(settings, XEON)
    assert sd_hits(host)[-1].endswith(SPEC.assets[KEY].name)  # it was downloaded, then thrown away
    assert not (release_folder() / SPEC.tag).exists()
    assert list((release_folder() / ".downloads").iterdir()) == []
    assert not sd_install(settings, XEON).installed


def test_offline_says_what_to_do(host: ReleaseHost, image_models: Path) -> None:
    settings = Settings.flat(models_dirs=(image_models,), runtime="xllamacpp", offline=True)
    with pytest.raises(
        EngineUnavailableError, match=r"offline; go online once and run `switchyard serve --pull-only`"
    ):
        pull_only(settings, XEON)
    assert sd_hits(host) == []
    note = sd_install(settings, XEON).note
    offline = f"stable-diffusion.cpp {SPEC.tag} ({KEY}) is not downloaded; offline"
    assert f"{offline}: run `switchyard serve --pull-only`" in note
    assert "no executable sd-server was found on PATH" in note
    with pytest.raises(EngineUnavailableError, match="is not downloaded; offline"):
        SDCppKind().build(sd_entry(image_models), settings, StartContext(ppid=1, port=1, hardware=XEON))


def test_nothing_is_pulled_when_no_model_needs_it(host: ReleaseHost, tmp_path: Path) -> None:
    empty = tmp_path / "chat-only"
    empty.mkdir()
    lines = pull_only(Settings.flat(models_dirs=(empty,), runtime="xllamacpp"), XEON)
    assert lines[1] == "sd-server: no model in the library runs on stable-diffusion.cpp: nothing to pull"
    models = tmp_path / "models"
    write_diffusers(models / "sd15")
    chosen = Settings.flat(models_dirs=(models,), runtime="xllamacpp", sd_server_path="/opt/sd/sd-server")
    assert "sd_server_path is set" in pull_only(chosen, XEON)[1]
    assert sd_hits(host) == []


def test_the_order_configured_then_bin_and_path_as_the_setting_says(
    host: ReleaseHost, image_models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host.publish(SPEC.repo, SPEC.tag, SPEC.assets[KEY].name, sd_zip_asset())
    release = ReleaseFetcher(release_folder().parent).fetch(SPEC, key=KEY).binary
    on_path = fake_binary(tmp_path / "bin", version="sd-server on PATH, version 9")
    mine = fake_binary(tmp_path / "mine", version="my own sd-server, version 1")
    monkeypatch.setenv("PATH", str(on_path.parent))

    def found(**kw: object) -> tuple[str | None, str | None]:
        got = locate_sd_server(Settings.flat(**kw), XEON)  # type: ignore[arg-type]
        return got.binary, got.runtime

    assert found() == (str(release), "bin")  # auto: the release before PATH
    assert found(runtime="bin") == (str(release), "bin")
    assert found(runtime="path") == (str(on_path), "path")
    assert found(runtime_order="path,bin") == (str(on_path), "path")
    assert found(runtime="docker") == (str(release), "bin")  # llama.cpp's alone: sd.cpp looks in both
    assert found(sd_server_path=str(mine)) == (str(mine), "configured")  # chosen by the user: it wins
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert found(runtime="path") == (None, None)
    note = sd_install(Settings.flat(runtime="path"), XEON).note
    assert note.startswith("no executable sd-server was found on PATH: run `switchyard serve --pull-only`")
    # a CUDA machine on Linux: upstream ships no such sd-server, so the CPU build of the same system
    key, why = sd_key(H200)
    assert key == KEY and "ships no cuda13 build here: the CPU build" in why
    assert locate_sd_server(Settings(), H200).binary == str(release)


def test_serve_pull_only_then_images_from_the_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`serve --pull-only` fetches sd-server because a diffusers model is in the library; a real `serve` then
    answers an images request through the release's sd-server, under the lane's guard."""
    monkeypatch.setenv("PATH", os.defpath)  # no sd-server anywhere but the release
    home, models = tmp_path / "home", tmp_path / "models"
    write_diffusers(models / "sd15")
    with ReleaseHost() as host:
        host.publish(SPEC.repo, SPEC.tag, SPEC.assets[KEY].name, sd_zip_asset())
        host.publish(LLAMA.repo, LLAMA.tag, LLAMA.assets[KEY].name, zip_asset())
        env = dict(os.environ, SWITCHYARD_RELEASES_API=host.url, SWITCHYARD_HOME=str(home))
        r = subprocess.run(
            [sys.executable, "-m", "app", "serve", "--pull-only", "--models-dir", str(models)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert r.returncode == 0, r.stderr
    assert f"stable-diffusion.cpp {SPEC.tag}" in r.stdout and "sd15" in r.stdout
    with running_server(home, models) as server:
        client = openai.OpenAI(base_url=server.api, api_key="none")
        got = client.images.generate(
            model="sd15", prompt="a red fox", size="256x256", response_format="b64_json"
        )
        assert got.data and got.data[0].b64_json
        picture = Image.open(io.BytesIO(base64.b64decode(got.data[0].b64_json)))
        assert (picture.format, picture.size) == ("PNG", (256, 256))
        with urllib.request.urlopen(f"{server.url}/api/lanes/sd15") as resp:
            lane = json.loads(resp.read())
        assert lane["runtime"] == "bin" and lane["state"] == "ready", lane
        log = (home / "logs" / "lanes" / "sd15.log").read_text()
        argv = json.loads(log.split("sd standin argv: ", 1)[1].splitlines()[0])
        assert argv[argv.index("--model") + 1] == str(models / "sd15")
        assert argv[argv.index("--listen-ip") + 1] == "127.0.0.1"
