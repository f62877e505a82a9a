"""A request's JSON schema as a GBNF grammar, so llama.cpp's chat-output parser never reads the answer.

Why: llama-server (the build the llama.cpp lane runs) turns `response_format` / `json_schema` on a chat
into its "peg-native" chat format, whose grammar and output parser disagree. The grammar decodes bytes
leniently (a model that writes raw byte tokens gets invalid UTF-8 past it, and an answer cut by
max_tokens may end inside a character), while the parser rejects any malformed UTF-8 and then fails the
whole request: "The model produced output that does not match the expected peg-native format" (issue 31,
defect 6). On /v1/completions the same build does not hold the text to the schema at all (its own
converter writes an llguidance grammar, and the wheel samples unconstrained under it). A plain `grammar`
takes neither path: the chat is answered in the content-only format, which is never parsed, and the grammar
is enforced on both routes. So the gateway sends the schema as GBNF written here.

Covered: object (properties in their order, required and optional ones, no other keys), array (items,
minItems/maxItems), string (minLength/maxLength, enum, const), integer, number, boolean, null, a list of
types, enum/const of any JSON value, anyOf/oneOf, local `$ref`s (`#/$defs/...`, `#/definitions/...`), and
the empty schema (any JSON value). Anything else (pattern, allOf, patternProperties, minimum...) raises
`UnsupportedSchema`, and the request then keeps its schema for the engine's own converter.
"""

from __future__ import annotations

import json
import re
from typing import Any

# the JSON text between values: bounded, so a model cannot spend its whole answer on blanks
_WS = "ws ::= [ \\t\\n]{0,8}"
_BASE = {
    "ws": _WS,
    # a code point JSON allows unescaped in a string, or an escape. Listed, not negated: llama.cpp's grammar
    # reads a stray lead byte (F5..FF) or a surrogate's bytes as a code point, and these bounds refuse them
    "char": (
        "char ::= [\\x20-\\x21\\x23-\\x5B\\x5D-\\x7E\\u0080-\\uD7FF\\uE000-\\U0010FFFF]"
        ' | "\\\\" (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4})'
    ),
    "string": 'string ::= "\\"" char* "\\""',
    "integer": 'integer ::= "-"? ("0" | [1-9] [0-9]{0,15})',
    "number": 'number ::= integer ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?',
    "boolean": 'boolean ::= "true" | "false"',
    "null": 'null ::= "null"',
    "value": "value ::= object-any | array-any | string | number | boolean | null",
    "object-any": (
        'object-any ::= "{" ws (string ws ":" ws value ws ("," ws string ws ":" ws value ws)*)? "}"'
    ),
    "array-any": 'array-any ::= "[" ws (value ws ("," ws value ws)*)? "]"',
}
# what each named base rule needs besides itself
_NEEDS = {
    "string": ("char",),
    "number": ("integer",),
    "value": ("object-any", "array-any", "string", "number", "boolean", "null"),
    "object-any": ("ws", "string", "value"),
    "array-any": ("ws", "value"),
}
_TYPES = ("string", "integer", "number", "boolean", "null")
# keywords that describe or annotate without constraining the text
_IGNORED = frozenset(
    {"title", "description", "default", "examples", "$schema", "$id", "$comment", "format", "strict", "name"}
)
_KNOWN = _IGNORED | {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "$ref",
    "$defs",
    "definitions",
}
# llama.cpp expands a bounded repetition into that many nested rules: keep bounds modest
MAX_REPEAT = 1024


class UnsupportedSchema(ValueError):
    """The schema uses a keyword this converter does not enforce; the engine's own converter gets it."""


def schema_grammar(schema: Any) -> str:
    """The GBNF grammar (root rule `root`) whose sentences are the JSON texts `schema` allows (within the
    covered keywords; see the module). Raises UnsupportedSchema for anything else."""
    return _Writer(schema).write()


