"""The body bytes after the gateway changed a request (gateway/body_bytes.py): the client's bytes extended
where keys were only added, the whole body encoded otherwise; either way, the bytes are `after`."""

from __future__ import annotations

import json
from typing import Any

from app.server.gateway.body_bytes import changed_body

RAW = b'{"model": "m", "messages": [{"role": "user", "content": "h\\u00e9 \\"x\\""}], "stream": true}  \r\n'


def _parsed() -> dict[str, Any]:
    return json.loads(RAW)


def test_added_keys_extend_the_clients_own_bytes() -> None:
    before = _parsed()
    after = {**before, "id_slot": 3, "n_probs": {"a": [1, 2]}}
    out = changed_body(RAW, before, after)
    assert json.loads(out) == after
    assert out.startswith(RAW.rstrip()[:-1])  # the client's bytes, untouched (its escapes kept)


def test_a_changed_value_is_encoded_whole() -> None:
    before = _parsed()
    after = {**before, "stream": False, "id_slot": 0}
    out = changed_body(RAW, before, after)
    assert json.loads(out) == after
    assert out == json.dumps(after).encode()


def test_an_equal_but_new_value_is_encoded_whole() -> None:
    before = _parsed()
    after = {**before, "messages": [dict(m) for m in before["messages"]], "id_slot": 1}  # edited copies
    assert changed_body(RAW, before, after) == json.dumps(after).encode()


def test_a_removed_key_is_encoded_whole() -> None:
    before = _parsed()
    after = {k: v for k, v in before.items() if k != "stream"} | {"id_slot": 2}
    assert json.loads(changed_body(RAW, before, after)) == after


def test_an_empty_object_and_nothing_added() -> None:
    assert json.loads(changed_body(b"{}", {}, {"id_slot": 1})) == {"id_slot": 1}
    before = _parsed()
    assert json.loads(changed_body(RAW, before, dict(before))) == before
