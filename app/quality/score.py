"""How one answer is scored: each scorer turns a model's answer into a score between 0 and 1 and a reason.

Scorers are built from a case's `expect` mapping (see `scorer_from_spec`), so a suite file is data only.
A judge scorer asks another model through the same gateway, which is why scoring is async.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.core.errors import BadRequestError
from app.quality.patterns import PatternTimeout, SuitePattern, compile_pattern

# ask(model, messages, params) -> the answer's text; the runner supplies it (a chat request to the gateway)
Ask = Callable[[str, list[dict[str, Any]], Mapping[str, Any]], Awaitable[str]]


class SuiteError(BadRequestError):
    """A suite file or case that cannot be run; the message names the file, the case and the fix."""

    code = "invalid_suite"


@dataclass(frozen=True)
class Verdict:
    score: float  # 0..1
    reason: str


class Scorer(Protocol):
    @property
    def kind(self) -> str: ...

    async def score(self, answer: str, *, ask: Ask) -> Verdict: ...


def _strip_fences(text: str) -> str:
    """Models often wrap JSON or code in a Markdown fence; score what is inside it."""
    found = re.search(r"```[a-zA-Z0-9_-]*\s*\n(.*?)```", text, re.DOTALL)
    return (found.group(1) if found else text).strip()


@dataclass(frozen=True)
class Exact:
    expected: str
    ignore_case: bool = False
    kind: str = "exact"

    async def score(self, answer: str, *, ask: Ask) -> Verdict:
        got, want = answer.strip(), self.expected.strip()
        if self.ignore_case:
            got, want = got.casefold(), want.casefold()
        return Verdict(1.0, "exact match") if got == want else Verdict(0.0, f"expected {self.expected!r}")


@dataclass(frozen=True)
class Contains:
    needles: tuple[str, ...]
    ignore_case: bool = False
    kind: str = "contains"

    async def score(self, answer: str, *, ask: Ask) -> Verdict:
        text = answer.casefold() if self.ignore_case else answer
        missing = [n for n in self.needles if (n.casefold() if self.ignore_case else n) not in text]
        found = len(self.needles) - len(missing)
        if not missing:
            return Verdict(1.0, "contains every expected text")
        return Verdict(found / len(self.needles), f"missing {', '.join(repr(m) for m in missing)}")


@dataclass(frozen=True)
class Regex:
    pattern: SuitePattern
    kind: str = "regex"

    async def score(self, answer: str, *, ask: Ask) -> Verdict:
        try:  # in a thread, with a time limit: a suite's pattern may backtrack (app/quality/patterns.py)
            found = await asyncio.to_thread(self.pattern.found, answer)
        except PatternTimeout as exc:
            return Verdict(0.0, str(exc))
        if found:
            return Verdict(1.0, "matches the pattern")
        return Verdict(0.0, f"does not match /{self.pattern.source}/")


_NUMBER = re.compile(r"[-+]?(?:\d+(?:[.,]\d+)*(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?")


def first_number(text: str) -> float | None:
    """The first number in an answer ("The answer is 1,234.5." → 1234.5); None when there is none."""
    found = _NUMBER.search(text)
    if found is None:
        return None
    try:
        return float(found.group(0).replace(",", ""))
    except ValueError:
        return None


@dataclass(frozen=True)
class Number:
    expected: float
    tolerance: float = 0.0  # absolute
    rel_tolerance: float = 0.0  # relative to the expected value
    kind: str = "number"

    async def score(self, answer: str, *, ask: Ask) -> Verdict:
        got = first_number(answer)
        if got is None:
            return Verdict(0.0, "the answer holds no number")
        allowed = max(self.tolerance, abs(self.expected) * self.rel_tolerance)
        if math.isclose(got, self.expected, abs_tol=allowed + 1e-12, rel_tol=0.0):
            return Verdict(1.0, f"{got:g} is within {allowed:g} of {self.expected:g}")
        return Verdict(0.0, f"{got:g} is not within {allowed:g} of {self.expected:g}")


# The JSON Schema subset a suite may use; anything else is refused when the suite is read, never ignored.
SCHEMA_KEYS = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "enum",
        "const",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "pattern",
        "description",
        "title",
    }
)
_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def check_schema(schema: Any, *, where: str = "json_schema") -> None:
    """Refuse a schema that uses keywords outside the subset (they would silently pass otherwise)."""
    if not isinstance(schema, dict):
        raise SuiteError(f"{where} must be a mapping, got {type(schema).__name__}")
    unknown = sorted(set(schema) - SCHEMA_KEYS)
    if unknown:
        raise SuiteError(
            f"{where} uses {', '.join(unknown)}, outside the supported JSON Schema subset "
            f"({', '.join(sorted(SCHEMA_KEYS))}); rewrite the schema with those keywords"
        )
    types = schema.get("type")
    for name in [types] if isinstance(types, str) else types or []:
        if name not in _TYPES:
            raise SuiteError(f"{where}: unknown type {name!r}; use one of {', '.join(_TYPES)}")
    if "pattern" in schema:
        try:
            compile_pattern(str(schema["pattern"]))
        except ValueError as e:
            raise SuiteError(f"{where}: the pattern {schema['pattern']!r} does not compile: {e}") from None
    for key, sub in (schema.get("properties") or {}).items():
        check_schema(sub, where=f"{where}.properties.{key}")
    if isinstance(schema.get("items"), dict):
        check_schema(schema["items"], where=f"{where}.items")


# the lower and upper bound's keys, and how a value below or above reads (after its path), per kind of value
_NUMBER_BOUNDS = ("minimum", "maximum", "is below {}", "is above {}")
_STRING_BOUNDS = ("minLength", "maxLength", "is shorter than {}", "is longer than {}")
_LIST_BOUNDS = ("minItems", "maxItems", "has fewer than {} items", "has more than {} items")


def _outside(
    size: float, schema: Mapping[str, Any], bounds: tuple[str, str, str, str], path: str
) -> list[str]:
    """`size` (a number, or a string's or list's length) against the schema's `bounds`."""
    low, high, below, above = bounds
    out = []
    if low in schema and size < schema[low]:
        out.append(f"{path} {below.format(schema[low])}")
    if high in schema and size > schema[high]:
        out.append(f"{path} {above.format(schema[high])}")
    return out


