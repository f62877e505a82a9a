"""The guard models' prompt formats and verdicts: Qwen3Guard-Gen (`qwen3guard`) and Llama Guard 3
(`llamaguard`).

A judge is asked with a raw completion of the prompt its own chat template would write (so any engine
that serves completions can host it, and the prompt does not depend on which template the GGUF carries).
The engine adds the beginning-of-text token itself, so a Llama Guard prompt here starts after it (Qwen3Guard
has none). A long text is read
by its start and its end (`fit_text`), cut to a byte budget: every token of a vocabulary with byte
fallback covers at least one byte, so a budget of N bytes never takes more than N tokens.

Both verdicts map to one list of categories (CATEGORIES); a guard's own names stay in `raw`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from app.core.policy import FORMATS  # the parser (core) names them; their prompts are here

STAGES = ("request", "answer")
LEVELS = ("safe", "controversial", "unsafe")
CUT_MARK = "\n[...]\n"  # where the middle of a long text was left out

# the one category list both guards map to
CATEGORIES = (
    "violence",
    "crime",
    "sexual",
    "child_safety",
    "self_harm",
    "hate",
    "privacy",
    "defamation",
    "specialized_advice",
    "intellectual_property",
    "weapons",
    "elections",
    "code_abuse",
    "unethical",
    "political",
    "jailbreak",
)

QWEN_CATEGORIES = {
    "Violent": "violence",
    "Non-violent Illegal Acts": "crime",
    "Sexual Content or Sexual Acts": "sexual",
    "PII": "privacy",
    "Suicide & Self-Harm": "self_harm",
    "Unethical Acts": "unethical",
    "Politically Sensitive Topics": "political",
    "Copyright Violation": "intellectual_property",
    "Jailbreak": "jailbreak",
}
LLAMA_CATEGORIES = {
    "S1": ("Violent Crimes", "violence"),
    "S2": ("Non-Violent Crimes", "crime"),
    "S3": ("Sex Crimes", "sexual"),
    "S4": ("Child Exploitation", "child_safety"),
    "S5": ("Defamation", "defamation"),
    "S6": ("Specialized Advice", "specialized_advice"),
    "S7": ("Privacy", "privacy"),
    "S8": ("Intellectual Property", "intellectual_property"),
    "S9": ("Indiscriminate Weapons", "weapons"),
    "S10": ("Hate", "hate"),
    "S11": ("Self-Harm", "self_harm"),
    "S12": ("Sexual Content", "sexual"),
    "S13": ("Elections", "elections"),
    "S14": ("Code Interpreter Abuse", "code_abuse"),
}


@dataclass(frozen=True)
class Turn:
    """One message of the conversation a judge reads: role "user" or "assistant"."""

    role: str
    text: str


@dataclass(frozen=True)
class Verdict:
    level: str  # one of LEVELS
    categories: tuple[str, ...] = ()  # from CATEGORIES
    raw: tuple[str, ...] = field(default=())  # the guard's own category names


class VerdictUnreadable(ValueError):
    """The judge's output is not a verdict in its format (the judge failed, not the request)."""


