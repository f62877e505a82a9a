"""Evals attacked on purpose (issue 33): cases keep the caller's key however it came, a YAML alias bomb is
refused before anything walks it, a suite's backtracking pattern neither stalls the server nor runs
unbounded, a suite error never quotes the file, only suite files are read, and a burst of eval runs does
not hold the event loop with its database writes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.quality.runner import run_suite
from app.quality.score import Regex, SuiteError, scorer_from_spec
from app.quality.store import EvalStore
from app.quality.suite import load_suite
from tests.conftest import ServerProcess, link_models

ROOT = Path(__file__).resolve().parents[2]
while not (ROOT / "pyproject.toml").exists():
    ROOT = ROOT.parent


async def _never(_m: str, _msgs: list[dict[str, Any]], _p: Mapping[str, Any]) -> str:
    raise AssertionError("a scorer without a judge asks nothing")


async def _longest_stall(work: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    """(the event loop's longest pause while `work` runs, its result)."""
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)
    try:
        result = await work()
    finally:
        done.set()
        await tick
    return max(gaps), result


def test_a_yaml_alias_bomb_is_refused_before_it_is_walked(tmp_path: Path) -> None:
    rows = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    rows += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 6)]  # 9^6 values
    rows.append('cases: [{id: x, messages: [{role: user, content: *a5}], expect: {exact: "1"}}]')
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(rows) + "\n")
    started = time.perf_counter()
    with pytest.raises(SuiteError, match="YAML aliases"):
        load_suite(str(bomb))
    assert time.perf_counter() - started < 1.0
    nested = tmp_path / "fine.yaml"  # aliases within the bound still work
    nested.write_text(
        'd: &d {exact: "42"}\ncases: [{id: a, prompt: q, expect: *d}, {id: b, prompt: r, expect: *d}]\n'
    )
    assert len(load_suite(str(nested)).cases) == 2


def test_a_suite_error_never_quotes_the_file(tmp_path: Path) -> None:
    creds = tmp_path / "creds.yaml"
    creds.write_text('user: admin\npassword: "hunter2-SECRET" : oops\nmore: [\n')
    with pytest.raises(SuiteError, match="line 2") as e:
        load_suite(str(creds))
    assert "hunter2" not in e.value.message and "SECRET" not in e.value.message
    netrc = tmp_path / "netrc"  # not a suite file: refused without being read
    netrc.write_text("machine example.com login me password hunter2\n")
    with pytest.raises(SuiteError, match="not a suite file") as e2:
        load_suite(str(netrc))
    assert "hunter2" not in e2.value.message


async def test_a_backtracking_pattern_never_holds_the_event_loop() -> None:
    scorer = scorer_from_spec({"regex": "^(a+)+$"}, where="suite.yaml case 'x'")
    assert isinstance(scorer, Regex)
    # Python's re takes seconds on this (2^25 ways to split the a's), on whatever thread runs it
    stall, verdict = await _longest_stall(lambda: scorer.score("a" * 25 + "b", ask=_never))
    assert verdict.score == 0.0 and stall < 0.5, f"the loop stalled {stall:.2f} s"


async def test_a_pattern_that_runs_too_long_is_cut_and_scores_zero() -> None:
    scorer = scorer_from_spec({"regex": "^(a|a)+$"}, where="suite.yaml case 'x'")
    started = time.perf_counter()
    stall, verdict = await _longest_stall(lambda: scorer.score("a" * 40 + "b", ask=_never))
    assert verdict.score == 0.0 and "took over" in verdict.reason
    assert time.perf_counter() - started < 10 and stall < 0.5
    schema = scorer_from_spec({"json_schema": {"type": "string", "pattern": "^(a|a)+$"}}, where="c")
    judged = await schema.score(json.dumps("a" * 40 + "b"), ask=_never)
    assert judged.score == 0.0 and "took over" in judged.reason


async def test_database_writes_of_many_runs_stay_off_the_event_loop(tmp_path: Path) -> None:
    suite_file = tmp_path / "one.yaml"
    suite_file.write_text('cases: [{id: a, prompt: q, expect: {exact: "42"}}]\n')
    suite = load_suite(str(suite_file))
    store = EvalStore(tmp_path / "evals.db")

    async def answer(_m: str, _msgs: list[dict[str, Any]], _p: Mapping[str, Any]) -> str:
        return "42"

    async def burst() -> list[Any]:
        return await asyncio.gather(
            *(run_suite(suite, model="m", ask=answer, store=store) for _ in range(150))
        )

    stall, outcomes = await _longest_stall(burst)
    assert all(o.score == 1.0 for o in outcomes) and len({o.run_id for o in outcomes}) == 150
    assert stall < 0.25, f"150 runs' database writes held the loop {stall:.2f} s"


def test_eval_cases_run_with_the_callers_x_api_key(tmp_path: Path, model_store: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.json").write_text(json.dumps({"require_api_key": True}))
    env = dict(os.environ, SWITCHYARD_HOME=str(home))
    made = subprocess.run(
        [sys.executable, "-m", "app", "keys", "create", "anthropic-client"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    key = made.stdout.strip()
    suite = home / "suites" / "pinned.yaml"  # the one folder the server reads suites from
    suite.parent.mkdir()
    pinned = {"grammar": 'root ::= "42"', "max_tokens": 4}
    suite.write_text(
        json.dumps({"cases": [{"id": "a", "prompt": "17+25?", "expect": {"number": 42}, "params": pinned}]})
    )
    server = ServerProcess(home, link_models(tmp_path / "models", model_store / "tiny.gguf")).wait_ready()
    try:
        r = httpx.post(
            server.url + "/api/evals",
            json={"model": "tiny", "suite": "pinned.yaml"},
            headers={"x-api-key": key},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        case = r.json()["cases"][0]
        assert case["score"] == 1.0, case  # before: every case a 401, scored 0
    finally:
        server.stop()
