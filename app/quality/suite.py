"""Reading an eval suite: a YAML file, JSON lines of cases, or the name of a built-in suite.

YAML (or a JSON object) holds `name`, optional `threshold` (0..1), optional `defaults` (request parameters
every case gets, such as max_tokens) and `cases`. A JSON-lines file holds one case per line. A case is
`id`, `prompt` (or `messages`), `expect` (one scorer and its options), optional `weight` and `params`
(extra request fields: max_tokens, temperature, grammar, response_format...).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from app.quality.score import Scorer, SuiteError, scorer_from_spec

BUILTIN_PACKAGE = "app.quality.suites"
MAX_CASES = 10_000
SUITE_SUFFIXES = (".yaml", ".yml", ".json", ".jsonl")
MAX_SUITE_BYTES = 16 << 20
# YAML aliases repeat a node without copying it: nine nested lists of nine aliases are 9^9 nodes to any
# reader of the document. A suite of 10,000 cases is far below this many nodes once expanded.
MAX_EXPANDED_NODES = 200_000
# request fields a case may not set: the runner owns the model and the (non-)streaming
RESERVED_PARAMS = frozenset({"model", "messages", "stream"})


@dataclass(frozen=True, kw_only=True)
class Case:
    id: str
    messages: tuple[Mapping[str, Any], ...]
    scorer: Scorer
    weight: float = 1.0
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Suite:
    name: str
    cases: tuple[Case, ...]
    threshold: float | None = None
    source: str = ""

    @property
    def total_weight(self) -> float:
        return sum(c.weight for c in self.cases)


def builtin_names() -> list[str]:
    return sorted(
        p.name.removesuffix(".yaml")
        for p in resources.files(BUILTIN_PACKAGE).iterdir()
        if p.name.endswith(".yaml")
    )


def load_suite(ref: str, *, folder: Path | None = None) -> Suite:
    """A suite by built-in name or file; SuiteError names what is wrong and where. With `folder` (the
    server's suites folder) a file is read only from inside it: a bare name is looked up there, and a path
    that leads out of it (`..`, a symlink) is refused unread. Without it (the CLI, reading a user's own
    file for them) any path is read."""
    if ref in builtin_names():
        text = resources.files(BUILTIN_PACKAGE).joinpath(f"{ref}.yaml").read_text(encoding="utf-8")
        return _parse(text, source=f"built-in suite {ref}", jsonl=False, default_name=ref)
    path = _in_folder(ref, folder) if folder is not None else Path(ref).expanduser()
    if path.is_file():
        return _parse(read_suite_file(path), source=str(path), jsonl=path.suffix.lower() == ".jsonl")
    where = f" in {folder}" if folder is not None else ""
    raise SuiteError(
        f"no suite file {ref!r}{where} and no built-in suite of that name; give a .yaml/.json/.jsonl file or "
        f"one of: {', '.join(builtin_names())}"
    )


def _in_folder(ref: str, folder: Path) -> Path:
    """`ref` inside `folder` (a bare name may leave out its suffix), or SuiteError before anything is
    read: the server opens no file outside the place the docs name (docs/evals.md#where-suites-live)."""
    root = folder.resolve()
    given = Path(ref).expanduser()
    path = (given if given.is_absolute() else root / given).resolve()
    if not path.is_relative_to(root):
        raise SuiteError(
            f"the server reads suite files only from its suites folder, {root}: put the suite there and "
            "give its name, or send its content (`switchyard eval --suite FILE` reads a file from anywhere "
            "and sends it)"
        )
    if not path.exists() and not path.suffix:
        for suffix in SUITE_SUFFIXES:
            if path.with_suffix(suffix).is_file():
                return path.with_suffix(suffix)
    return path


def read_suite_file(path: Path) -> str:
    """The text of a suite file: only suite files are read, and their text is never quoted back."""
    if path.suffix.lower() not in SUITE_SUFFIXES:
        raise SuiteError(
            f"{path} is not a suite file: a suite is a {', '.join(SUITE_SUFFIXES)} file; rename it or give a "
            "built-in suite name"
        )
    if path.stat().st_size > MAX_SUITE_BYTES:
        raise SuiteError(f"{path} is over {MAX_SUITE_BYTES >> 20} MiB; split the suite")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SuiteError(f"{path} is not UTF-8 text; save the suite as UTF-8") from None


def placed_suite(ref: str, *, folder: Path) -> str:
    """What to give the server for `ref` when it keeps the name to read later (a gate, a gated update): a
    built-in name as it is; a suite file's name in `folder`, where a file from elsewhere is copied first
    (checked as a suite on the way). A different suite of that name already there is refused."""
    path = Path(ref).expanduser()
    if ref in builtin_names() or not path.is_file():
        return ref
    text = read_suite_file(path)
    root = folder.resolve()
    if path.resolve().parent == root:
        return path.name
    _parse(text, source=str(path), jsonl=path.suffix.lower() == ".jsonl")
    placed = root / path.name
    if placed.exists() and placed.read_bytes() != text.encode("utf-8"):
        raise SuiteError(
            f"{placed} is another suite of the same name; rename {path.name} (the server reads suites "
            f"only from {root})"
        )
    root.mkdir(parents=True, exist_ok=True)
    placed.write_text(text, encoding="utf-8")
    return path.name


def suite_from_text(text: str, *, name: str) -> Suite:
    """A suite a client sent as text; `name` is its file's name (a .jsonl one holds a case per line)."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SUITE_BYTES:
        raise SuiteError(f"suite {name!r} is over {MAX_SUITE_BYTES >> 20} MiB; split the suite")
    jsonl = name.lower().endswith(".jsonl")
    return _parse(text, source=name, jsonl=jsonl, default_name=Path(name).stem if name else None)


def _parse(text: str, *, source: str, jsonl: bool, default_name: str | None = None) -> Suite:
    name = default_name or Path(source).stem
    if jsonl:
        return _from_doc({"name": name, "cases": _jsonl_cases(text, source)}, source=source)
    doc = _yaml_doc(text, source=source)
    if not isinstance(doc, dict):
        raise SuiteError(f"{source} must hold a mapping with `cases` (or be a .jsonl file of cases)")
    doc.setdefault("name", name)
    return _from_doc(doc, source=source)


def _yaml_doc(text: str, *, source: str) -> Any:
    """The document, its aliases bounded (MAX_EXPANDED_NODES) before anything walks it; an error names the
    line and column and the problem, never the file's text."""
    import yaml  # JSON is YAML, so one reader covers .yaml and .json

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if (size := _expanded_size(node, {})) > MAX_EXPANDED_NODES:
            raise SuiteError(
                f"{source} expands to over {MAX_EXPANDED_NODES} values through its YAML aliases ({size} "
                "at least); write the cases out, or use fewer aliases"
            )
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = _unquoted(e.problem or e.context or "a syntax error")
        raise SuiteError(
            f"{source} is not valid YAML/JSON{where}: {problem}; fix the file and run again"
        ) from None
    except (yaml.YAMLError, RecursionError) as e:
        raise SuiteError(
            f"{source} is not valid YAML/JSON ({type(e).__name__}); fix the file and run again"
        ) from None
    finally:
        loader.dispose()


def _expanded_size(node: Any, seen: dict[int, int]) -> int:
    """How many nodes `node` is once every alias is expanded (a shared node counted at each use), stopping
    early past the bound; `seen` memoizes shared nodes so the count itself stays cheap."""
    if id(node) in seen:
        return seen[id(node)]
    total = 1
    if isinstance(node.value, list):
        for item in node.value:
            for child in item if isinstance(item, tuple) else (item,):
                total += _expanded_size(child, seen)
                if total > MAX_EXPANDED_NODES:
                    break
            if total > MAX_EXPANDED_NODES:
                break
    seen[id(node)] = total
    return total


def _unquoted(problem: str) -> str:
    """A parser's message without the text it quotes from the file."""
    return re.sub(r"'[^']*'|\"[^\"]*\"", "(...)", problem)


def _jsonl_cases(text: str, source: str) -> list[Any]:
    cases = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            cases.append(json.loads(line))
        except ValueError as e:
            raise SuiteError(f"{source} line {number} is not JSON: {e}") from None
    return cases


def _threshold(value: Any, source: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise SuiteError(f"{source}: threshold must be a number from 0 to 1, got {value!r}")
    return float(value)


def _from_doc(doc: Mapping[str, Any], *, source: str) -> Suite:
    raw_cases = doc.get("cases")
    if not isinstance(raw_cases, list) or not raw_cases:
        raise SuiteError(f"{source} has no cases: give a non-empty `cases` list")
    if len(raw_cases) > MAX_CASES:
        raise SuiteError(f"{source} has {len(raw_cases)} cases; split it (at most {MAX_CASES})")
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise SuiteError(f"{source}: defaults must be a mapping of request parameters")
    cases, seen = [], set()
    for index, raw in enumerate(raw_cases, start=1):
        case = _case(raw, index=index, source=source, defaults=defaults)
        if case.id in seen:
            raise SuiteError(f"{source}: two cases have the id {case.id!r}; ids must be unique")
        seen.add(case.id)
        cases.append(case)
    return Suite(
        name=str(doc["name"]),
        cases=tuple(cases),
        threshold=_threshold(doc.get("threshold"), source),
        source=source,
    )


def _messages(raw: Mapping[str, Any], where: str) -> tuple[Mapping[str, Any], ...]:
    if "messages" in raw:
        messages = raw["messages"]
        ok = (
            isinstance(messages, list)
            and messages
            and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in messages
            )
        )
        if not ok:
            raise SuiteError(f"{where}: messages must be a list of {{role, content}} mappings")
        return tuple(messages)
    prompt = raw.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise SuiteError(f"{where}: give a `prompt` text or a `messages` list")
    system = raw.get("system")
    head = ({"role": "system", "content": str(system)},) if system else ()
    return (*head, {"role": "user", "content": prompt})


def _case(raw: Any, *, index: int, source: str, defaults: Mapping[str, Any]) -> Case:
    where = f"{source} case {index}"
    if not isinstance(raw, dict):
        raise SuiteError(f"{where} must be a mapping with prompt and expect")
    case_id = str(raw.get("id") or f"case-{index}")
    where = f"{source} case {case_id!r}"
    messages = _messages(raw, where)
    weight = raw.get("weight", 1)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
        raise SuiteError(f"{where}: weight must be a positive number")
    params = {**defaults, **(raw.get("params") or {})}
    reserved = sorted(RESERVED_PARAMS & set(params))
    if reserved:
        raise SuiteError(f"{where}: params may not set {', '.join(reserved)} (the runner sets them)")
    question = str(messages[-1].get("content", ""))
    return Case(
        id=case_id,
        messages=messages,
        scorer=scorer_from_spec(raw.get("expect"), where=where, question=question),
        weight=float(weight),
        params=params,
    )
