"""Eval suites (app/quality): scorers, suite files, the SQLite run store, and whole runs against a real
`switchyard serve` whose tiny random-weight model is held to known answers by grammars."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from app.core.errors import ServerNotRunningError
from app.quality.runner import http_ask, run_suite
from app.quality.score import SuiteError, first_number, parse_judge, scorer_from_spec
from app.quality.store import EvalStore
from app.quality.suite import builtin_names, load_suite
from tests.conftest import ServerProcess, link_models, running_server


async def _never(model: str, messages: list[dict[str, Any]], params: Any) -> str:
    raise AssertionError("a scorer that needs no judge asked one")


def _score(spec: dict[str, Any], answer: str) -> float:
    return asyncio.run(scorer_from_spec(spec, where="t").score(answer, ask=_never)).score


# ---- scorers --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "answer", "expected"),
    [
        ({"exact": "42"}, " 42\n", 1.0),
        ({"exact": "Paris"}, "paris", 0.0),
        ({"exact": "Paris", "ignore_case": True}, "paris", 1.0),
        ({"contains": ["red", "blue"]}, "red and green", 0.5),
        ({"contains": "blue"}, "sky blue", 1.0),
        ({"regex": r"^\d{3}-\d{4}$"}, "555-1234", 1.0),
        ({"regex": r"^\d{3}-\d{4}$"}, "call 555-1234", 0.0),
        ({"number": 42}, "The answer is 42.", 1.0),
        ({"number": 1234.5}, "about 1,234.5 units", 1.0),
        ({"number": 3.25, "tolerance": 0.01}, "3.26", 1.0),
        ({"number": 3.25, "tolerance": 0.001}, "3.26", 0.0),
        ({"number": 200, "rel_tolerance": 0.1}, "215", 1.0),
        ({"number": 7}, "seven", 0.0),
        ({"json_schema": {"type": "object", "required": ["a"]}}, '```json\n{"a": 1}\n```', 1.0),
        ({"json_schema": {"type": "object", "required": ["a"]}}, '{"b": 1}', 0.0),
        ({"json_schema": {"type": "array", "items": {"type": "integer"}}}, "[1, 2, 3.5]", 0.0),
        ({"json_schema": {"type": "object", "additionalProperties": False}}, '{"x": 1}', 0.0),
        ({"json_schema": {"type": "integer"}}, "true", 0.0),  # a bool is not an integer
        ({"json_schema": {"type": "string"}}, "not json", 0.0),
    ],
)
def test_scorers(spec: dict[str, Any], answer: str, expected: float) -> None:
    assert _score(spec, answer) == pytest.approx(expected)


def test_number_reading_and_judge_replies() -> None:
    assert first_number("no digits") is None
    assert first_number("-3e2 degrees") == -300
    assert parse_judge("Score: 7/10\nclear and right").score == pytest.approx(0.7)
    assert parse_judge("score = 3").score == pytest.approx(0.3)
    assert parse_judge("PASS. it works").score == 1.0
    unreadable = parse_judge("I think it is good")
    assert unreadable.score == 0.0 and "Score: N/10" in unreadable.reason


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({}, "exactly one"),
        ({"exact": "a", "regex": "b"}, "exactly one"),
        ({"regex": "("}, "does not compile"),
        ({"number": "lots"}, "must be numbers"),
        ({"json_schema": {"type": "object", "oneOf": []}}, "outside the supported JSON Schema subset"),
        ({"json_schema": {"type": "decimal"}}, "unknown type"),
        ({"judge": {"rubric": "be right"}}, "judge needs"),
        ("42", "must be a mapping"),
    ],
)
def test_bad_scorer_specs_say_what_to_fix(spec: Any, fragment: str) -> None:
    with pytest.raises(SuiteError, match=fragment):
        scorer_from_spec(spec, where="suite.yaml case 'c'")


# ---- suite files ----------------------------------------------------------------------------------
def test_builtin_suites_load() -> None:
    assert {"arithmetic", "json-format"} <= set(builtin_names())
    arithmetic = load_suite("arithmetic")
    assert arithmetic.threshold == 0.8 and len(arithmetic.cases) >= 5
    assert all(c.params.get("temperature") == 0 for c in arithmetic.cases)
    assert load_suite("json-format").cases[0].scorer.kind == "json_schema"


def test_jsonl_and_yaml_files(tmp_path: Path) -> None:
    lines = tmp_path / "mine.jsonl"
    lines.write_text(
        '{"id": "a", "prompt": "2+2?", "expect": {"number": 4}}\n# a comment\n\n'
        '{"messages": [{"role": "user", "content": "hi"}], "expect": {"contains": "hi"}, "weight": 3}\n'
    )
    suite = load_suite(str(lines))
    assert suite.name == "mine" and [c.id for c in suite.cases] == ["a", "case-2"]
    assert suite.total_weight == 4 and suite.threshold is None
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "x", "expect": {"exact": "y"}}\n{"prompt": \n')
    with pytest.raises(SuiteError, match="line 2 is not JSON"):
        load_suite(str(broken))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("cases: [", "not valid YAML"),
        ("- 1\n- 2\n", "must hold a mapping"),
        ("cases: []\n", "no cases"),
        (
            "threshold: 2\ncases: [{prompt: x, expect: {exact: y}}]\n",
            "threshold must be a number from 0 to 1",
        ),
        (
            "cases: [{id: a, prompt: x, expect: {exact: y}}, {id: a, prompt: z, expect: {exact: y}}]\n",
            "unique",
        ),
        ("cases: [{prompt: x, expect: {exact: y}, params: {model: other}}]\n", "may not set model"),
        ("cases: [{expect: {exact: y}}]\n", "prompt"),
        ("cases: [{prompt: x, expect: {exact: y}, weight: 0}]\n", "weight must be a positive number"),
    ],
)
def test_bad_suite_files_name_the_problem(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "suite.yaml"
    path.write_text(text)
    with pytest.raises(SuiteError, match=fragment):
        load_suite(str(path))


def test_unknown_suite_lists_the_builtins() -> None:
    with pytest.raises(SuiteError, match="arithmetic"):
        load_suite("no-such-suite")


# ---- whole runs through a real gateway ------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("evals")
    models = link_models(base / "models", model_store / "tiny.gguf")
    with running_server(base / "home", models) as s:
        yield s


def _pinned(text: str) -> dict[str, Any]:
    """Request fields that hold the random-weight model to exactly `text`."""
    return {"grammar": f"root ::= {json.dumps(text)}", "max_tokens": 16}


def _suite_file(tmp_path: Path) -> Path:
    doc = {
        "name": "pinned",
        "threshold": 0.7,
        "cases": [
            {
                "id": "right",
                "prompt": "17+25?",
                "expect": {"number": 42},
                "params": _pinned("42"),
                "weight": 2,
            },
            {"id": "wrong", "prompt": "12*11?", "expect": {"number": 132}, "params": _pinned("131")},
            {
                "id": "json",
                "prompt": "json",
                "expect": {"json_schema": {"type": "object", "required": ["ok"]}},
                "params": _pinned('{"ok": true}'),
            },
            {
                "id": "judged",
                "prompt": "explain",
                "params": _pinned("because"),
                "expect": {
                    "judge": {"model": "tiny", "rubric": "gives a reason", "params": _pinned("Score: 6/10")}
                },
            },
        ],
    }
    path = tmp_path / "pinned.yaml"
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


async def _run(server: ServerProcess, suite_path: Path, store: EvalStore, **kw: Any) -> Any:
    async with aiohttp.ClientSession() as session:
        return await run_suite(
            load_suite(str(suite_path)), model="tiny", ask=http_ask(session, server.api), store=store, **kw
        )


def test_a_run_scores_records_and_gates(server: ServerProcess, tmp_path: Path) -> None:
    store = EvalStore(tmp_path / "evals.db")
    outcome = asyncio.run(_run(server, _suite_file(tmp_path), store))
    by_id = {c.case_id: c for c in outcome.cases}
    assert by_id["right"].score == 1.0 and by_id["right"].answer == "42"
    assert by_id["wrong"].score == 0.0 and "131" in by_id["wrong"].reason
    assert by_id["json"].score == 1.0
    assert by_id["judged"].score == pytest.approx(0.6) and "Score: 6/10" in by_id["judged"].reason
    # weighted: (2*1 + 0 + 1 + 0.6) / 5
    assert outcome.score == pytest.approx(3.6 / 5) and outcome.passed is True
    stricter = asyncio.run(_run(server, _suite_file(tmp_path), store, threshold=0.9))
    assert stricter.passed is False
    runs = store.runs(model="tiny")
    assert [r.id for r in runs] == [stricter.run_id, outcome.run_id]
    assert runs[0].passed is False and runs[1].passed is True and runs[0].cases == 4
    assert [c.case_id for c in store.case_results(outcome.run_id or 0)] == [
        "right",
        "wrong",
        "json",
        "judged",
    ]
    assert store.last_scores()["tiny"]["id"] == stricter.run_id
    # the file is real SQLite another process can read
    with sqlite3.connect(tmp_path / "evals.db") as db:
        assert db.execute("SELECT COUNT(*) FROM case_results").fetchone()[0] == 8


def test_a_failing_request_scores_zero_and_the_run_goes_on(server: ServerProcess, tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        json.dumps(
            {
                "cases": [
                    {
                        "id": "bad-grammar",
                        "prompt": "x",
                        "expect": {"exact": "y"},
                        "params": {"grammar": "root ::= ("},
                    },
                    {"id": "ok", "prompt": "x", "expect": {"exact": "y"}, "params": _pinned("y")},
                ]
            }
        )
    )
    outcome = asyncio.run(_run(server, path, EvalStore(tmp_path / "e.db")))
    first, second = outcome.cases
    assert first.score == 0.0 and "the gateway answered 4" in first.reason
    assert second.score == 1.0 and outcome.score == pytest.approx(0.5)


def test_an_unreachable_gateway_ends_the_run_recorded_unfinished(tmp_path: Path) -> None:
    store = EvalStore(tmp_path / "e.db")

    async def go() -> None:
        async with aiohttp.ClientSession() as session:
            ask = http_ask(session, "http://127.0.0.1:9/v1")
            await run_suite(load_suite("arithmetic"), model="tiny", ask=ask, store=store)

    with pytest.raises(ServerNotRunningError, match="switchyard serve"):
        asyncio.run(go())
    (run,) = store.runs()
    assert run.finished is None and run.passed is None and run.note.startswith("stopped")
    assert run.public()["state"] == "unfinished" and run.cases == 0
    assert store.last_scores() == {}


# ---- the admin API --------------------------------------------------------------------------------
def _post(server: ServerProcess, body: dict[str, Any]) -> tuple[int, bytes]:
    req = urllib.request.Request(
        server.url + "/api/evals",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _get(server: ServerProcess, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(server.url + path, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_api_runs_lists_and_shows_runs(server: ServerProcess, tmp_path: Path) -> None:
    folder = server.home / "suites"  # the one folder the server reads suites from
    folder.mkdir(exist_ok=True)
    suite = _suite_file(folder).name
    status, raw = _post(server, {"model": "tiny", "suite": suite, "min_score": 0.9})
    outcome = json.loads(raw)
    assert status == 200 and outcome["passed"] is False and outcome["score"] == pytest.approx(0.72)
    status, raw = _post(server, {"model": "tiny", "suite": suite, "stream": True})
    events = [block.split("\n") for block in raw.decode().strip().split("\n\n")]
    kinds = [lines[0].removeprefix("event: ") for lines in events]
    assert kinds == ["case", "case", "case", "case", "done"]
    first = json.loads(events[0][1].removeprefix("data: "))
    assert (first["index"], first["total"], first["id"], first["score"]) == (1, 4, "right", 1.0)
    done = json.loads(events[-1][1].removeprefix("data: "))
    assert done["passed"] is True and done["threshold"] == 0.7
    status, listed = _get(server, "/api/evals?model=tiny")
    assert status == 200 and "arithmetic" in listed["suites"]
    assert [r["id"] for r in listed["runs"][:2]] == [done["run"], outcome["run"]]
    status, one = _get(server, f"/api/evals/{outcome['run']}")
    assert status == 200 and [c["id"] for c in one["results"]] == ["right", "wrong", "json", "judged"]
    assert one["results"][1]["answer"] == "131" and one["state"] == "finished"
    # the server wrote the same SQLite file the CLI reads
    assert EvalStore(server.home / "evals.db").run(outcome["run"]) is not None


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"suite": "arithmetic"}, 400, "model"),
        ({"model": "tiny"}, 400, "suite"),
        ({"model": "tiny", "suite": "arithmetic", "min_score": 7}, 400, "min_score"),
        ({"model": "nope", "suite": "arithmetic"}, 404, "nope"),
        ({"model": "tiny", "suite": "no-such-suite"}, 400, "built-in suite"),
    ],
)
def test_api_refuses_bad_runs(
    server: ServerProcess, body: dict[str, Any], status: int, fragment: str
) -> None:
    got, raw = _post(server, body)
    assert got == status and fragment in json.loads(raw)["error"]["message"]
    assert _get(server, "/api/evals/999999")[0] == 404
    for odd in ("%C2%B2", "x1", "9" * 40):  # a superscript two is a digit to str.isdigit; int64 overflows
        assert _get(server, f"/api/evals/{odd}")[0] == 404


# ---- the command line -----------------------------------------------------------------------------
def _cli(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SWITCHYARD_HOME=str(server.home))
    return subprocess.run(
        [sys.executable, "-m", "app", *args], env=env, capture_output=True, text=True, timeout=180
    )


def test_cli_eval_exit_codes_progress_and_history(server: ServerProcess, tmp_path: Path) -> None:
    suite = str(_suite_file(tmp_path))
    failed = _cli(server, "eval", "tiny", "--suite", suite, "--min-score", "0.9")
    assert failed.returncode == 1, failed.stderr
    lines = failed.stdout.splitlines()
    assert lines[0].startswith("[") and "1/4" in lines[0] and "right" in lines[0]
    assert "FAILED" in lines[-1] and "minimum 0.9" in lines[-1]
    passed = _cli(server, "eval", "tiny", "--suite", suite, "--json")
    assert passed.returncode == 0, passed.stderr
    outcome = json.loads(passed.stdout)
    assert outcome["passed"] is True and len(outcome["cases"]) == 4
    history = _cli(server, "eval", "tiny", "--history")
    assert history.returncode == 0 and str(outcome["run"]) in history.stdout
    assert "passed" in history.stdout and "failed" in history.stdout
    nosuite = _cli(server, "eval", "tiny")
    assert nosuite.returncode == 2 and "--suite" in nosuite.stderr
    unknown = _cli(server, "eval", "tiny", "--suite", "no-such-suite")
    assert unknown.returncode == 2 and "arithmetic" in unknown.stderr
    bank = _cli(server, "bank", "ls")  # the same server's session bank, empty here
    assert bank.returncode == 0 and "0 saved conversation(s)" in bank.stdout
