"""Running a suite: each case is an ordinary chat request through the gateway, scored, recorded, combined.

The score is the weighted mean of the case scores (each 0..1); the run passes when it reaches the
threshold (`--min-score`, else the suite's own). A case whose request fails scores 0 with the error as its
reason and the run goes on; a gateway that cannot be reached at all ends the run (recorded unfinished).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from app.core.errors import ServerNotRunningError, SwitchyardError
from app.quality.score import Ask
from app.quality.store import CaseResult, EvalStore
from app.quality.suite import Case, Suite

ANSWER_CHARS = 4000  # what a case result keeps of an answer


class CaseRequestError(SwitchyardError):
    """The gateway answered a case's request with an error; the case scores 0 with this as its reason."""

    code = "eval_case_failed"


@dataclass(frozen=True, kw_only=True)
class RunOutcome:
    run_id: int | None
    model: str
    suite: str
    score: float
    threshold: float | None
    cases: tuple[CaseResult, ...]

    @property
    def passed(self) -> bool | None:
        return None if self.threshold is None else self.score >= self.threshold - 1e-9

    def public(self) -> dict[str, Any]:
        return {
            "run": self.run_id,
            "model": self.model,
            "suite": self.suite,
            "score": round(self.score, 4),
            "threshold": self.threshold,
            "passed": self.passed,
            "cases": [c.public() for c in self.cases],
        }


def combine(results: list[CaseResult]) -> float:
    total = sum(r.weight for r in results)
    return sum(r.score * r.weight for r in results) / total if total else 0.0


async def run_case(case: Case, *, model: str, ask: Ask) -> CaseResult:
    started = time.perf_counter()
    try:
        answer = await ask(model, [dict(m) for m in case.messages], case.params)
    except CaseRequestError as e:
        return CaseResult(
            case_id=case.id, score=0.0, weight=case.weight, reason=str(e), answer="", seconds=0.0
        )
    verdict = await case.scorer.score(answer, ask=ask)
    return CaseResult(
        case_id=case.id,
        score=verdict.score,
        weight=case.weight,
        reason=verdict.reason,
        answer=answer[:ANSWER_CHARS],
        seconds=time.perf_counter() - started,
    )


async def run_suite(
    suite: Suite,
    *,
    model: str,
    ask: Ask,
    store: EvalStore | None = None,
    threshold: float | None = None,
    on_case: Callable[[int, int, CaseResult], None] | None = None,
) -> RunOutcome:
    """Run every case of `suite` against `model`, recording into `store` as it goes."""
    limit = threshold if threshold is not None else suite.threshold
    # SQLite writes in a thread: hundreds of runs at once must not hold the event loop (and /health)
    run_id = (
        await asyncio.to_thread(
            store.start, model=model, suite=suite.name, source=suite.source, threshold=limit
        )
        if store
        else None
    )
    results: list[CaseResult] = []
    try:
        for index, case in enumerate(suite.cases, start=1):
            result = await run_case(case, model=model, ask=ask)
            results.append(result)
            if store and run_id is not None:
                await asyncio.to_thread(store.add_case, run_id, result)
            if on_case:
                on_case(index, len(suite.cases), result)
    except BaseException as e:
        if store and run_id is not None:
            await asyncio.to_thread(store.abandon, run_id, note=f"stopped: {e or type(e).__name__}")
        raise
    outcome = RunOutcome(
        run_id=run_id,
        model=model,
        suite=suite.name,
        score=combine(results),
        threshold=limit,
        cases=tuple(results),
    )
    if store and run_id is not None:
        await asyncio.to_thread(store.finish, run_id, score=outcome.score, passed=outcome.passed)
    return outcome


def _error_text(status: int, body: str) -> str:
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body.strip()[:300]
    return f"the gateway answered {status}: {message}"


def http_ask(
    session: aiohttp.ClientSession,
    base_url: str,
    *,
    api_key: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    timeout_s: float = 600.0,
) -> Ask:
    """An `Ask` that sends a non-streamed chat completion to the gateway at `base_url` (…/v1)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = base_url.rstrip("/") + "/chat/completions"

    async def ask(model: str, messages: list[dict[str, Any]], params: Mapping[str, Any]) -> str:
        body = {"temperature": 0, **params, "model": model, "messages": messages, "stream": False}
        try:
            async with session.post(
                url,
                json=body,
                headers=headers,
                ssl=ssl_context if ssl_context is not None else True,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise CaseRequestError(_error_text(resp.status, text))
        except aiohttp.ClientConnectionError as e:
            raise ServerNotRunningError(
                f"could not reach the gateway at {base_url} ({e}); start it with `switchyard serve` "
                "and run again"
            ) from None
        except TimeoutError:
            raise CaseRequestError(f"no answer within {timeout_s:g} s") from None
        try:
            content = json.loads(text)["choices"][0]["message"].get("content")
        except (ValueError, KeyError, IndexError, TypeError):
            raise CaseRequestError(f"the gateway's answer is not a chat completion: {text[:200]!r}") from None
        return content if isinstance(content, str) else ""

    return ask