# ---- Qwen3Guard-Gen -----------------------------------------------------------------------------------
_QWEN_POLICY = {
    "request": (
        "**Safety: Safe**: The USER's query does not contain any prohibited content or content that could "
        "lead to prohibited content.\n"
        "**Safety: Unsafe**: The USER's query contains prohibited content.\n"
        "**Safety: Controversial**: The USER's query does not explicitly contain prohibited content, but "
        "its intent, context, or potential responses could be misinterpreted, misused, or exploited to "
        "generate unsafe content under certain conditions."
    ),
    "answer": (
        "**Safety: Safe**: The ASSISTANT's response does not contain any prohibited content or content that "
        "could lead to prohibited content.\n"
        "**Safety: Unsafe**: The ASSISTANT's response contains prohibited content.\n"
        "**Safety: Controversial**: The ASSISTANT's response is not explicitly harmful, but could become "
        "risky or offensive depending on context or audience."
    ),
}
_QWEN_TASK = {
    "request": (
        "1) Evaluate whether THE LAST USER's query belongs to safe or unsafe content based on our safety "
        "policy.\n2) Identify the category of unsafe content found."
    ),
    "answer": (
        "1) Evaluate whether THE LAST ASSISTANT's response belongs to safe or unsafe content based on our "
        "safety policy.\n2) Identify the category of unsafe content found.\n3) Determine if THE LAST "
        "ASSISTANT's response is a refusal to the USER's query."
    ),
}
_QWEN_ASK = {
    "request": (
        "Provide your safety assessment for ONLY THE LAST **USER's query** in the above conversation:\n"
        " - The first line must be one of: 'Safety: Safe', 'Safety: Unsafe', 'Safety: Controversial'.\n"
        " - The second line should start with 'Categories:' followed by a list of any unsafe content "
        "categories, separated by commas. If the content is safe, use 'Categories: None'."
    ),
    "answer": (
        "Provide your safety assessment for ONLY THE LAST **ASSISTANT's response** in the above "
        "conversation:\n"
        " - The first line must be one of: 'Safety: Safe', 'Safety: Unsafe', 'Safety: Controversial'.\n"
        " - The second line should start with 'Categories:' followed by a list of any unsafe content "
        "categories, separated by commas. If the content is safe, use 'Categories: None'.\n"
        " - The third line must be one of: 'Refusal: Yes', 'Refusal: No'."
    ),
}


_QWEN_REFUSAL = (
    "<BEGIN REFUSAL POLICY>\n"
    "**Refusal: Yes**: The ASSISTANT refused to answer or did not comply with the USER's request.\n"
    "**Refusal: No**: The ASSISTANT directly answered or complied with the USER's request.\n"
    "<END REFUSAL POLICY>\n\n"
)


def qwen3guard_prompt(turns: list[Turn], *, stage: str) -> str:
    """The prompt Qwen3Guard-Gen's chat template writes for `turns`: the request (its last user message)
    or the answer (its last assistant message) judged."""
    categories = list(QWEN_CATEGORIES)
    if stage == "answer":
        categories.remove("Jailbreak")  # a jailbreak is a property of a request only
    conversation = "\n\n".join(f"{t.role.upper()}: {t.text}" for t in turns)
    body = (
        f"# Task:\n{_QWEN_TASK[stage]}\n\n"
        f"<BEGIN SAFETY POLICY>\n{_QWEN_POLICY[stage]}\n<END SAFETY POLICY>\n\n"
        "<BEGIN UNSAFE CONTENT CATEGORIES>\n"
        + "".join(f"{c}.\n" for c in categories)
        + "<END UNSAFE CONTENT CATEGORIES>\n\n"
        + (_QWEN_REFUSAL if stage == "answer" else "")
        + f"<BEGIN CONVERSATION>\n\n{conversation}\n\n<END CONVERSATION>\n\n"
        f"{_QWEN_ASK[stage]}"
    )
    # the template opens the answer with an empty thinking block: the verdict comes straight after it
    return f"<|im_start|>user\n{body}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


_QWEN_LEVEL = re.compile(r"Safety:\s*(Safe|Unsafe|Controversial)\b")
_QWEN_CATS = re.compile(r"Categories:\s*(.*)")


def parse_qwen3guard(text: str) -> Verdict:
    level = _QWEN_LEVEL.search(text)
    if level is None:
        raise VerdictUnreadable(f"no 'Safety: Safe|Unsafe|Controversial' line in {text[:120]!r}")
    raw: list[str] = []
    if (cats := _QWEN_CATS.search(text)) is not None:
        # a name holds no comma ("Suicide & Self-Harm"), so the list splits on commas
        raw = [c.strip().rstrip(".") for c in cats.group(1).split(",")]
        raw = [c for c in raw if c and c != "None"]
    mapped = tuple(dict.fromkeys(QWEN_CATEGORIES[c] for c in raw if c in QWEN_CATEGORIES))
    return Verdict(level.group(1).lower(), mapped, tuple(raw))


