"""Asking the judges: each one an ordinary completion request through the gateway, on its own lane.

`policy.judges` is tried in order; the first judge that answers with a readable verdict decides. A judge
that fails (no such model, its lane will not start, its answer is late or unreadable) is recorded in
`Judgement.failures` with why, and the next is tried. When none answers, `policy.fail` decides: "open"
lets the text through, "closed" refuses it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.core.errors import SwitchyardError
from app.safety.formats import Turn, Verdict, VerdictUnreadable, fit_turns, parse, render
from app.safety.policy import JudgeSpec, Policy

if TYPE_CHECKING:
    from app.server.gateway import Gateway

# the text a judge reads when its engine does not say its context (a remote judge)
DEFAULT_TEXT_BUDGET = 8192
_MARGIN = 64  # tokens kept free beside the template and the verdict


@dataclass(frozen=True)
class Failure:
    judge: str
    reason: str
    seconds: float


@dataclass(frozen=True)
class Judgement:
    stage: str  # "request" or "answer"
    verdict: Verdict | None  # None: no judge answered
    judge: str | None  # the model whose verdict decided
    blocked: bool
    seconds: float  # of the deciding judge's call
    failures: tuple[Failure, ...] = ()

    @property
    def label(self) -> str:
        """What the audit and the counters call the outcome: safe, controversial, unsafe, or error."""
        return self.verdict.level if self.verdict is not None else "error"


def blocks(verdict: Verdict, policy: Policy) -> bool:
    return verdict.level == "unsafe" or (
        verdict.level == "controversial" and policy.controversial == "unsafe"
    )


async def judge(gw: Gateway, policy: Policy, turns: list[Turn], *, stage: str) -> Judgement:
    """The policy's verdict on `turns` (the last one is what is judged)."""
    failures: list[Failure] = []
    for spec in policy.judges:
        t0 = time.perf_counter()
        try:
            verdict = await asyncio.wait_for(_ask(gw, spec, turns, stage=stage), timeout=spec.timeout_s)
        except TimeoutError:
            reason = f"no verdict within {spec.timeout_s:g} s (policy.judges timeout_s)"
        except (SwitchyardError, VerdictUnreadable) as exc:
            reason = getattr(exc, "message", None) or str(exc)
        else:
            seconds = time.perf_counter() - t0
            return Judgement(stage, verdict, spec.model, blocks(verdict, policy), seconds, tuple(failures))
        failures.append(Failure(spec.model, reason, time.perf_counter() - t0))
    return Judgement(stage, None, None, policy.fail == "closed", 0.0, tuple(failures))


async def _ask(gw: Gateway, spec: JudgeSpec, turns: list[Turn], *, stage: str) -> Verdict:
    route = await gw.resolve(spec.model, "completions")
    async with gw.hold(route) as target:
        slot = target.slot_context()
        template = render(spec.format, [Turn(t.role, "") for t in turns], stage=stage)
        if slot is None:
            budget = DEFAULT_TEXT_BUDGET
        else:  # a template byte is at most one token, and so is a text byte (byte fallback)
            budget = max(256, slot[0] - len(template.encode()) - spec.max_tokens - _MARGIN)
        prompt = render(spec.format, fit_turns(turns, budget=budget), stage=stage)
        body: dict[str, Any] = {
            "prompt": prompt,
            "max_tokens": spec.max_tokens,
            "temperature": 0,
            "stream": False,
        }
        if spec.grammar is not None:
            body["grammar"] = spec.grammar  # tests only: pins a random-weight model's verdict
        answer = await gw.post_json(target, "/v1/completions", body)
    try:
        text = answer["choices"][0]["text"]
    except (KeyError, IndexError, TypeError):
        raise VerdictUnreadable(f"judge {spec.model!r} answered without a completion text") from None
    return parse(spec.format, str(text))
