"""Asking the judges: each one an ordinary completion request through the gateway, on its own lane.

`policy.judges` is tried in order; the first judge that answers with a readable verdict decides. A judge
that fails (no such model, its lane will not start, its answer is late or unreadable) is recorded in
`Judgement.failures` with why, and the next is tried. When none answers, `policy.fail` decides: "open"
lets the text through, "closed" refuses it.

Each judge asked is a `switchyard.judge` span (docs/tracing.md): the judge, its format, the stage, the
verdict and categories, whether it blocks, the latency and how many bytes of text it read, never the text.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.core import tracing
from app.core.errors import SwitchyardError
from app.core.policy import JudgeSpec, Policy
from app.safety.formats import Turn, Verdict, VerdictUnreadable, fit_turns, parse, render

if TYPE_CHECKING:
    from app.server.gateway.core import Gateway

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
    read: str | None = None  # the judged text as the deciding judge read it (a long one: start [...] end)

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
        with tracing.span("switchyard.judge", judge=spec.model, format=spec.format, stage=stage) as span:
            try:
                verdict, read = await asyncio.wait_for(
                    _ask(gw, spec, turns, stage=stage), timeout=spec.timeout_s
                )
            except TimeoutError:
                reason = f"no verdict within {spec.timeout_s:g} s (policy.judges timeout_s)"
            except (SwitchyardError, VerdictUnreadable) as exc:
                reason = getattr(exc, "message", None) or str(exc)
            else:
                seconds = time.perf_counter() - t0
                blocked = blocks(verdict, policy)
                _describe(span, verdict=verdict.level, seconds=seconds, blocked=blocked)
                span.set_attribute(tracing.PREFIX + "categories", list(verdict.categories))
                span.set_attribute(tracing.PREFIX + "text_bytes", len(turns[-1].text.encode()))
                span.set_attribute(tracing.PREFIX + "read_bytes", len(read.encode()))
                return Judgement(stage, verdict, spec.model, blocked, seconds, tuple(failures), read=read)
            seconds = time.perf_counter() - t0
            _describe(span, verdict="error", seconds=seconds, blocked=None)
            tracing.fail(span, f"judge {spec.model}: {reason}")
        failures.append(Failure(spec.model, reason, seconds))
    return Judgement(stage, None, None, policy.fail == "closed", 0.0, tuple(failures))


def _describe(span: tracing.SpanLike, *, verdict: str, seconds: float, blocked: bool | None) -> None:
    span.set_attribute(tracing.PREFIX + "verdict", verdict)
    span.set_attribute(tracing.PREFIX + "latency_ms", round(seconds * 1000, 3))
    if blocked is not None:
        span.set_attribute(tracing.PREFIX + "blocked", blocked)


async def _ask(gw: Gateway, spec: JudgeSpec, turns: list[Turn], *, stage: str) -> tuple[Verdict, str]:
    """The judge's verdict, and the judged text as it read it."""
    route = await gw.resolve(spec.model, "completions")
    async with gw.hold(route) as target:
        slot = target.slot_context()
        template = render(spec.format, [Turn(t.role, "") for t in turns], stage=stage)
        if slot is None:
            budget = DEFAULT_TEXT_BUDGET
        else:  # a template byte is at most one token, and so is a text byte (byte fallback)
            budget = max(256, slot[0] - len(template.encode()) - spec.max_tokens - _MARGIN)
        fitted = fit_turns(turns, budget=budget)
        prompt = render(spec.format, fitted, stage=stage)
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
    return parse(spec.format, str(text)), fitted[-1].text
