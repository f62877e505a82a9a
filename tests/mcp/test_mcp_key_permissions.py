"""Per-API-key MCP tool permissions: `switchyard mcp allow|ask|deny NAME TOOL --key KEYNAME` and
PUT /api/mcp/{name}/tools/{tool} with a "key", the key's rule winning over the server-wide one. Two keys of
one real `serve` ask the same registered SDK server (tests/support/mcp_servers.py) through the official
openai client and get different answers; the audit log names the key that asked."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from app.core.secrets import KeyStore
from app.mcp.registry import McpRegistry
from tests.conftest import ServerProcess, running_server
from tests.mcp.test_responses_mcp import _ask, _cli, _items, _server_argv
from tests.support.mcp_servers import ANSWER
from tests.support.tinymodels import HERMES_TOOLS, TinySpec, write_tiny_gguf


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, dict[str, str]]]:
    base = tmp_path_factory.mktemp("mcpkeys")
    models, home = base / "models", base / "home"
    models.mkdir()
    write_tiny_gguf(models / "tools.gguf", TinySpec(seed=3, chat_template=HERMES_TOOLS))
    store = KeyStore(home / "keys.json")
    secrets = {name: store.create(name).secret.reveal() for name in ("alice", "bob")}
    with running_server(home, models) as s:
        yield s, secrets


def _client(server: ServerProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key=key, max_retries=0, timeout=120)


def test_each_key_gets_its_own_rule_and_the_log_names_it(
    keyed: tuple[ServerProcess, dict[str, str]], tmp_path: Path
) -> None:
    server, secrets = keyed
    marker = tmp_path / "ran"
    home = server.home
    assert _cli(home, "add", "kp", "--timeout", "3", "--", *_server_argv("good", marker)).returncode == 0
    assert _cli(home, "allow", "kp", "lookup", "--key", "alice").returncode == 0
    unknown = _cli(home, "deny", "kp", "lookup", "--key", "carol")
    assert unknown.returncode != 0 and "no API key named 'carol'" in unknown.stderr
    assert "alice, bob" in unknown.stderr, "the error lists the keys there are"
    put = httpx.put(server.url + "/api/mcp/kp/tools/lookup", json={"permission": "deny", "key": "bob"})
    assert put.status_code == 200, put.text
    assert put.json()["keys"] == {"alice": {"lookup": "allow"}, "bob": {"lookup": "deny"}}
    assert put.json()["tools"] == {}, "the server-wide rule is untouched: still ask"
    bad = httpx.put(server.url + "/api/mcp/kp/tools/lookup", json={"permission": "allow", "key": "carol"})
    assert bad.status_code == 404 and "carol" in bad.json()["error"]["message"]
    listed = _cli(home, "ls").stdout
    assert "key alice: lookup=allow" in listed and "key bob: lookup=deny" in listed

    alice = _client(server, secrets["alice"]).responses.create(**_ask("kp"))
    (call,) = _items(alice, "mcp_call")
    assert call.status == "completed" and call.output == ANSWER, "alice's allow wins over the server's ask"
    assert marker.read_text().splitlines() == ["Paris"]

    # a stored response is its key's: the other key hears it does not exist
    assert _client(server, secrets["alice"]).responses.retrieve(alice.id).id == alice.id
    with pytest.raises(openai.NotFoundError):
        _client(server, secrets["bob"]).responses.retrieve(alice.id)

    bob = _client(server, secrets["bob"]).responses.create(**_ask("kp"))
    (refused,) = _items(bob, "mcp_call")
    assert refused.status == "failed" and refused.output is None
    assert "denied here for API key 'bob'" in refused.error.message  # type: ignore[union-attr]
    assert "--key bob" in refused.error.message  # type: ignore[union-attr]

    plain = {k: v for k, v in _ask("kp").items() if k != "extra_body"} | {"seed": 8}
    keyless = httpx.post(server.api + "/responses", json=plain, timeout=120).json()
    kinds = [o["type"] for o in keyless["output"]]
    assert "mcp_approval_request" in kinds and "mcp_call" not in kinds, "no key: the server-wide ask"
    assert marker.read_text().splitlines() == ["Paris"], "only alice's call ran"

    logged = [c for c in httpx.get(server.url + "/api/mcp/calls").json()["calls"] if c["server"] == "kp"]
    assert [(c["key_name"], c["outcome"]) for c in reversed(logged)] == [("alice", "ok"), ("bob", "denied")]
    assert json.loads(logged[0]["arguments"]) == {"city": "Paris"}
    assert McpRegistry(home / "mcp.json").get("kp").permission("lookup", key="alice") == "allow"
