"""A gated update: the new revision of a pulled model is fetched beside the current one, scored by an eval
suite, and made current only if it reaches the pass mark (docs/evals.md#update-gates).

The new revision lands under refs/switchyard-candidate, so `refs/main` (what every request uses) never
moves while the eval runs; the library lists the new files as `<id>@candidate`, and the suite's cases are
ordinary requests to that id through the gateway. Passed: main moves to it (the old commit kept for
`update --rollback`) and a loaded lane of the model restarts on the new files. Failed, or stopped: the
candidate's ref, snapshot and the blobs only it used are deleted; nothing else changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.core.errors import BadRequestError, ConflictError, LaneNotFoundError, SwitchyardError
from app.core.jobs import Job, JobHandle, JobKind, JobRegistry
from app.hub.download import JobState
from app.library.sources import CANDIDATE_SUFFIX
from app.quality.runner import run_suite
from app.quality.score import Ask
from app.quality.store import CaseResult, EvalStore
from app.quality.suite import load_suite, suite_from_text
from app.runtime import Runtime

log = logging.getLogger(__name__)
Emit = Callable[[str, dict[str, Any]], None]  # must not block: the route queues what it is given
AskSession = Callable[[], contextlib.AbstractAsyncContextManager[Ask]]


class GateConflictError(ConflictError):
    code = "model_has_gate"


@dataclass(frozen=True)
class Gate:
    suite: str
    min_score: float
    text: str | None = None  # a suite file's text sent with the request (`suite_text`); `suite` its name

    @classmethod
    def of(cls, rt: Runtime, model_id: str, body: dict[str, Any]) -> Gate:
        """The gate a request names, else the model's standing gate (settings `gates`)."""
        standing = rt.settings.jobs.gates.get(model_id, {})
        suite = body.get("suite") or standing.get("suite")
        score = body.get("min_score", standing.get("min_score"))
        if not isinstance(suite, str) or not suite:
            raise BadRequestError(
                f"{model_id!r} has no standing gate: send 'suite' and 'min_score' (or set one with "
                "`switchyard gate MODEL SUITE N`)",
                param="suite",
            )
        if isinstance(score, bool) or not isinstance(score, int | float) or not 0 <= score <= 1:
            raise BadRequestError("'min_score' must be a number from 0 to 1", param="min_score")
        text = body.get("suite_text") if body.get("suite") else None
        if text is not None and not isinstance(text, str):
            raise BadRequestError("'suite_text' must be a suite file's text (a string)", param="suite_text")
        return cls(suite, float(score), text)


def gated_models(rt: Runtime, repo: str) -> list[str]:
    """The models of `repo` with a standing gate: a plain update of that repository would bypass it."""
    return sorted(
        m for m in rt.settings.jobs.gates if (e := rt.catalog.find(m)) and e.origin and e.origin.repo == repo
    )


async def updatable(rt: Runtime, model_id: str) -> str:
    """The repository the model was pulled from (a 404 when unknown, a 400 when it came from no hub)."""
    if model_id.endswith(CANDIDATE_SUFFIX):
        raise BadRequestError(
            f"name the current model, not its candidate: {model_id.removesuffix(CANDIDATE_SUFFIX)}",
            param="model",
        )
    entry = await rt.catalog.aget(model_id)
    if entry.source not in ("hf_cache", "download") or entry.origin is None:
        raise BadRequestError(
            f"{model_id!r} was not pulled from a hub ({entry.source}); only pulled models have updates",
            param="model",
        )
    return entry.origin.repo


async def _unload(rt: Runtime, model_id: str) -> None:
    with contextlib.suppress(LaneNotFoundError):
        await rt.supervisor.unload(model_id)


