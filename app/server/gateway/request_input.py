"""The one reader of what a client sends: JSON bodies, the headers that frame them, query parameters.

Whatever the bytes, the answer is a 4xx envelope that names the field, never a 500:

- a body comes uncompressed (any Content-Encoding but identity is a 415: aiohttp's own decoding is off,
  see app/server/limits.py, which reads every body once, after `check_body_headers`);
- a JSON body is declared as JSON; the admin API takes nothing else (415), so that a browser cannot send it
  cross-site without a preflight; the client API also takes no type (scripts) and curl's default form type;
- the JSON is UTF-8, at most MAX_DEPTH deep, and holds no NaN or Infinity, no integer outside int64 (C
  engines and SQLite overflow), no lone surrogate in any string, and no NUL outside the conversation's
  text (a NUL in a name or a path breaks the C and OS calls it reaches; in a message it is just a
  character a model may have written, and the client sends its history back);
- a query number is ASCII digits within bounds (Python's int() also reads '٣' and '²' is a digit).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from aiohttp import web

from app.core.errors import BadRequestError, MalformedJSONError, UnsupportedMediaTypeError

MAX_DEPTH = 64  # deep enough for any tool schema; deeper is an attack on recursive code downstream
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
MAX_PATH = 4096  # PATH_MAX on Linux; one component is at most NAME_MAX bytes
NAME_MAX = 255
# routes whose body is an upload (OpenAI's multipart shape), not JSON
MULTIPART_PATHS = frozenset({"/v1/audio/transcriptions", "/v1/audio/translations"})
_LENIENT_TYPES = frozenset({"", "application/x-www-form-urlencoded"})  # scripts, and curl -d
_UTF8 = frozenset({"utf-8", "utf8", "us-ascii", "ascii"})
_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# top-level fields that hold what was said (any depth below them), where a NUL is text, not a name
TEXT_FIELDS = frozenset(
    {"messages", "prompt", "input", "system", "instructions", "documents", "query", "suffix", "stop", "text"}
)


# ---- body headers -------------------------------------------------------------------------------------
def check_body_headers(request: web.Request, *, strict: bool) -> None:
    """Refuse (415) a body in an encoding or media type we do not read; `strict` (the admin API) takes
    JSON only."""
    coded = request.headers.get("Content-Encoding", "identity").strip().lower()
    if coded not in ("", "identity"):
        # nothing this server talks to compresses a request body; decoding one is attack surface only
        raise UnsupportedMediaTypeError(
            f"Content-Encoding {coded[:40]!r} is not accepted for request bodies; send the body uncompressed"
        )
    raw_type = request.headers.get("Content-Type", "")
    media = raw_type.split(";", 1)[0].strip().lower()
    if request.path in MULTIPART_PATHS and media == "multipart/form-data":
        return
    if media == "application/json" or media.endswith("+json"):
        charset = (request.charset or "utf-8").lower()
        if charset not in _UTF8:
            raise UnsupportedMediaTypeError(f"charset {charset!r} is not read here; send JSON as UTF-8")
        return
    if strict or media not in _LENIENT_TYPES:
        raise UnsupportedMediaTypeError(
            f"Content-Type {raw_type or '(none)'!r} is not accepted on {request.path}; send the body as "
            "JSON with Content-Type: application/json"
        )


# ---- JSON bodies --------------------------------------------------------------------------------------
def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The JSON object in `raw`, checked value by value (see the module docstring)."""
    if not raw.strip():
        raise MalformedJSONError("the request body is empty; send a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedJSONError(
            f"the request body is not UTF-8 (bad byte at offset {exc.start}); send JSON encoded as UTF-8"
        ) from exc
    numbers = _Numbers()
    try:
        # NaN and Infinity become floats here, so the walk below can name the field that holds one
        body = json.loads(
            text.removeprefix("\ufeff"),
            parse_int=numbers.int_,
            parse_float=numbers.float_,
            parse_constant=numbers.constant,
        )
    except json.JSONDecodeError as exc:
        raise MalformedJSONError(
            f"the request body is not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from exc
    except RecursionError as exc:
        raise MalformedJSONError(f"the request body nests deeper than {MAX_DEPTH} levels") from exc
    except ValueError as exc:  # an integer of more than 4300 digits
        raise MalformedJSONError(f"the request body holds a number too long to read: {exc}") from exc
    if not isinstance(body, dict):
        raise MalformedJSONError(f"the request body must be a JSON object, not {type(body).__name__}")
    # the walk costs several times the parse (a path string per value): a body that cannot hold what it
    # looks for skips it. A NUL or a surrogate can only come from a \u escape (the text is strict UTF-8 and
    # JSON refuses raw control characters), a bad number was seen by the parser, and depth needs no paths.
    if numbers.suspect or _MAYBE_BAD_ESCAPE.search(text) or not _within_depth(body):
        check_values(body)  # names the field at fault
    return body


# the escapes that can make a NUL or a surrogate (a false alarm, such as an escaped backslash before "u"
# or an emoji's surrogate pair, only costs the walk)
_MAYBE_BAD_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")


_CONSTANTS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}  # as json reads them