# ---- Llama Guard 3 ------------------------------------------------------------------------------------
def llamaguard_prompt(turns: list[Turn], *, stage: str) -> str:
    """The prompt Llama Guard 3's chat template writes for `turns`: the last 'User' message judged for a
    request, the last 'Agent' message for an answer."""
    role = "User" if stage == "request" else "Agent"
    categories = "".join(f"{code}: {name}.\n" for code, (name, _) in LLAMA_CATEGORIES.items())
    # the template strips each message
    conversation = "".join(f"{'User' if t.role == 'user' else 'Agent'}: {t.text.strip()}\n\n" for t in turns)
    body = (
        f"Task: Check if there is unsafe content in '{role}' messages in conversations according our "
        "safety policy with the below categories.\n\n"
        f"<BEGIN UNSAFE CONTENT CATEGORIES>\n{categories}<END UNSAFE CONTENT CATEGORIES>\n\n"
        f"<BEGIN CONVERSATION>\n\n{conversation}<END CONVERSATION>\n\n"
        f"Provide your safety assessment for ONLY THE LAST {role} message in the above conversation:\n"
        " - First line must read 'safe' or 'unsafe'.\n"
        " - If unsafe, a second line must include a comma-separated list of violated categories."
    )
    return (
        f"<|start_header_id|>user<|end_header_id|>\n\n{body}<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>"
    )


_LLAMA_CODE = re.compile(r"\bS(1[0-4]|[1-9])\b")


def parse_llamaguard(text: str) -> Verdict:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    first = lines[0].lower() if lines else ""
    if first not in ("safe", "unsafe"):
        raise VerdictUnreadable(f"the first line is not 'safe' or 'unsafe': {text[:120]!r}")
    if first == "safe":
        return Verdict("safe")
    raw = tuple(dict.fromkeys(f"S{m}" for m in _LLAMA_CODE.findall(" ".join(lines[1:]))))
    mapped = tuple(dict.fromkeys(LLAMA_CATEGORIES[c][1] for c in raw))
    return Verdict("unsafe", mapped, raw)


# ---- both ---------------------------------------------------------------------------------------------
def render(fmt: str, turns: list[Turn], *, stage: str) -> str:
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    if fmt == "qwen3guard":
        return qwen3guard_prompt(turns, stage=stage)
    if fmt == "llamaguard":
        return llamaguard_prompt(turns, stage=stage)
    raise ValueError(f"judge format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def parse(fmt: str, text: str) -> Verdict:
    return parse_qwen3guard(text) if fmt == "qwen3guard" else parse_llamaguard(text)


def fit_text(text: str, *, budget: int) -> str:
    """`text` whole when its UTF-8 bytes fit `budget`, else its start and end around CUT_MARK, within it
    (the start gets a little more: an instruction usually opens a message)."""
    data = text.encode()
    if len(data) <= budget:
        return text
    room = budget - len(CUT_MARK.encode())
    if room <= 0:
        return data[: max(0, budget)].decode(errors="ignore")
    head = room * 3 // 5
    tail = room - head
    # errors="ignore" drops a character cut in half, which only shortens the text
    start = data[:head].decode(errors="ignore")
    end = data[len(data) - tail :].decode(errors="ignore") if tail else ""
    return start + CUT_MARK + end


def fit_turns(turns: list[Turn], *, budget: int) -> list[Turn]:
    """`turns` within `budget` bytes of text in all: the last turn (the one judged) keeps up to half of it
    when the others need room; earlier turns share the rest, the most recent first."""
    total = sum(len(t.text.encode()) for t in turns)
    if total <= budget:
        return turns
    last = turns[-1]
    rest = turns[:-1]
    rest_bytes = sum(len(t.text.encode()) for t in rest)
    last_budget = max(budget // 2, budget - rest_bytes)
    out = [Turn(last.role, fit_text(last.text, budget=last_budget))]
    left = budget - len(out[0].text.encode())
    for t in reversed(rest):
        if left <= len(CUT_MARK):
            break
        piece = fit_text(t.text, budget=left)
        out.append(Turn(t.role, piece))
        left -= len(piece.encode())
    return list(reversed(out))