async def gated_update(
    rt: Runtime,
    *,
    model_id: str,
    gate: Gate,
    ask: Ask,
    emit: Emit,
    revision: str = "main",
    on_step: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Fetch, score and switch or discard, emitting `job` and `case` events on the way; `on_step` hears
    the last step begin ("decide": the switch, or the candidate's removal)."""
    repo = await updatable(rt, model_id)
    # a bad suite is refused before any download; no file outside the suites folder is read
    if gate.text is not None:
        suite = await asyncio.to_thread(suite_from_text, gate.text, name=gate.suite)
    else:
        suite = await asyncio.to_thread(load_suite, gate.suite, folder=rt.paths.suites)
    downloads = rt.downloads
    await asyncio.to_thread(downloads.discard, repo, revision=revision)  # an earlier gate cut short
    job = await downloads.update(repo, revision=revision, candidate=True)
    if job is None:
        return {"status": "up_to_date", "model": model_id, "repo": repo}
    emit("job", job.public())
    job = await downloads.wait(job.id)
    candidate = model_id + CANDIDATE_SUFFIX
    try:
        if job.state is not JobState.COMPLETED:
            raise SwitchyardError(
                f"the new revision's download {job.state.value}: {job.error or 'see its job'}"
            )
        await asyncio.to_thread(rt.catalog.scan)
        if rt.catalog.find(candidate) is None:
            raise BadRequestError(
                f"the new revision of {repo} ({job.commit[:12]}) no longer has {model_id}'s file; "
                "pull one of its quantizations instead"
            )

        def on_case(index: int, total: int, result: CaseResult) -> None:
            emit("case", {"index": index, "total": total, **result.public()})

        outcome = await run_suite(
            suite,
            model=candidate,
            ask=ask,
            store=EvalStore(rt.paths.evals_db),
            threshold=gate.min_score,
            on_case=on_case,
        )
    except BaseException:
        await _unload(rt, candidate)
        await asyncio.to_thread(downloads.discard, repo, revision=revision)
        await asyncio.to_thread(rt.catalog.scan)
        raise
    await _unload(rt, candidate)
    if on_step is not None:
        on_step("decide")
    decision: dict[str, Any] = {
        "model": model_id,
        "repo": repo,
        "commit": job.commit,
        "previous": job.previous,
        "score": round(outcome.score, 4),
        "min_score": gate.min_score,
        "run": outcome.run_id,
        "suite": outcome.suite,
    }
    if outcome.passed:
        await asyncio.to_thread(downloads.promote, repo, revision=revision)
        await asyncio.to_thread(rt.catalog.scan)
        with contextlib.suppress(LaneNotFoundError):
            await rt.supervisor.restart(model_id, reason=f"updated to {job.commit[:12]} (passed its gate)")
        decision["status"] = "switched"
    else:
        freed = (await asyncio.to_thread(downloads.discard, repo, revision=revision))["freed"]
        await asyncio.to_thread(rt.catalog.scan)
        decision.update(status="kept", freed=freed)
    log.info(
        "gated update of %s: %s (%.3f against %.3f)",
        model_id,
        decision["status"],
        outcome.score,
        gate.min_score,
    )
    return decision


def gated_update_job(
    rt: Runtime,
    jobs: JobRegistry,
    *,
    model_id: str,
    repo: str,
    gate: Gate,
    asking: AskSession,
    emit: Emit | None = None,
) -> Job:
    """The gated update as a job of the server, one per repository at a time (a second is a 409 naming
    the first): its steps are the download, the cases and the decision (each a `switchyard.job_step`
    span, docs/tracing.md); `emit` also gets every event."""

    async def work(handle: JobHandle) -> dict[str, Any]:
        def both(kind: str, data: dict[str, Any]) -> None:
            if kind == "job":
                handle.step("download", done=int(data.get("bytes_done") or 0), total=data.get("bytes_total"))
            elif kind == "case":
                handle.step("eval", done=int(data["index"]), total=int(data["total"]))
            if emit is not None:
                emit(kind, data)

        async with asking() as ask:
            return await gated_update(
                rt, model_id=model_id, gate=gate, ask=ask, emit=both, on_step=lambda s: handle.step(s)
            )

    return jobs.run(JobKind.UPDATE, f"gated update of {model_id}", work, subject=repo, guard=f"update:{repo}")
