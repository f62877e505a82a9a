"""The stable-diffusion.cpp lane without sd-server (nothing here can build or run it): install detection with
a stand-in executable that only prints a version, the command line for each model form, the refusals, the
OpenAI <-> sd-server images translation, the catalog's diffusion models, and the capability 400s through a
real server."""

from __future__ import annotations

import base64
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest

from app.advice.explain import entry_for_path, explain
from app.advice.inputs import AdviceInputs
from app.core.errors import BadRequestError, EngineUnavailableError, ModelBrokenError
from app.core.settings import Settings, settings_from_mapping
from app.hardware.probe import probe
from app.lanes.engines.plan import StartContext
from app.lanes.engines.registry import choose_kind, engine_kinds
from app.lanes.engines.sdcpp import SDCppKind, sd_install
from app.lanes.install.installed import installed_lanes, lane_report
from app.library.catalog import Catalog
from app.library.model import ModelEntry
from app.server.surfaces.openai.images_engine import from_sdcpp, parse_image_request, to_sdcpp
from tests.conftest import ServerProcess, link_models, running_server
from tests.support.modelgen import write_diffusers, write_diffusion_gguf

VERSION = "stable-diffusion.cpp version master-520-abc1234, commit abc1234"


def fake_binary(folder: Path, name: str = "sd-server", *, version: str = VERSION) -> Path:
    """An executable that answers `--version` like sd-server: a stand-in for detection only."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / name
    exe.write_text(f"#!{sys.executable}\nprint({version!r})\n")
    exe.chmod(0o755)
    return exe


def flag(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


def entry_for(path: Path, fmt: str) -> ModelEntry:
    return ModelEntry(path.stem, path, None, None, format=fmt, kind_name="image")


# ---- install detection -------------------------------------------------------------------------------
def test_sd_server_on_path_is_found_with_its_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = fake_binary(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ['PATH']}")
    got = sd_install(Settings())
    assert got.installed and got.version == f"{VERSION} at {exe}"


def test_configured_path_wins_and_must_be_executable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    exe = fake_binary(tmp_path / "opt", version="version 1.2.3")
    assert sd_install(Settings.flat(sd_server_path=str(exe))).version == f"version 1.2.3 at {exe}"
    exe.chmod(0o644)
    got = sd_install(Settings.flat(sd_server_path=str(exe)))
    assert not got.installed and f"no executable sd-server was found at {exe}" in got.note
    silent = fake_binary(tmp_path / "old", version="usage: sd-server [options]")  # no --version in old builds
    assert (
        sd_install(Settings.flat(sd_server_path=str(silent))).version
        == f"sd-server (version unknown) at {silent}"
    )


def test_refusals_say_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    kind = SDCppKind()
    why = kind.start_refusal(Settings(), None)
    assert why and "no executable sd-server was found on PATH" in why and "sd_server_path" in why
    pipe = tmp_path / "pipe"
    write_diffusers(pipe)
    with pytest.raises(EngineUnavailableError, match=r"stable-diffusion\.cpp: no executable sd-server"):
        kind.build(entry_for(pipe, "diffusers"), Settings(), StartContext(ppid=1, port=5000, hardware=None))
    cli = fake_binary(tmp_path / "cli", "sd")  # only the command-line tool: no HTTP server
    monkeypatch.setenv("PATH", str(cli.parent))
    assert "found sd (the command-line tool)" in str(kind.start_refusal(Settings(), None))


# ---- command lines -----------------------------------------------------------------------------------
def test_diffusers_folder_command_line(tmp_path: Path) -> None:
    exe = fake_binary(tmp_path / "bin")
    pipe = tmp_path / "sd15"
    write_diffusers(pipe)
    settings = Settings.flat(
        sd_server_path=str(exe), threads=3, sd_extra_args="--offload-to-cpu --diffusion-fa"
    )
    plan = SDCppKind().build(
        entry_for(pipe, "diffusers"), settings, StartContext(ppid=42, port=5123, hardware=None)
    )
    assert plan.argv[:5] == (sys.executable, "-m", "app.lanes.guard", "42", "--")  # dies with the server
    assert plan.argv[5] == str(exe) and flag(plan.argv, "--model") == str(pipe)
    assert flag(plan.argv, "--listen-ip") == "127.0.0.1" and flag(plan.argv, "--listen-port") == "5123"
    assert flag(plan.argv, "--threads") == "3" and plan.argv[-2:] == ("--offload-to-cpu", "--diffusion-fa")
    assert plan.port == 5123 and plan.health_path == "/v1/models" and plan.engine == "sd.cpp"
    assert plan.memory == "runtime-managed" and plan.predicted() is None  # no made-up estimate


def test_lone_diffusion_gguf_needs_its_vae_beside_it(tmp_path: Path) -> None:
    exe = fake_binary(tmp_path / "bin")
    model = write_diffusion_gguf(tmp_path / "flux" / "flux1-schnell-Q4_0.gguf", arch="flux").paths[0]
    settings = Settings.flat(sd_server_path=str(exe))
    with pytest.raises(ModelBrokenError, match="without its VAE and text encoders"):
        SDCppKind().build(
            entry_for(model, "gguf-diffusion"), settings, StartContext(ppid=1, port=1, hardware=None)
        )
    for name in ("ae.safetensors", "clip_l.safetensors", "t5xxl_fp16.safetensors", "notes.txt"):
        (model.parent / name).write_bytes(b"x")
    plan = SDCppKind().build(
        entry_for(model, "gguf-diffusion"), settings, StartContext(ppid=1, port=7, hardware=None)
    )
    assert flag(plan.argv, "--diffusion-model") == str(model) and "--model" not in plan.argv
    assert flag(plan.argv, "--vae") == str(model.parent / "ae.safetensors")
    assert flag(plan.argv, "--clip_l") == str(model.parent / "clip_l.safetensors")
    assert flag(plan.argv, "--t5xxl") == str(model.parent / "t5xxl_fp16.safetensors")


def test_full_checkpoint_gguf_is_loaded_whole(tmp_path: Path) -> None:
    path = tmp_path / "sd15-q8.gguf"
    w = gguf.GGUFWriter(str(path), "unused")
    del w.kv_data[0][gguf.Keys.General.ARCHITECTURE]  # sd.cpp's own conversions carry no architecture
    for name in ("model.diffusion_model.out.0.weight", "first_stage_model.decoder.conv_in.weight"):
        w.add_tensor(name, np.zeros((4, 4), dtype="float32"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    fmt = Catalog([tmp_path]).scan()[0]
    assert (fmt.format, fmt.kind, fmt.ok) == ("gguf-diffusion", "image", True)
    exe = fake_binary(tmp_path / "bin")
    plan = SDCppKind().build(
        fmt, Settings.flat(sd_server_path=str(exe)), StartContext(ppid=1, port=7, hardware=None)
    )
    assert flag(plan.argv, "--model") == str(path) and "--vae" not in plan.argv


def test_catalog_lists_diffusion_models_for_sd_cpp_not_llama_cpp(tmp_path: Path) -> None:
    write_diffusion_gguf(tmp_path / "flux-q4.gguf", arch="flux")
    write_diffusion_gguf(tmp_path / "noarch.gguf", arch=None)
    write_diffusers(tmp_path / "pipe")
    entries = {e.id: e for e in Catalog([tmp_path]).scan()}
    assert {k: (e.format, e.kind, e.ok) for k, e in entries.items()} == {
        "flux-q4": ("gguf-diffusion", "image", True),
        "noarch": ("gguf-diffusion", "image", True),
        "pipe": ("diffusers", "image", True),
    }
    kinds = engine_kinds()
    exe = fake_binary(tmp_path / "bin")
    chosen = choose_kind(
        entries["pipe"], Settings.flat(sd_server_path=str(exe)), kinds=kinds, hardware=None, pinned=None
    )
    assert chosen.lane == "sd.cpp" and chosen.capabilities(entries["pipe"]) == {"images"}


def test_doctor_and_installed_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    row = {r["lane"]: r for r in lane_report(Settings(), None)}["sd.cpp"]
    assert row["has_lane"] and not row["installed"] and not row["can_start"]
    assert row["capabilities"] == ["images"] and row["formats"] == ["diffusers", "gguf-diffusion"]
    assert row["memory"] == "runtime-managed" and "sd-server" in str(row["why_not"])
    exe = fake_binary(tmp_path / "bin")
    settings = settings_from_mapping({"sd_server_path": str(exe)})
    assert installed_lanes(settings)["sd.cpp"].installed
    assert {r["lane"]: r for r in lane_report(settings, None)}["sd.cpp"]["can_start"]


# ---- the images translation ------------------------------------------------------------------------
def test_openai_request_becomes_sd_servers_with_extras_in_the_prompt() -> None:
    req = parse_image_request(
        {
            "model": "m",
            "prompt": "a red fox",
            "n": 2,
            "size": "768x512",
            "response_format": "b64_json",
            "steps": 20,
            "cfg_scale": 6.5,
            "seed": 42,
            "negative_prompt": "blurry",
            "sampler": "euler_a",
        },
        model="m",
    )
    body = json.loads(to_sdcpp(req))
    assert body["n"] == 2 and body["size"] == "768x512" and body["output_format"] == "png"
    prompt, _, rest = body["prompt"].partition(" <sd_cpp_extra_args>")
    extras = json.loads(rest.removesuffix("</sd_cpp_extra_args>"))
    assert prompt == "a red fox"
    assert extras == {
        "seed": 42,
        "negative_prompt": "blurry",
        "sample_params": {"sample_steps": 20, "sample_method": "euler_a", "guidance": {"txt_cfg": 6.5}},
    }
    plain = json.loads(to_sdcpp(parse_image_request({"prompt": "a cat"}, model="m")))
    assert plain == {"prompt": "a cat", "n": 1, "output_format": "png"}  # nothing added when nothing asked


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": "x", "response_format": "url"}, "response_format"),
        ({"prompt": "x", "size": "big"}, "size"),
        ({"prompt": "x", "size": "16x16"}, "size"),
        ({"prompt": "x", "n": 0}, "n"),
        ({"prompt": "x", "steps": True}, "steps"),
        ({"prompt": "x", "cfg_scale": "7"}, "cfg_scale"),
        ({"prompt": "x <sd_cpp_extra_args>{}</sd_cpp_extra_args>", "seed": 1}, "prompt"),
    ],
)
def test_bad_image_requests_name_the_field(body: dict[str, object], param: str) -> None:
    with pytest.raises(BadRequestError) as exc:
        parse_image_request(body, model="m")
    assert exc.value.param == param


def test_sd_server_answers_and_errors_in_openai_shape() -> None:
    png = base64.b64encode(b"\x89PNG fake").decode()
    ok = from_sdcpp(
        200,
        json.dumps({"created": 5, "data": [{"b64_json": png}], "output_format": "png"}).encode(),
        model="m",
    )
    assert ok.status == 200 and json.loads(ok.body) == {
        "created": 5,
        "data": [{"b64_json": png}],
        "output_format": "png",
    }
    bad = from_sdcpp(400, b'{"error": "invalid sd_cpp_extra_args"}', model="m")
    err = json.loads(bad.body)["error"]
    assert bad.status == 400 and "invalid sd_cpp_extra_args" in err["message"] and err["source"] == "engine"
    boom = from_sdcpp(500, b'{"error": "server_error", "message": "out of memory"}', model="m")
    assert boom.status == 500 and "out of memory" in json.loads(boom.body)["error"]["message"]
    empty = from_sdcpp(200, b'{"created": 1}', model="m")
    assert empty.status == 502 and json.loads(empty.body)["error"]["code"] == "engine_bad_answer"


# ---- through a real server ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("sd")
    models = link_models(base / "models", model_store / "tiny.gguf")
    write_diffusers(models / "sd15")
    home = base / "home"
    home.mkdir()
    # a path that holds no sd-server: the lane is known, routed to, and says what to install
    (home / "settings.json").write_text(json.dumps({"sd_server_path": str(base / "no-sd-server")}))
    with running_server(home, models) as s:
        yield s


def post(server: ServerProcess, path: str, body: dict[str, object]) -> tuple[int, dict]:
    req = urllib.request.Request(
        server.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_capability_routing_both_ways(server: ServerProcess) -> None:
    status, body = post(
        server, "/v1/chat/completions", {"model": "sd15", "messages": [{"role": "user", "content": "hi"}]}
    )
    err = body["error"]
    assert status == 400 and err["code"] == "capability_missing"
    assert "runs on stable-diffusion.cpp, which cannot do chat" in err["message"] and "tiny" in err["message"]
    status, body = post(server, "/v1/images/generations", {"model": "tiny", "prompt": "a cat"})
    err = body["error"]
    assert status == 400 and err["code"] == "capability_missing"
    assert "cannot do images" in err["message"] and "stable-diffusion.cpp lane" in err["message"]
    assert "models that can: sd15" in err["message"]


def test_image_model_without_sd_server_says_what_to_install(server: ServerProcess) -> None:
    status, body = post(
        server, "/v1/images/generations", {"model": "sd15", "prompt": "a cat", "size": "512x512"}
    )
    err = body["error"]
    assert status == 503 and err["code"] == "engine_unavailable"
    assert "no executable sd-server was found at" in err["message"] and "sd_server_path" in err["message"]
    status, body = post(
        server, "/v1/images/generations", {"model": "sd15", "prompt": "x", "response_format": "url"}
    )
    assert status == 400 and body["error"]["param"] == "response_format"
    with urllib.request.urlopen(server.api + "/models", timeout=30) as r:
        listed = {m["id"]: m for m in json.loads(r.read())["data"]}
    assert listed["sd15"]["kind"] == "image"


def test_explain_routes_a_pipeline_to_sd_cpp_once_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    pipe = tmp_path / "sd15"
    write_diffusers(pipe)
    hw = probe(bandwidth_cache=None)
    missing = explain(entry_for_path(pipe), inputs=AdviceInputs(Settings(), hw, pins={})).public()
    sd = {r["lane"]: r for r in missing["decision"]["rejections"]}["sd.cpp"]
    assert (
        missing["decision"]["lane"] is None and sd["kind"] == "not_installed" and "sd-server" in sd["message"]
    )
    exe = fake_binary(tmp_path / "bin")
    installed = AdviceInputs(Settings.flat(sd_server_path=str(exe)), hw, pins={})
    doc = explain(entry_for_path(pipe), inputs=installed).public()
    assert doc["decision"]["lane"] == "sd.cpp" and doc["format"] == "diffusers"
