"""Chat conversations in SQLite (app/chat/store.py): no Qt needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.chat.store import ChatStore
from app.core.errors import BadRequestError


def test_conversations_survive_restart_rename_search_delete_export(tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    store = ChatStore(db)
    a = store.create("first", model="tiny", system_prompt="be brief")
    store.add(a, "user", "what is 100% of_x?")
    mid = store.add(a, "assistant", "", meta={})
    store.update(mid, content="all of **x**", meta={"ttft_s": 0.1, "tok_per_s": 40.0})
    b = store.create("second")
    store.add(b, "user", "unrelated")
    store.close()

    store = ChatStore(db)  # a restart
    assert [c.title for c in store.conversations()] == ["second", "first"]
    assert [m.content for m in store.messages(a)] == ["what is 100% of_x?", "all of **x**"]
    assert store.messages(a)[1].meta["tok_per_s"] == 40.0
    assert store.history(a)[0] == {"role": "system", "content": "be brief"}
    # search matches titles and message text; % and _ are literal, not wildcards
    assert [c.id for c in store.conversations(search="100%")] == [a]
    assert [c.id for c in store.conversations(search="of_x")] == [a]
    assert store.conversations(search="1%0") == []
    assert [c.id for c in store.conversations(search="SECOND")] == [b]
    store.rename(a, "  renamed   title ")
    assert store.get(a).title == "renamed title"
    with pytest.raises(BadRequestError, match="title"):
        store.rename(a, "   ")
    assert store.get(a).title == "renamed title"  # a refused rename changes nothing
    md = store.export_markdown(a)
    assert md.startswith("# renamed title") and "**You:**" in md and "all of **x**" in md
    doc = json.loads(store.export_json(a))
    assert doc["model"] == "tiny" and [m["role"] for m in doc["messages"]] == ["user", "assistant"]
    # regenerate: everything after the question goes
    store.truncate_after(a, store.messages(a)[0].id)
    assert [m.role for m in store.messages(a)] == ["user"]
    store.add(a, "error", "the server is stopped")
    assert store.history(a)[-1]["role"] == "user"  # errors are never sent to the model
    store.delete(b)
    assert [c.id for c in store.conversations()] == [a]
    assert store.messages(b) == []
    with pytest.raises(BadRequestError):
        store.get(b)
    with pytest.raises(BadRequestError, match="role"):
        store.add(a, "robot", "x")
    store.close()
