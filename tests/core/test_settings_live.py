"""Settings applied to a running server (issues 13 and 16): one real `serve` with two tiny llama.cpp models
and two fake hubs. The hub endpoint, lane limit, TTL and download concurrency change without a restart; a
load body restarts only its model's lane, shown in GET /api/lanes; bad bodies are 400s that change nothing."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.hub.slots import Slots
from tests.conftest import ServerProcess, link_models, running_server
from tests.support.fakehub import FakeHub


@pytest.fixture(scope="module")
def hubs() -> Iterator[tuple[FakeHub, FakeHub]]:
    with FakeHub() as one, FakeHub() as two:
        one.add_repo("acme/first-GGUF", {"README.md": b"# one\n"}, tags=["gguf"])
        two.add_repo("acme/second-GGUF", {"README.md": b"# two\n"}, tags=["gguf"])
        yield one, two


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, model_store: Path, hubs: tuple[FakeHub, FakeHub]
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("live")
    models = link_models(root / "models", model_store / "tiny.gguf", model_store / "tiny2.gguf")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_ENDPOINT", hubs[0].url)  # the server starts on the first hub, from the environment
        mp.setenv("HF_HUB_OFFLINE", "0")
        mp.setenv("HF_HOME", str(root / "hf"))
        mp.setenv("HF_HUB_CACHE", str(root / "hf" / "hub"))
        mp.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.fail.Keyring")
        with running_server(root / "home", models) as s:
            yield s


def call(server: ServerProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(server.url + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def lanes(server: ServerProcess) -> dict[str, dict[str, Any]]:
    return {ln["id"]: ln for ln in call(server, "GET", "/api/lanes")[1]["lanes"]}


def settings_file(server: ServerProcess) -> dict[str, Any]:
    path = server.home / "settings.json"
    return json.loads(path.read_text()) if path.exists() else {}


def test_hub_endpoint_applies_without_restart(server: ServerProcess, hubs: tuple[FakeHub, FakeHub]) -> None:
    one, two = hubs
    assert call(server, "GET", "/api/hub/status?verify=0")[1]["endpoint"] == one.url
    _, found = call(server, "GET", "/api/hub/search?q=GGUF")
    assert "acme/first-GGUF" in json.dumps(found) and "acme/second-GGUF" not in json.dumps(found)
    status, change = call(server, "PUT", "/api/settings", {"hf_endpoint": two.url})
    assert status == 200 and change["applied"] == ["hf_endpoint"] and change["needs_server_restart"] == {}
    _, found = call(server, "GET", "/api/hub/search?q=GGUF")
    assert "acme/second-GGUF" in json.dumps(found) and "acme/first-GGUF" not in json.dumps(found)
    assert call(server, "GET", "/api/settings")[1]["hub"]["endpoint"] == two.url
    assert settings_file(server) == {"hf_endpoint": two.url}  # only the key sent was written


def test_bad_settings_are_400_and_write_nothing(server: ServerProcess) -> None:
    before = settings_file(server)
    for body in ({"max_loaded_lanes": 0}, {"no_such_key": 1}, {"download_concurrency": "4"}):
        status, doc = call(server, "PUT", "/api/settings", body)
        assert status == 400 and doc["error"]["code"] == "invalid_request", body
    assert (
        "max_loaded_lanes must be at least 1"
        in call(server, "PUT", "/api/settings", {"max_loaded_lanes": 0})[1]["error"]["message"]
    )
    assert settings_file(server) == before
    # a key a running server cannot take says so, and why
    status, change = call(server, "PUT", "/api/settings", {"allowed_hosts": ["box.lan"]})
    assert status == 200 and "request guards" in change["needs_server_restart"]["allowed_hosts"]
    assert "after the server restarts: allowed_hosts" in change["note"]


def test_download_concurrency_applies_now(server: ServerProcess) -> None:
    status, change = call(server, "PUT", "/api/settings", {"download_concurrency": 5})
    assert status == 200 and change["applied"] == ["download_concurrency"]
    assert call(server, "GET", "/api/settings")[1]["settings"]["download_concurrency"] == 5


def test_lane_limit_then_ctx_size_restarts_only_that_lane(server: ServerProcess) -> None:
    assert call(server, "POST", "/api/models/tiny/load")[0] == 200
    assert call(server, "POST", "/api/models/tiny2/load")[0] == 200
    assert lanes(server)["tiny"]["state"] == "stopped"  # max_loaded_lanes 1: swapped out
    status, change = call(server, "PUT", "/api/settings", {"max_loaded_lanes": 2})
    assert status == 200 and change["restarted"] == {}
    assert call(server, "POST", "/api/models/tiny/load")[0] == 200
    now = lanes(server)
    assert now["tiny"]["state"] == now["tiny2"]["state"] == "ready"  # the new limit, no restart
    pid1, pid2 = now["tiny"]["pid"], now["tiny2"]["pid"]
    old_ctx = now["tiny"]["settings"]["ctx_size"]
    assert now["tiny"]["settings"]["parallel"] == 4 and now["tiny"]["settings"]["kv_type"] == "f16"

    status, doc = call(server, "POST", "/api/models/tiny/load", {"ctx_size": 1024, "kv_type": "f32"})
    assert status == 200, doc
    assert doc["change"]["restarted"] == {"tiny": "ctx_size, kv_type"}
    assert doc["plan"]["before"]["chosen"]["ctx_size"] == old_ctx
    assert doc["plan"]["after"]["chosen"]["ctx_size"] == 1024
    assert doc["settings"]["ctx_size"] == 1024 and doc["settings"]["kv_type"] == "f32"
    now = lanes(server)
    assert now["tiny"]["state"] == "ready" and now["tiny"]["pid"] not in (None, pid1)
    assert now["tiny2"]["pid"] == pid2 and now["tiny2"]["settings"]["ctx_size"] == old_ctx
    assert now["tiny"]["settings"]["ctx_size"] == 1024 and now["tiny"]["settings"]["kv_type"] == "f32"

    # the same values again restart nothing; speculation is applied: the lane restarts with the draft
    pid1 = now["tiny"]["pid"]
    assert call(server, "POST", "/api/models/tiny/load", {"ctx_size": 1024})[1]["change"]["restarted"] == {}
    status, doc = call(server, "POST", "/api/models/tiny/load", {"speculative": {"draft": "tiny2"}})
    assert status == 200 and doc["change"]["not_applied"] == [] and "tiny" in doc["change"]["restarted"]
    assert lanes(server)["tiny"]["pid"] != pid1 and doc["params"]["draft_path"].endswith("tiny2.gguf")
    assert lanes(server)["tiny"]["settings"]["speculative"] == {"draft": "tiny2"}


def test_bad_load_body_is_400_and_leaves_the_lane(server: ServerProcess) -> None:
    call(server, "POST", "/api/models/tiny/load")
    pid, ctx = lanes(server)["tiny"]["pid"], lanes(server)["tiny"]["settings"]["ctx_size"]
    status, doc = call(server, "POST", "/api/models/tiny/load", {"ctx_sise": 2048})
    assert (
        status == 400
        and "allowed: ctx_size, parallel, kv_type, flash_attn, gpu_layers" in doc["error"]["message"]
    )
    for body in ({"kv_type": "q9"}, {"parallel": 0}, {"ttl_s": 5}, {"lora": "x.gguf"}, b"[1]"):
        status, doc = call(server, "POST", "/api/models/tiny/load", body)
        assert status == 400 and doc["error"]["type"] == "invalid_request_error", body
    status, doc = call(server, "POST", "/api/models/tiny/load", {"ctx_size": 1 << 30})
    assert (
        status == 503
        and doc["error"]["code"] == "model_does_not_fit"
        and "nothing was changed" in doc["error"]["message"]
    )
    assert lanes(server)["tiny"]["pid"] == pid and lanes(server)["tiny"]["settings"]["ctx_size"] == ctx
    # values the engine itself refuses (a quantized V cache without flash attention, on this CPU build):
    # the error says so and the previous settings come back for the next start
    status, doc = call(server, "POST", "/api/models/tiny/load", {"kv_type": "q8_0", "flash_attn": "off"})
    assert status == 503 and "the previous settings are back" in doc["error"]["message"]
    status, doc = call(server, "POST", "/api/models/tiny/load")
    assert status == 200 and doc["settings"]["kv_type"] != "q8_0" and doc["settings"]["ctx_size"] == ctx


def test_idle_ttl_applies_to_loaded_lanes(server: ServerProcess) -> None:
    assert call(server, "POST", "/api/models/tiny/load")[0] == 200
    status, change = call(server, "PUT", "/api/settings", {"idle_ttl_s": 0.5})
    assert status == 200 and change["applied"] == ["idle_ttl_s"] and change["restarted"] == {}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and lanes(server)["tiny"]["state"] != "stopped":
        time.sleep(0.1)
    assert "ready" not in {ln["state"] for ln in lanes(server).values()}
    assert lanes(server)["tiny"]["state"] == "stopped"
    assert "idle for 0.5 s" in "\n".join(call(server, "GET", "/api/lanes/tiny/logs")[1]["lines"])


async def test_slots_grow_and_shrink_while_held() -> None:
    slots = Slots(1)
    entered: list[int] = []

    async def take(i: int, hold: asyncio.Event) -> None:
        async with slots:
            entered.append(i)
            await hold.wait()

    hold = asyncio.Event()
    tasks = [asyncio.create_task(take(i, hold)) for i in range(3)]
    await asyncio.sleep(0.05)
    assert entered == [0]
    await slots.resize(3)  # the waiting transfers start at once
    await asyncio.sleep(0.05)
    assert sorted(entered) == [0, 1, 2] and slots.busy == 3
    await slots.resize(1)
    hold.set()
    await asyncio.gather(*tasks)
    assert slots.busy == 0 and slots.limit == 1
