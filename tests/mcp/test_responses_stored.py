"""Stored responses (app/server/surfaces/responses/stored.py): `previous_response_id`, GET and DELETE
/v1/responses/{id} through the official openai client against a real `serve`, and the store's own bounds on
a real SQLite file. The MCP approval is answered the way OpenAI's clients do: only `previous_response_id`
and an `mcp_approval_response`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from app.core.errors import NotFoundError
from app.server.surfaces.responses.stored import Bounds, ResponseStore
from tests.conftest import ServerProcess
from tests.mcp import test_responses_mcp as base
from tests.mcp.test_responses_mcp import PREFILL, _ask, _items, _register, _server_argv
from tests.support.mcp_servers import ANSWER

server, client = base.server, base.client  # that module's fixtures: a serve with a tool-calling model


# ---- the store, without a server ------------------------------------------------------------------
def _id(name: str) -> str:
    """A response id of the shape the server makes (the store looks up no other)."""
    return "resp_" + name.encode().hex().ljust(32, "0")


def _resp(name: str, text: str = "x") -> dict[str, Any]:
    return {"id": _id(name), "object": "response", "output": [{"type": "message", "content": text}]}


def test_store_keeps_per_key_and_drops_the_oldest_past_its_size(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "r.db", bounds=Bounds(max_bytes=400))
    store.put(_resp("a"), items=["hi"], key_name="alice")
    assert store.get(_id("a"), key_name="alice").conversation() == ["hi", {"type": "message", "content": "x"}]
    with pytest.raises(NotFoundError, match="another API key"):
        store.get(_id("a"), key_name="bob")
    with pytest.raises(NotFoundError):
        store.get(_id("a"), key_name=None)
    for rid in ("b", "c", "d", "e"):  # each row is ~160 bytes: past 400, the oldest go
        store.put(_resp(rid, "y" * 40), items=["hi"], key_name="alice")
    with pytest.raises(NotFoundError):
        store.get(_id("a"), key_name="alice")
    assert store.get(_id("e"), key_name="alice").response["id"] == _id("e")
    store.put(_resp("big", "z" * 1000), items=[], key_name="alice")  # larger than the whole store
    with pytest.raises(NotFoundError):
        store.get(_id("big"), key_name="alice")
    assert store.get(_id("e"), key_name="alice")  # and it pushed nothing out


def test_an_id_the_server_never_made_is_not_found_without_a_lookup(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "r.db")
    store.put(_resp("a"), items=[], key_name=None)
    for stray in ("\ud800", "a" * 3000, "resp_", "../responses.db", _id("a").upper()):
        with pytest.raises(NotFoundError):  # a lone surrogate was a UnicodeEncodeError from sqlite3: a 500
            store.get(stray, key_name=None)


def test_a_stored_inputs_approvals_are_settled_history(tmp_path: Path) -> None:
    ask = {"type": "mcp_approval_request", "server_label": "wx", "name": "lookup", "arguments": "{}"}
    items = [
        "hi",
        {**ask, "id": "mcpr_yes"},
        {**ask, "id": "mcpr_no"},
        {**ask, "id": "mcpr_open"},
        {"type": "mcp_approval_response", "approval_request_id": "mcpr_yes", "approve": True},
        {"type": "mcp_approval_response", "approval_request_id": "mcpr_no", "approve": False},
    ]
    store = ResponseStore(tmp_path / "r.db")
    store.put(_resp("s"), items=items, key_name=None)
    conv = store.get(_id("s"), key_name=None).conversation()
    assert conv == [
        "hi",  # the approved call's mcp_call is in the response that answered it: request and answer go
        {"type": "function_call", "call_id": "mcpr_no", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "mcpr_no", "output": "The user declined this tool call."},
        {**ask, "id": "mcpr_open"},  # not answered yet: a follow-up may answer it
        {"type": "message", "content": "x"},
    ]


def test_store_forgets_what_is_past_its_age(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "r.db", bounds=Bounds(max_age_s=0.2))
    store.put(_resp("old"), items=[], key_name=None)
    assert store.get(_id("old"), key_name=None)
    time.sleep(0.3)
    with pytest.raises(NotFoundError, match="older than"):
        store.get(_id("old"), key_name=None)
    store.put(_resp("new"), items=[], key_name=None)  # a write sweeps the old row out of the file
    assert ResponseStore(store.path).get(_id("new"), key_name=None)
    with pytest.raises(NotFoundError):
        ResponseStore(store.path).get(_id("old"), key_name=None)  # gone from the file, not just hidden


# ---- through serve and the official client ---------------------------------------------------------
def test_previous_response_id_continues_and_get_delete_work(client: openai.OpenAI) -> None:
    first = client.responses.create(model="tools", input="hello there", max_output_tokens=4)
    assert first.store is True and first.previous_response_id is None
    assert client.responses.retrieve(first.id).model_dump() == first.model_dump()
    second = client.responses.create(
        model="tools", previous_response_id=first.id, input="and then?", max_output_tokens=4
    )
    assert second.previous_response_id == first.id
    assert first.usage is not None and second.usage is not None
    # the engine read the first turn, its answer, and the new question
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    with client.responses.create(
        model="tools", previous_response_id=second.id, input="go on", max_output_tokens=4, stream=True
    ) as stream:
        final = list(stream)[-1].response  # type: ignore[union-attr]
    assert final.previous_response_id == second.id and final.usage is not None
    assert final.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens
    assert client.responses.retrieve(final.id).id == final.id, "a streamed response is kept too"

    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as gone:
        client.responses.create(model="tools", previous_response_id=first.id, input="x", max_output_tokens=2)
    assert gone.value.body["param"] == "previous_response_id"  # type: ignore[index]
    unkept = client.responses.create(model="tools", input="hi", max_output_tokens=2, store=False)
    assert unkept.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)


@pytest.mark.parametrize("stream", [False, True])
def test_an_approval_answered_by_previous_response_id_runs_once(
    server: ServerProcess, client: openai.OpenAI, tmp_path: Path, stream: bool
) -> None:
    marker, label = tmp_path / "ran", f"prev{int(stream)}"
    _register(server, label, _server_argv("good", marker))  # no permission set: the tool asks
    first = client.responses.create(**_ask(label))
    (request,) = _items(first, "mcp_approval_request")
    assert not marker.exists()
    tools = _ask(label)["tools"]
    answer = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
    follow: dict[str, Any] = {
        "model": "tools",
        "previous_response_id": first.id,
        "input": [answer],  # nothing else: the conversation is the stored one
        "tools": tools,
        "tool_choice": "none",
        "max_output_tokens": 8,
    }
    if stream:
        with client.responses.create(**follow, stream=True) as events:
            second: Any = list(events)[-1].response  # type: ignore[union-attr]
    else:
        second = client.responses.create(**follow)
    (call,) = _items(second, "mcp_call")
    assert call.approval_request_id == request.id and call.output == ANSWER and call.status == "completed"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert marker.read_text().splitlines() == ["Paris"]
    # the next turn carries that approval and its call as history: the tool does not run again
    third = client.responses.create(
        model="tools",
        previous_response_id=second.id,
        input="thanks",
        tools=tools,
        tool_choice="none",
        max_output_tokens=4,
    )
    assert not _items(third, "mcp_call")
    assert marker.read_text().splitlines() == ["Paris"], "an approval already run is not run again"
    # nor when a client sends the whole history itself, the approval and its call both in it
    history = [
        *PREFILL,
        *[o.model_dump(exclude_none=True) for o in first.output],
        answer,
        *[o.model_dump(exclude_none=True) for o in second.output],
        {"role": "user", "content": "thanks"},
    ]
    whole = client.responses.create(
        model="tools", input=history, tools=tools, tool_choice="none", max_output_tokens=4, store=False
    )
    assert not _items(whole, "mcp_call")
    assert marker.read_text().splitlines() == ["Paris"]
