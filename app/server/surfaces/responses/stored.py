"""Stored responses: `previous_response_id`, GET and DELETE /v1/responses/{id}, in `responses.db` under the
home (SQLite, created on first use).

A response is kept unless its request said `store: false`. Each row holds the conversation as it reached
the engine (the input items, earlier stored turns included) and the response object, so a follow-up that
names it by `previous_response_id` is that conversation, then the response's output, then the new input:
an `mcp_approval_request` is answered by sending only `previous_response_id` and an
`mcp_approval_response`, as OpenAI's clients do. The file is bounded by age and by size (the oldest rows
go first); a row belongs to the API key that made it (no key: the keyless client), and another key is told
it does not exist.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.errors import NotFoundError
from app.core.sqlitefile import transaction
from app.server.surfaces.openai.validate import bad as _bad

MAX_AGE_S = 30 * 24 * 3600  # as long as OpenAI keeps a stored response
MAX_BYTES = 64 * 1024 * 1024  # all rows together; the oldest go first past it

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    at REAL NOT NULL,
    key_name TEXT NOT NULL,
    items TEXT NOT NULL,
    response TEXT NOT NULL,
    bytes INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_at ON responses(at);
"""
_ID = re.compile(r"^resp_[0-9a-f]{32}$")  # translate.new_id("resp")
_MCP_ITEMS = ("mcp_list_tools", "mcp_call", "mcp_approval_request", "mcp_approval_response")


@dataclass(frozen=True)
class Bounds:
    max_age_s: float = MAX_AGE_S
    max_bytes: int = MAX_BYTES


@dataclass(frozen=True)
class StoredResponse:
    id: str
    items: list[Any]  # the input items the response answered (its own earlier turns included)
    response: dict[str, Any]

    def conversation(self) -> list[Any]:
        """What a follow-up continues: the input (its approvals settled), then this response's output."""
        return [*settled(self.items), *self.response.get("output", [])]


def _owner(key_name: str | None) -> str:
    return key_name or ""


class ResponseStore:
    """The stored responses in `path` (Paths.home / responses.db)."""

    def __init__(self, path: Path, *, bounds: Bounds | None = None) -> None:
        self.path = path
        self.bounds = bounds or Bounds()

    def _db(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return transaction(self.path, schema=_SCHEMA)

    def put(self, response: dict[str, Any], *, items: list[Any], key_name: str | None) -> None:
        """Keep one finished response; then drop what is past the age or over the size bound."""
        items_text, resp_text = json.dumps(items), json.dumps(response)
        size = len(items_text) + len(resp_text)
        if size > self.bounds.max_bytes:
            return  # larger than the whole store: kept nowhere (a follow-up hears it is not stored)
        now = time.time()
        with self._db() as con:
            con.execute(
                "INSERT OR REPLACE INTO responses (id, at, key_name, items, response, bytes) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (response["id"], now, _owner(key_name), items_text, resp_text, size),
            )
            con.execute("DELETE FROM responses WHERE at < ?", (now - self.bounds.max_age_s,))
            total = con.execute("SELECT COALESCE(SUM(bytes), 0) FROM responses").fetchone()[0]
            while total > self.bounds.max_bytes:
                oldest = con.execute("SELECT id, bytes FROM responses ORDER BY at, rowid LIMIT 1").fetchone()
                con.execute("DELETE FROM responses WHERE id = ?", (oldest[0],))
                total -= oldest[1]

    def get(self, response_id: str, *, key_name: str | None) -> StoredResponse:
        row = None
        # only an id this server could have made is looked up (a stray one may not even encode as UTF-8)
        if _ID.match(response_id) and self.path.exists():
            with self._db() as con:
                row = con.execute(
                    "SELECT items, response FROM responses WHERE id = ? AND key_name = ? AND at >= ?",
                    (response_id, _owner(key_name), time.time() - self.bounds.max_age_s),
                ).fetchone()
        if row is None:
            raise NotFoundError(
                f"no stored response {response_id!r}: it was sent with store: false, is older than "
                f"{self.bounds.max_age_s // 86400:.0f} days or was pushed out by newer ones, was deleted, "
                "or belongs to another API key; send the whole conversation in 'input' instead",
                param="previous_response_id",
            )
        return StoredResponse(id=response_id, items=json.loads(row[0]), response=json.loads(row[1]))

    def delete(self, response_id: str, *, key_name: str | None) -> None:
        self.get(response_id, key_name=key_name)  # a clear 404 for what is not there
        with self._db() as con:
            con.execute(
                "DELETE FROM responses WHERE id = ? AND key_name = ?", (response_id, _owner(key_name))
            )


def as_items(input_: Any) -> list[Any]:
    """A request's `input` as a list of items (a string is one user message)."""
    if isinstance(input_, str):
        return [{"type": "message", "role": "user", "content": input_}]
    if isinstance(input_, list):
        return list(input_)
    raise _bad("field 'input' must be a string or a list of input items", "input")


def settled(items: list[Any]) -> list[Any]:
    """A stored input's approvals, which the response that read it already answered: an approved call's
    `mcp_call` is in that response's output, so the request and its answer go; a declined one is told as
    the call and its refusal, so that no later turn runs it or logs its denial again."""
    answers = {
        i.get("approval_request_id"): i
        for i in items
        if isinstance(i, dict) and i.get("type") == "mcp_approval_response"
    }
    out: list[Any] = []
    for item in items:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "mcp_approval_response":
            continue
        answer = answers.get(item.get("id")) if kind == "mcp_approval_request" else None
        if answer is None:
            out.append(item)
        elif answer.get("approve") is not True:
            out += _call_pair(item, "The user declined this tool call.")
    return out


def _call_pair(item: dict[str, Any], said: str) -> list[dict[str, Any]]:
    call_id = str(item.get("id") or "")
    return [
        {
            "type": "function_call",
            "call_id": call_id,
            "name": str(item.get("name")),
            "arguments": str(item.get("arguments") or "{}"),
        },
        {"type": "function_call_output", "call_id": call_id, "output": said},
    ]


def without_mcp(items: list[Any]) -> list[Any]:
    """Earlier MCP items for a request that offers no mcp tools: each call that ran is a function call and
    its output (what the model saw), the listings and unanswered approvals are left out."""
    out: list[Any] = []
    for item in items:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind not in _MCP_ITEMS:
            out.append(item)
        elif kind == "mcp_call":
            said = item.get("output") if item.get("error") is None else f"error: {json.dumps(item['error'])}"
            out += _call_pair(item, str(said or ""))
    return out
