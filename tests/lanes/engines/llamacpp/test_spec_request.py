"""Which requests a draft model does not pay on (issue 16), and what llama.cpp's /slots says about
speculation: pure parts; the engine's side is in tests/lanes/engines/llamacpp/test_spec.py."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.speculation import DRAFT_MAX_TEMPERATURE, speculation_of
from app.lanes.engines.llamacpp.request_defaults import draft_unsuited
from app.lanes.engines.llamacpp.spec import slots_speculation

GREEDY: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0}


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({}, None),
        ({"grammar": 'root ::= "a"'}, "grammar"),
        ({"json_schema": {"type": "object"}}, "json_schema"),
        ({"response_format": {"type": "json_object"}}, "json_schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "json_schema"),
        ({"response_format": {"type": "text"}}, None),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"tools": []}, None),
        ({"temperature": 0.8}, "temperature"),
        ({"temperature": DRAFT_MAX_TEMPERATURE}, None),
    ],
)
def test_the_reason_a_draft_does_not_pay(extra: dict[str, Any], reason: str | None) -> None:
    assert draft_unsuited({**GREEDY, **extra}, max_temperature=DRAFT_MAX_TEMPERATURE) == reason


def test_no_temperature_is_the_engines_and_the_models_threshold_is_read() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]}  # llama.cpp samples at 0.8
    assert draft_unsuited(body, max_temperature=DRAFT_MAX_TEMPERATURE) == "temperature"
    spec = speculation_of({"type": "draft", "max_temperature": 1.0})
    assert draft_unsuited(body, max_temperature=spec.max_temperature) is None


def test_slots_say_whether_speculation_is_on() -> None:
    on = [{"id": 0, "speculative": True, "params": {"speculative.types": "draft-simple"}}] * 2
    assert slots_speculation(on) == {"active": True, "slots": [True, True], "type": "draft-simple"}
    off = [{"id": 0, "speculative": False, "params": {"speculative.types": "none"}}]
    assert slots_speculation(off) == {"active": False, "slots": [False], "type": "none"}
    assert slots_speculation({"error": "no slots"}) == {"active": None, "slots": [], "type": None}
    fresh = [*on, {"id": 2, "speculative": True, "params": {"speculative.types": "none"}}]
    assert slots_speculation(fresh)["type"] == "draft-simple"  # a slot that served nothing yet says none
    assert slots_speculation([{"id": 0}])["active"] is None  # no flag: unknown, not "off"
