"""Which bodies the gateway sends to llama.cpp with their JSON schema as a grammar, and which keep the schema
(the engine's answers to the grammar: tests/server/gateway/test_schema_answers.py)."""

from __future__ import annotations

from typing import Any

import pytest

from app.lanes.engines.llamacpp.request_defaults import requested_schema, with_schema_grammar
from app.lanes.engines.llamacpp.schema_grammar import UnsupportedSchema, schema_grammar

PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("extra", "schema"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}},
            PERSON,
        ),
        ({"response_format": {"type": "json_object"}}, {"type": "object"}),
        ({"response_format": {"type": "json_object", "schema": PERSON}}, PERSON),
        ({"json_schema": PERSON}, PERSON),  # llama.cpp's own field (the forced tool call sends it)
        ({"response_format": {"type": "text"}}, None),
        ({}, None),
    ],
)
def test_the_schema_a_body_asks_for(extra: dict[str, Any], schema: Any) -> None:
    assert requested_schema({"messages": MESSAGES, **extra}) == schema


def test_a_schema_becomes_a_grammar_and_leaves_the_body() -> None:
    body = {
        "messages": MESSAGES,
        "response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}},
    }
    out = with_schema_grammar(body)
    assert out is not None and "response_format" not in out and "json_schema" not in out
    assert out["grammar"] == schema_grammar(PERSON) and out["messages"] == MESSAGES
    assert 'answer ::= "{" ws "\\"name\\"" ws ":" ws string ws "}"' in out["grammar"]


@pytest.mark.parametrize(
    "body",
    [
        {"json_schema": PERSON, "grammar": 'root ::= "x"'},  # the client's own grammar wins
        {"json_schema": PERSON, "tools": [{"type": "function", "function": {"name": "f"}}]},
        {"json_schema": {**PERSON, "minProperties": 1}},  # not written here: the engine converts it
        {"messages": MESSAGES},
    ],
)
def test_bodies_left_as_they_are(body: dict[str, Any]) -> None:
    assert with_schema_grammar(body) is None


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "string", "pattern": "^a$"}, "pattern"),
        ({"allOf": [PERSON]}, "allOf"),
        ({"$ref": "https://example.com/s.json"}, "only local $refs"),
        ({"$ref": "#/$defs/missing"}, "points at nothing"),
        ({"type": "array", "maxItems": -1}, "whole numbers"),
        ({"type": "object", "properties": {"a": {}}, "additionalProperties": True}, "additionalProperties"),
        ({"type": "decimal"}, "unknown type"),
        ({"type": "object", "required": ["a"]}, "required names a key"),
    ],
)
def test_what_is_not_written_says_which_keyword(schema: dict[str, Any], words: str) -> None:
    with pytest.raises(UnsupportedSchema, match=words.replace("$", r"\$")):
        schema_grammar(schema)


def test_a_schema_may_refer_to_itself() -> None:
    tree = {
        "$ref": "#/$defs/node",
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            }
        },
    }
    grammar = schema_grammar(tree)
    assert grammar.startswith("root ::= node\n") and "node ::= " in grammar and grammar.count("node ::=") == 1


def test_a_closed_object_without_properties_is_empty() -> None:
    assert 'answer ::= "{" ws "}"' in schema_grammar({"type": "object", "additionalProperties": False})
    assert schema_grammar({"type": "object"}).startswith("root ::= object-any\n")