def schema_errors(value: Any, schema: Mapping[str, Any], path: str = "$") -> list[str]:
    """Every way `value` breaks `schema` (the subset above), as readable paths; empty when it conforms."""
    errors: list[str] = []
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else list(types)
        if not any(_TYPES[n](value) for n in names):
            return [f"{path} should be {' or '.join(names)}, got {type(value).__name__}"]
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path} should be {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path} should be one of {schema['enum']!r}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        errors += _outside(value, schema, _NUMBER_BOUNDS, path)
    if isinstance(value, str):
        errors += _outside(len(value), schema, _STRING_BOUNDS, path)
        if "pattern" in schema:
            try:
                if not compile_pattern(str(schema["pattern"])).found(value):
                    errors.append(f"{path} does not match /{schema['pattern']}/")
            except PatternTimeout as exc:
                errors.append(f"{path}: {exc}")
    if isinstance(value, list):
        errors += _outside(len(value), schema, _LIST_BOUNDS, path)
        if isinstance(schema.get("items"), dict):
            for i, item in enumerate(value):
                errors += schema_errors(item, schema["items"], f"{path}[{i}]")
    if isinstance(value, dict):
        props: Mapping[str, Any] = schema.get("properties") or {}
        errors += [f"{path}.{k} is missing" for k in schema.get("required", []) if k not in value]
        for key, item in value.items():
            if key in props:
                errors += schema_errors(item, props[key], f"{path}.{key}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{path}.{key} is not allowed")
    return errors


@dataclass(frozen=True)
class JsonSchema:
    schema: Mapping[str, Any]
    kind: str = "json_schema"

    async def score(self, answer: str, *, ask: Ask) -> Verdict:
        try:
            value = json.loads(_strip_fences(answer))
        except ValueError as e:
            return Verdict(0.0, f"not JSON: {e}")
        errors = await asyncio.to_thread(schema_errors, value, self.schema)  # its patterns may be slow
        if errors:
            return Verdict(0.0, "; ".join(errors[:5]))
        return Verdict(1.0, "valid JSON matching the schema")


_JUDGE_SCORE = re.compile(r"\bscore\s*[:=]\s*(\d+(?:\.\d+)?)\s*(?:/\s*(\d+))?", re.IGNORECASE)