class _Writer:
    def __init__(self, schema: Any) -> None:
        self.top = schema
        self.rules: dict[str, str] = {}
        self.refs: dict[str, str] = {}  # a $ref's target -> its rule name

    def write(self) -> str:
        body = self.expr(self.top, "answer")
        self.base("ws")
        lines = [f"root ::= {body}", *self.rules.values()]
        return "\n".join(lines) + "\n"

    def base(self, name: str) -> str:
        if name not in self.rules:
            self.rules[name] = _BASE[name]
            for need in _NEEDS.get(name, ()):
                self.base(need)
        return name

    def rule(self, name: str, expr: str) -> str:
        """A named rule for `expr` (names made unique), returned by name."""
        stem = re.sub(r"[^a-zA-Z0-9-]+", "-", name).strip("-") or "r"
        unique, n = stem, 1
        while unique in self.rules or unique in _BASE or unique == "root":
            n += 1
            unique = f"{stem}-{n}"
        self.rules[unique] = f"{unique} ::= {expr}"
        return unique

    def expr(self, schema: Any, name: str) -> str:
        if schema is True or schema == {}:
            return self.base("value")
        if not isinstance(schema, dict):
            raise UnsupportedSchema(f"a schema must be an object, not {schema!r}")
        unknown = sorted(set(schema) - _KNOWN)
        if unknown:
            raise UnsupportedSchema(f"keywords not enforced here: {', '.join(unknown)}")
        if "$ref" in schema:
            return self.ref(schema["$ref"])
        if "const" in schema:
            return _literal(schema["const"])
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise UnsupportedSchema("enum must be a non-empty list")
            return "(" + " | ".join(_literal(v) for v in values) + ")"
        for key in ("anyOf", "oneOf"):
            if key in schema:
                options = schema[key]
                if not isinstance(options, list) or not options:
                    raise UnsupportedSchema(f"{key} must be a non-empty list")
                parts = [self.expr(s, f"{name}-{i}") for i, s in enumerate(options)]
                return "(" + " | ".join(parts) + ")"
        kind = schema.get("type")
        if isinstance(kind, list):
            parts = [self.expr({**schema, "type": k}, f"{name}-{k}") for k in kind]
            return "(" + " | ".join(parts) + ")"
        if kind == "object" or (kind is None and "properties" in schema):
            return self.object(schema, name)
        if kind == "array":
            return self.array(schema, name)
        if kind == "string":
            return self.string(schema, name)
        if kind in _TYPES:
            return self.base(str(kind))
        if kind is None:
            return self.base("value")
        raise UnsupportedSchema(f"unknown type {kind!r}")

    def ref(self, ref: Any) -> str:
        if not isinstance(ref, str) or not ref.startswith("#/"):
            raise UnsupportedSchema(f"only local $refs are followed, not {ref!r}")
        if ref in self.refs:
            return self.refs[ref]
        target: Any = self.top
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise UnsupportedSchema(f"$ref {ref!r} points at nothing")
            target = target[part]
        name = self.rule(ref.rsplit("/", 1)[-1], "ws")  # reserved first: a schema may refer to itself
        self.refs[ref] = name
        self.rules[name] = f"{name} ::= {self.expr(target, name + '-def')}"
        return name

    def object(self, schema: dict[str, Any], name: str) -> str:
        props = schema.get("properties") or {}
        if not isinstance(props, dict):
            raise UnsupportedSchema("properties must be an object")
        extra = schema.get("additionalProperties", False if props else True)
        if extra not in (False, True, {}) or (extra is not False and props):
            # a closed object is what structured output asks for; open ones with listed keys are not written
            raise UnsupportedSchema("additionalProperties beside properties is not enforced here")
        required = set(schema.get("required") or ())
        if not required <= set(props):
            raise UnsupportedSchema("required names a key that properties does not describe")
        if not props:
            return self.base("object-any") if extra is not False else self.rule(name, '"{" ws "}"')
        self.base("ws")
        members = [
            (f'{_literal(key)} ws ":" ws {self.expr(sub, f"{name}-{key}")}', key in required)
            for key, sub in props.items()
        ]
        return self.rule(name, '"{" ws ' + _members(members) + ' ws "}"')

    def array(self, schema: dict[str, Any], name: str) -> str:
        item = self.expr(schema.get("items", {}), f"{name}-item")
        low, high = _bounds(schema, "minItems", "maxItems")
        self.base("ws")
        if high == 0:
            return self.rule(name, '"[" ws "]"')
        rest = f'("," ws {item} ws){_repeat(max(low - 1, 0), None if high is None else high - 1)}'
        body = f"{item} ws {rest}"
        return self.rule(name, f'"[" ws {body if low > 0 else "(" + body + ")?"} "]"')

    def string(self, schema: dict[str, Any], name: str) -> str:
        if "minLength" not in schema and "maxLength" not in schema:
            return self.base("string")
        low, high = _bounds(schema, "minLength", "maxLength")
        self.base("char")
        return self.rule(name, f'"\\"" char{_repeat(low, high)} "\\""')


def _members(members: list[tuple[str, bool]]) -> str:
    """Object members in their listed order, each optional one skippable, commas only between those sent."""
    if not members:
        return ""
    (first, required), rest = members[0], members[1:]
    after = "".join(f' ws ("," ws {m})' + ("" if req else "?") for m, req in rest)
    if required:
        return first + after
    if not rest:
        return f"({first})?"
    # the first is optional: either it and the rest with commas, or the rest alone
    return f"({first}{after} | {_members(rest)})"


def _bounds(schema: dict[str, Any], low_key: str, high_key: str) -> tuple[int, int | None]:
    low, high = schema.get(low_key, 0), schema.get(high_key)
    whole = [v for v in (low, high) if v is not None]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in whole) or (
        high is not None and low > high
    ):
        raise UnsupportedSchema(f"{low_key}/{high_key} must be whole numbers, the first not above the second")
    if max(whole) > MAX_REPEAT:
        raise UnsupportedSchema(f"{low_key}/{high_key} above {MAX_REPEAT} are not written here")
    return low, high


def _repeat(low: int, high: int | None) -> str:
    if high is None:
        return "*" if low == 0 else f"{{{low},}}"
    return f"{{{low},{high}}}"


def _literal(value: Any) -> str:
    """A GBNF string literal matching exactly the compact JSON text of `value`."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped}"'
