"""The Responses API's mcp tool against real MCP servers (the official SDK's MCPServer,
tests/support/mcp_servers.py)
over stdio and streamable HTTP, through a real `switchyard serve` and the official openai client.

A random-weights model is made to call the tool by a tools-aware template, an assistant prefill and a named
tool_choice (llama.cpp's grammar then writes the call; the tool's one-value schema fixes its arguments), as
in tests/server/surfaces/test_anthropic_tools.py. Each test asserts on what the server really answered, and
on the marker
file each run of the tool appends to, so a call that must not run is seen not to.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from app.core.errors import BadRequestError, NotFoundError
from app.mcp.client import McpBounds, open_session
from app.mcp.registry import McpRegistry, McpServerSpec
from app.server.surfaces.responses.mcp_spec import parse_entry
from tests.conftest import REPO, ServerProcess, running_server
from tests.support.mcp_servers import ANSWER
from tests.support.tinymodels import HERMES_TOOLS, TinySpec, write_tiny_gguf

PREFILL = [
    {"role": "user", "content": "weather in Paris?"},
    {"role": "assistant", "content": "<tool_call>\n"},
]
HOSTILE_ERRORS = {
    "hang": "gave no answer within 3 s",
    "huge": "over 1114112 bytes",
    "malformed": "malformed JSON-RPC",
    "crash": "exited with status 3",
}


def _server_argv(mode: str, marker: Path | None = None) -> tuple[str, ...]:
    return (
        sys.executable,
        "-m",
        "tests.support.mcp_servers",
        mode,
        *(("--marker", str(marker)) if marker else ()),
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- the client's bounds, without a model -----------------------------------------------------------
@pytest.mark.parametrize("mode", sorted(HOSTILE_ERRORS))
def test_a_hostile_server_gives_a_tool_error_within_the_deadline(mode: str) -> None:
    async def go() -> tuple[Any, float, float]:
        t0 = time.monotonic()
        spec = McpServerSpec(name=mode, command=_server_argv(mode))
        async with open_session(spec, bounds=McpBounds(call_s=3)) as session:
            assert [t.name for t in await session.tools()] == ["lookup"]
            t1 = time.monotonic()
            result = await session.call("lookup", {"city": "Paris"})
            took = time.monotonic() - t1
        return result, took, time.monotonic() - t0

    result, took, total = asyncio.run(go())
    assert result.output is None and HOSTILE_ERRORS[mode] in result.error
    assert took < 3.5, "the call ends at its deadline or sooner"
    assert total < 20, "and the session (the server's process group) closes promptly after"


def test_a_good_server_answers_through_the_bounded_stdio_transport() -> None:
    async def go() -> Any:
        async with open_session(
            McpServerSpec(name="g", command=_server_argv("good")), bounds=McpBounds()
        ) as s:
            return await s.call("lookup", {"city": "Paris"}), await s.call("nope", {})

    ok, unknown = asyncio.run(go())
    assert ok.output == ANSWER and ok.size == len(ANSWER) and ok.error is None
    assert unknown.output is None and "nope" in unknown.error


def test_a_result_over_the_cap_is_an_error_not_an_output() -> None:
    async def go() -> Any:
        spec = McpServerSpec(name="g", command=_server_argv("good"))
        async with open_session(spec, bounds=McpBounds(max_result_bytes=10)) as s:
            return await s.call("lookup", {"city": "Paris"})

    res = asyncio.run(go())
    assert res.output is None and f"{len(ANSWER)} bytes, over the cap of 10" in res.error


# ---- the registry and the request's mcp entries -----------------------------------------------------
def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "SWITCHYARD_HOME": str(home),
        "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring",
    }
    return subprocess.run(
        [sys.executable, "-m", "app", "mcp", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_adds_lists_permits_and_removes_servers(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert (
        _cli(
            home, "add", "wx", "--timeout", "5", "--", "python3", "-m", "tests.support.mcp_servers", "good"
        ).returncode
        == 0
    )
    assert _cli(home, "add", "web", "http://127.0.0.1:9/mcp").returncode == 0
    assert _cli(home, "deny", "wx", "lookup").returncode == 0
    listed = json.loads(_cli(home, "ls", "--json").stdout)["servers"]
    assert [(s["name"], s["transport"]) for s in listed] == [("web", "http"), ("wx", "stdio")]
    assert listed[1]["command"] == ["python3", "-m", "tests.support.mcp_servers", "good"]
    assert listed[1]["tools"] == {"lookup": "deny"} and listed[1]["timeout_s"] == 5
    assert McpRegistry(home / "mcp.json").get("web").permission("anything") == "ask", "a tool not named asks"
    # a secret that cannot be kept is refused, plainly, and nothing is registered
    refused = _cli(home, "add", "tok", "http://127.0.0.1:9/mcp", "--header", "Authorization=Bearer s3cret")
    assert (
        refused.returncode == 2 and "no system keyring" in refused.stderr and "s3cret" not in refused.stderr
    )
    bad = _cli(home, "add", "ftp", "ftp://example.com/x")
    assert bad.returncode == 2 and "http:// or https://" in bad.stderr
    assert _cli(home, "rm", "web").returncode == 0
    assert [s["name"] for s in json.loads(_cli(home, "ls", "--json").stdout)["servers"]] == ["wx"]
    gone = _cli(home, "rm", "web")
    assert gone.returncode == 2 and "no MCP server named 'web'" in gone.stderr
    with pytest.raises(NotFoundError):
        McpRegistry(home / "mcp.json").get("web")


def test_require_approval_follows_openai_filters() -> None:
    base = {"type": "mcp", "server_label": "wx", "server_url": "http://127.0.0.1:9/mcp"}
    assert parse_entry(base, "t").needs_approval("a", read_only=False), "OpenAI's default is always"
    never = parse_entry({**base, "require_approval": "never"}, "t")
    assert not never.needs_approval("a", read_only=False)
    only = parse_entry({**base, "require_approval": {"always": {"tool_names": ["rm"]}}}, "t")
    assert only.needs_approval("rm", read_only=False) and not only.needs_approval("ls", read_only=False)
    ro = parse_entry({**base, "require_approval": {"never": {"read_only": True}}}, "t")
    assert not ro.needs_approval("ls", read_only=True) and ro.needs_approval("rm", read_only=False)
    for bad, param in (
        ({**base, "server_url": "file:///etc/passwd"}, "t.server_url"),
        ({**base, "require_approval": "sometimes"}, "t.require_approval"),
        ({**base, "headers": {"X": 1}}, "t.headers"),
        ({"type": "mcp"}, "t.server_label"),
    ):
        with pytest.raises(BadRequestError) as exc:
            parse_entry(bad, "t")
        assert exc.value.param == param


# ---- against a real server ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("mcp")
    models = base / "models"
    models.mkdir()
    write_tiny_gguf(models / "tools.gguf", TinySpec(seed=3, chat_template=HERMES_TOOLS))
    with running_server(base / "home", models) as s:
        yield s


@pytest.fixture
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=120)


def _register(server: ServerProcess, name: str, argv: tuple[str, ...], **perms: str) -> None:
    reg = McpRegistry(
        server.home / "mcp.json"
    )  # the file `switchyard mcp add` writes; serve reads it per request
    reg.add(name, command=argv, timeout_s=3)
    for tool, perm in perms.items():
        reg.set_permission(name, tool=tool, permission=perm)


def _ask(label: str, **extra: Any) -> dict[str, Any]:
    """A request that makes the model call `lookup` on `label` (the client waives approval unless `extra`
    says otherwise: the machine's permission still holds)."""
    return {
        "model": "tools",
        "input": PREFILL,
        "tools": [{"type": "mcp", "server_label": label, "require_approval": "never", **extra}],
        "tool_choice": {"type": "mcp", "server_label": label, "name": "lookup"},
        "parallel_tool_calls": False,
        "max_output_tokens": 200,
        # llama.cpp samples the same way for the same seed and prompt; with this one the tiny model makes
        # one whole call, then answers (measured over seeds 1-15: others run to max_output_tokens)
        "extra_body": {"seed": 8},
        # after one call the model answers without tools: a random-weights model offered them again may
        # write a call its engine's parser rejects, which would fail the response for reasons of its own
        "max_tool_calls": 1,
    }


def _items(resp: Any, kind: str) -> list[Any]:
    return [o for o in resp.output if o.type == kind]


def _calls_log(server: ServerProcess) -> list[dict[str, Any]]:
    return httpx.get(server.url + "/api/mcp/calls").json()["calls"]


def _check_listing(resp: Any, label: str) -> None:
    (listing,) = _items(resp, "mcp_list_tools")
    assert listing.server_label == label and listing.error is None
    assert [t.name for t in listing.tools] == ["lookup"]
    assert listing.tools[0].description == "Look up the weather of a city."
    assert listing.tools[0].input_schema["required"] == ["city"]


def _check_calls(resp: Any, label: str) -> list[Any]:
    calls = _items(resp, "mcp_call")
    assert calls, [o.type for o in resp.output]
    for call in calls:
        assert call.server_label == label and call.name == "lookup"
        assert json.loads(call.arguments) == {"city": "Paris"}
        assert call.status == "completed" and call.error is None and call.output == ANSWER
    return calls


def test_stdio_server_call_returns_its_real_output(
    server: ServerProcess, client: openai.OpenAI, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    _register(server, "wx", _server_argv("good", marker), lookup="allow")
    resp = client.responses.create(**_ask("wx"))
    _check_listing(resp, "wx")
    calls = _check_calls(resp, "wx")
    assert marker.read_text().splitlines() == ["Paris"] * len(calls)
    assert resp.output[0].type == "mcp_list_tools" and resp.output[1].type == "mcp_call"
    assert resp.usage is not None and resp.usage.input_tokens > 0
    logged = [c for c in _calls_log(server) if c["server"] == "wx"]
    assert len(logged) == len(calls)
    row = logged[-1]
    assert row["tool"] == "lookup" and json.loads(row["arguments"]) == {"city": "Paris"}
    assert row["outcome"] == "ok" and row["result_bytes"] == len(ANSWER) and 0 < row["seconds"] < 3
    assert row["model"] == "tools" and row["key_name"] is None  # no API keys on this server: nobody named


def test_stdio_server_call_streams_the_same_items(
    server: ServerProcess, client: openai.OpenAI, tmp_path: Path
) -> None:
    _register(server, "wxs", _server_argv("good", tmp_path / "ran"), lookup="allow")
    with client.responses.create(**_ask("wxs"), stream=True) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    for needed in (
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.mcp_call_arguments.done",
        "response.mcp_call.in_progress",
        "response.mcp_call.completed",
    ):
        assert needed in kinds, kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1]
    assert final.type in ("response.completed", "response.incomplete")
    _check_listing(final.response, "wxs")
    _check_calls(final.response, "wxs")
    done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "mcp_call"]
    assert done and all(i.output == ANSWER for i in done)


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    port, marker = _free_port(), tmp_path / "ran-http"
    proc = subprocess.Popen(
        [*_server_argv("good", marker), "--http", str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (
                    "the HTTP MCP server did not start"
                )
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp", marker
    finally:
        proc.terminate()
        proc.wait(10)


def test_streamable_http_server_by_url(
    server: ServerProcess, client: openai.OpenAI, http_server: tuple[str, Path]
) -> None:
    url, marker = http_server
    body = _ask("web", server_url=url, headers={"X-Test": "1"})
    resp = client.responses.create(**body)
    assert resp.tools[0].headers == {"X-Test": "<redacted>"}, "a header sent to the server is not echoed"  # type: ignore[union-attr]
    _check_listing(resp, "web")
    calls = _check_calls(resp, "web")
    assert marker.read_text().splitlines() == ["Paris"] * len(calls)
    with client.responses.create(**body, stream=True) as stream:
        final = list(stream)[-1]
    _check_calls(final.response, "web")


def test_approval_then_the_call_runs(server: ServerProcess, client: openai.OpenAI, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    _register(server, "ask", _server_argv("good", marker))  # no permission set: the tool asks
    first = client.responses.create(**_ask("ask"))  # the client waives approval; the machine asks
    (request,) = _items(first, "mcp_approval_request")
    assert request.server_label == "ask" and request.name == "lookup"
    assert json.loads(request.arguments) == {"city": "Paris"}
    assert not _items(first, "mcp_call") and not marker.exists(), "nothing runs before the client approves"
    answer = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
    history = [*PREFILL, *[o.model_dump(exclude_none=True) for o in first.output], answer]
    second = client.responses.create(**{**_ask("ask"), "input": history, "tool_choice": "auto"})
    approved = [c for c in _items(second, "mcp_call") if c.approval_request_id == request.id]
    assert len(approved) == 1 and approved[0].output == ANSWER and approved[0].status == "completed"
    assert marker.read_text().splitlines()[0] == "Paris"


def test_denial_never_runs_the_call(server: ServerProcess, client: openai.OpenAI, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    _register(server, "no", _server_argv("good", marker))
    first = client.responses.create(**_ask("no"))
    (request,) = _items(first, "mcp_approval_request")
    answer = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": False}
    history = [*PREFILL, *[o.model_dump(exclude_none=True) for o in first.output], answer]
    second = client.responses.create(**{**_ask("no"), "input": history, "tool_choice": "none"})
    assert not [c for c in _items(second, "mcp_call") if c.approval_request_id == request.id]
    assert not marker.exists(), "a declined call never reaches the server"
    assert [c["outcome"] for c in _calls_log(server) if c["server"] == "no"] == ["denied"]


def test_a_tool_denied_on_this_machine_fails_without_running(
    server: ServerProcess, client: openai.OpenAI, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    _register(server, "deny", _server_argv("good", marker), lookup="deny")
    resp = client.responses.create(**_ask("deny"))
    calls = _items(resp, "mcp_call")
    assert calls and all(c.status == "failed" and "denied here" in c.error.message for c in calls)
    assert not marker.exists()


def test_an_unreachable_server_is_an_error_in_its_listing(client: openai.OpenAI) -> None:
    body = _ask("gone", server_url=f"http://127.0.0.1:{_free_port()}/mcp")
    resp = client.responses.create(**{**body, "tool_choice": "auto", "input": "hi", "max_output_tokens": 5})
    (listing,) = _items(resp, "mcp_list_tools")
    assert listing.tools == [] and "cannot connect to MCP server 'gone'" in listing.error


def test_a_bad_mcp_entry_is_a_400_naming_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(
            model="tools", input="hi", tools=[{"type": "mcp", "server_label": "x", "server_url": "ftp://x"}]
        )
    assert exc.value.body["param"] == "tools[0].server_url"  # type: ignore[index]


@pytest.mark.parametrize("mode", sorted(HOSTILE_ERRORS))
def test_a_hostile_server_through_serve_is_a_tool_error_and_health_stays_fast(
    server: ServerProcess, client: openai.OpenAI, mode: str
) -> None:
    _register(server, f"bad-{mode}", _server_argv(mode), lookup="allow")
    health: list[float] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            t0 = time.monotonic()
            assert httpx.get(server.url + "/health", timeout=5).status_code == 200
            health.append(time.monotonic() - t0)
            time.sleep(0.2)

    watcher = threading.Thread(target=poll)
    watcher.start()
    try:
        resp = client.responses.create(**_ask(f"bad-{mode}"))
    finally:
        done.set()
        watcher.join()
    calls = _items(resp, "mcp_call")
    assert calls and calls[0].status == "failed" and calls[0].output is None
    assert HOSTILE_ERRORS[mode] in calls[0].error.message, calls[0].error
    assert health and max(health) < 1.0, f"/health answered in {max(health):.2f} s while a tool misbehaved"
    row = [c for c in _calls_log(server) if c["server"] == f"bad-{mode}"][-1]  # newest first: the first call
    assert row["outcome"] == "error" and row["seconds"] < 3.5