def judge_prompt(rubric: str, *, question: str, answer: str) -> list[dict[str, Any]]:
    """The judge sees the rubric, the question and the answer, and is asked for one line `Score: N/10`."""
    system = (
        "You grade answers. Read the rubric, the question and the answer. Reply with one line "
        "'Score: N/10' where N is 0 (fails the rubric) to 10 (meets it fully), then one line of reason."
    )
    user = f"Rubric:\n{rubric}\n\nQuestion:\n{question}\n\nAnswer:\n{answer}"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def parse_judge(text: str) -> Verdict:
    """Read `Score: N/10` (or PASS/FAIL) from a judge's reply; an unreadable reply scores 0 and says so."""
    found = _JUDGE_SCORE.search(text)
    if found:
        out_of = float(found.group(2) or 10)
        value = min(max(float(found.group(1)) / out_of, 0.0), 1.0) if out_of > 0 else 0.0
        return Verdict(value, f"judge: {text.strip().splitlines()[0][:200]}")
    word = text.strip().split()[0].strip(".:").upper() if text.strip() else ""
    if word in ("PASS", "FAIL"):
        return Verdict(1.0 if word == "PASS" else 0.0, f"judge: {word}")
    return Verdict(0.0, f"the judge's reply holds no 'Score: N/10': {text.strip()[:120]!r}")


@dataclass(frozen=True)
class Judge:
    model: str
    rubric: str
    question: str = ""  # filled with the case's last user message when the suite is read
    # extra request fields for the judge, e.g. a grammar that holds it to the `Score: N/10` line
    params: Mapping[str, Any] = field(default_factory=dict)
    kind: str = "judge"

    async def score(self, answer: str, *, ask: Ask) -> Verdict:
        reply = await ask(
            self.model,
            judge_prompt(self.rubric, question=self.question, answer=answer),
            {"temperature": 0, "max_tokens": 64, **self.params},
        )
        return parse_judge(reply)


def _bool(spec: Mapping[str, Any], key: str, where: str) -> bool:
    value = spec.get(key, False)
    if not isinstance(value, bool):
        raise SuiteError(f"{where}: {key} must be true or false")
    return value


def scorer_from_spec(spec: Any, *, where: str, question: str = "") -> Scorer:
    """Build the scorer a case's `expect` names: exactly one of exact, contains, regex, number,
    json_schema, judge (with its options beside it)."""
    if not isinstance(spec, dict):
        raise SuiteError(f"{where}: expect must be a mapping such as {{exact: '42'}}")
    kinds = [k for k in ("exact", "contains", "regex", "number", "json_schema", "judge") if k in spec]
    if len(kinds) != 1:
        raise SuiteError(
            f"{where}: expect names {len(kinds)} scorers ({', '.join(kinds) or 'none'}); give exactly one of "
            "exact, contains, regex, number, json_schema, judge"
        )
    kind, value = kinds[0], spec[kinds[0]]
    if kind == "exact":
        return Exact(str(value), ignore_case=_bool(spec, "ignore_case", where))
    if kind == "contains":
        needles = tuple(str(v) for v in (value if isinstance(value, list) else [value]))
        if not needles:
            raise SuiteError(f"{where}: contains needs at least one text")
        return Contains(needles, ignore_case=_bool(spec, "ignore_case", where))
    if kind == "regex":
        try:
            return Regex(compile_pattern(str(value), ignore_case=bool(spec.get("ignore_case"))))
        except ValueError as e:
            raise SuiteError(f"{where}: the regex {value!r} does not compile: {e}") from None
    if kind == "number":
        try:
            return Number(
                float(value),
                tolerance=float(spec.get("tolerance", 0)),
                rel_tolerance=float(spec.get("rel_tolerance", 0)),
            )
        except (TypeError, ValueError):
            raise SuiteError(f"{where}: number, tolerance and rel_tolerance must be numbers") from None
    if kind == "json_schema":
        check_schema(value, where=f"{where}.json_schema")
        return JsonSchema(value)
    if not isinstance(value, dict) or not isinstance(value.get("model"), str) or not value.get("rubric"):
        raise SuiteError(f"{where}: judge needs {{model: <a model id>, rubric: <what a good answer does>}}")
    params = value.get("params") or {}
    if not isinstance(params, dict):
        raise SuiteError(f"{where}: judge params must be a mapping of request fields")
    return Judge(value["model"], str(value["rubric"]), question=question, params=params)
