"""One state machine for every job (app/core/jobs.py): downloads, engine installs and registry jobs share one
`JobState` and one table of moves; no other module defines a job state of its own."""

from __future__ import annotations

import ast
from pathlib import Path

from app.core import jobs
from app.hub import download
from app.lanes.install import jobs as engine_jobs

REPO = Path(__file__).resolve().parents[2]


def test_every_job_uses_the_one_state() -> None:
    assert download.JobState is jobs.JobState is engine_jobs.JobState
    assert download.JOB_TRANSITIONS is jobs.TRANSITIONS
    # an engine install ends completed (as every other job), never a state of its own
    assert engine_jobs.JOB_TRANSITIONS[jobs.JobState.RUNNING] == {
        jobs.JobState.COMPLETED,
        jobs.JobState.FAILED,
    }
    assert {v.value for v in jobs.JobState} == {
        "queued",
        "running",
        "paused",
        "completed",
        "failed",
        "cancelled",
    }


def test_the_table_ends_where_the_terminal_states_say() -> None:
    for state in jobs.JobState:
        assert (not jobs.TRANSITIONS[state]) == (state in {jobs.JobState.COMPLETED, jobs.JobState.CANCELLED})
        assert jobs.TRANSITIONS[state] <= set(jobs.JobState)
    assert jobs.ACTIVE == {jobs.JobState.QUEUED, jobs.JobState.RUNNING}


def test_no_module_defines_another_job_state() -> None:
    found = []
    for f in sorted((REPO / "app").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ClassDef) and node.name == "JobState":
                found.append(str(f.relative_to(REPO)))
    assert found == ["app/core/jobs.py"], found