class _Numbers:
    """json.loads hooks that read numbers as json does and note one the walk would refuse."""

    __slots__ = ("suspect",)

    def __init__(self) -> None:
        self.suspect = False

    def int_(self, text: str) -> int:
        value = int(text)
        if len(text) > 18 and not INT_MIN <= value <= INT_MAX:
            self.suspect = True
        return value

    def float_(self, text: str) -> float:
        value = float(text)
        if not math.isfinite(value):  # 1e999 reads as infinity
            self.suspect = True
        return value

    def constant(self, name: str) -> float:
        self.suspect = True
        return _CONSTANTS[name]


def _within_depth(doc: Any) -> bool:
    """Whether no container of `doc` sits MAX_DEPTH levels deep (containers only: scalars are skipped)."""
    stack: list[tuple[Any, int]] = [(doc, 0)]
    while stack:
        value, depth = stack.pop()
        if depth >= MAX_DEPTH:
            return False
        for item in value.values() if isinstance(value, dict) else value:
            if isinstance(item, dict | list):
                stack.append((item, depth + 1))
    return True


def check_values(doc: Any) -> None:
    """Walk `doc` without recursion; the first hostile value is a 400 naming where it is."""
    stack: list[tuple[Any, str, int]] = [(doc, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth >= MAX_DEPTH:
                raise MalformedJSONError(
                    f"the request body nests deeper than {MAX_DEPTH} levels (at {_short(where)})",
                    param=_short(where),
                )
            if isinstance(value, dict):
                for key, item in value.items():
                    path = f"{where}.{key}" if where else str(key)
                    _check_text(key, path)
                    stack.append((item, path, depth + 1))
            else:
                stack.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value))
        elif isinstance(value, str):
            _check_text(value, where, said=where.split(".", 1)[0].split("[", 1)[0] in TEXT_FIELDS)
        elif isinstance(value, bool):
            continue
        elif isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
            raise BadRequestError(
                f"field {_short(where)!r} holds an integer outside the 64-bit range; send a smaller number",
                param=_short(where),
            )
        elif isinstance(value, float) and not math.isfinite(value):
            raise BadRequestError(
                f"field {_short(where)!r} is NaN or infinite; send a finite number", param=_short(where)
            )


def _check_text(text: str, where: str, *, said: bool = False) -> None:
    found = (_SURROGATE if said else _BAD_TEXT).search(text)
    if found is None:
        return
    what = "a NUL character" if found.group() == "\x00" else "a lone UTF-16 surrogate (not text)"
    raise BadRequestError(f"field {_short(where)!r} holds {what}; remove it", param=_short(where))


def _short(where: str) -> str:
    return where if len(where) <= 120 else where[:117] + "..."


def path_text(body: dict[str, Any], name: str) -> str:
    """`body[name]` as a file system path, refused (400) when no file system could hold it."""
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise BadRequestError(f"{name!r} must be a path on this machine", param=name)
    too_long = len(value.encode()) > MAX_PATH or any(len(p.encode()) > NAME_MAX for p in value.split("/"))
    if too_long:
        raise BadRequestError(
            f"{name!r} is longer than a path can be ({MAX_PATH} bytes, {NAME_MAX} per name)", param=name
        )
    return value


# ---- query parameters ---------------------------------------------------------------------------------
def query_int(request: web.Request, name: str, *, default: int, low: int = 0, high: int = 2**31 - 1) -> int:
    """An integer query parameter of ASCII digits within [low, high]; absent or empty: `default`."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    digits = raw[1:] if raw.startswith("-") and low < 0 else raw
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 19) or not low <= int(raw) <= high:
        raise BadRequestError(
            f"{name!r} must be an integer from {low} to {high}, got {raw[:40]!r}", param=name
        )
    return int(raw)


def query_flag(request: web.Request, name: str, *, default: bool) -> bool:
    """A true/false query parameter (1/0, true/false, yes/no); absent or empty: `default`."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.lower()
    if lowered not in ("1", "0", "true", "false", "yes", "no"):
        raise BadRequestError(f"{name!r} must be true or false, got {raw[:40]!r}", param=name)
    return lowered in ("1", "true", "yes")
