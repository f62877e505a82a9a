"""The guard models' prompt formats, verdict parsers, the head+tail cut and the `policy` setting (pure)."""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest

from app.core.errors import SettingsError
from app.core.policy import parse_policy
from app.core.settings import settings_from_mapping
from app.safety import formats
from app.safety.formats import CUT_MARK, Turn, fit_text, fit_turns, parse, render
from app.safety.judge import blocks

FIXTURES = Path(__file__).resolve().parents[1] / "support" / "fixtures" / "safety"
REFUSAL = (
    "**Refusal: Yes**: The ASSISTANT refused to answer or did not comply with the USER's request.\n"
    "**Refusal: No**: The ASSISTANT directly answered or complied with the USER's request."
)
TURNS = [Turn("user", "write a haiku"), Turn("assistant", "leaves fall"), Turn("user", "another")]


def _jinja(name: str) -> jinja2.Template:
    env = jinja2.Environment(keep_trailing_newline=True, autoescape=False)
    return env.from_string((FIXTURES / name).read_text())


@pytest.mark.parametrize("stage", ["request", "answer"])
def test_llamaguard_prompt_matches_its_chat_template(stage: str) -> None:
    turns = TURNS if stage == "request" else [*TURNS, Turn("assistant", "winter moon")]
    cats = [(code, name) for code, (name, _) in formats.LLAMA_CATEGORIES.items()]
    messages = [{"role": t.role, "content": t.text} for t in turns]
    expected = _jinja("llamaguard3.jinja").render(messages=messages, categories=cats)
    assert render("llamaguard", turns, stage=stage) == expected
    assert ("'Agent' messages" in expected) is (stage == "answer")


@pytest.mark.parametrize("stage", ["request", "answer"])
def test_qwen3guard_prompt_has_its_template_structure(stage: str) -> None:
    turns = TURNS if stage == "request" else [*TURNS, Turn("assistant", "winter moon")]
    cats = [c for c in formats.QWEN_CATEGORIES if stage == "request" or c != "Jailbreak"]
    expected = _jinja("qwen3guard_structure.jinja").render(
        task=formats._QWEN_TASK[stage],
        policy=formats._QWEN_POLICY[stage],
        ask=formats._QWEN_ASK[stage],
        categories=cats,
        refusal=REFUSAL if stage == "answer" else "",
        messages=[{"role": t.role, "content": t.text} for t in turns],
    )
    got = render("qwen3guard", turns, stage=stage)
    assert got == expected
    assert got.endswith("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert "USER: another" in got and ("REFUSAL POLICY" in got) is (stage == "answer")


def test_verdicts_map_to_one_category_list() -> None:
    v = parse("qwen3guard", "Safety: Unsafe\nCategories: Violent, Suicide & Self-Harm\n")
    assert (v.level, v.categories, v.raw) == (
        "unsafe",
        ("violence", "self_harm"),
        ("Violent", "Suicide & Self-Harm"),
    )
    assert parse("qwen3guard", "Safety: Safe\nCategories: None\nRefusal: Yes").categories == ()
    assert parse("qwen3guard", "Safety: Controversial\nCategories: PII").level == "controversial"
    lg = parse("llamaguard", "\n\nunsafe\nS1,S14")
    assert (lg.level, lg.categories, lg.raw) == ("unsafe", ("violence", "code_abuse"), ("S1", "S14"))
    assert parse("llamaguard", "safe").level == "safe"
    assert set(v.categories + lg.categories) <= set(formats.CATEGORIES)
    with pytest.raises(formats.VerdictUnreadable):
        parse("qwen3guard", "I think it is fine")
    with pytest.raises(formats.VerdictUnreadable):
        parse("llamaguard", "maybe\nS1")


def test_a_long_text_is_read_by_its_start_and_end() -> None:
    text = "START " + "é" * 5000 + " END"
    cut = fit_text(text, budget=1000)
    assert len(cut.encode()) <= 1000 and cut.startswith("START ") and cut.endswith(" END")
    assert CUT_MARK in cut
    assert fit_text("short", budget=1000) == "short"
    fitted = fit_turns(
        [Turn("user", "a" * 3000), Turn("assistant", "b" * 100), Turn("user", "c" * 3000)], budget=2000
    )
    assert sum(len(t.text.encode()) for t in fitted) <= 2000
    assert fitted[-1].text.startswith("c") and fitted[-1].role == "user"


def test_policy_setting_is_checked_with_clear_errors() -> None:
    good = {"enabled": True, "judges": [{"model": "g", "format": "llamaguard"}], "judge": "both"}
    policy = parse_policy(good)
    assert policy.requests and policy.answers and policy.fail == "open" and policy.controversial == "safe"
    assert policy.applies(group="openai", key=None, model="m") and not policy.applies(
        group="openai", key=None, model="g"
    )  # a judge's own requests are not judged
    scoped = parse_policy({**good, "scope": {"groups": ["ollama"], "keys": ["ci"]}})
    assert scoped.applies(group="ollama", key="ci", model="m")
    assert not scoped.applies(group="openai", key="ci", model="m")
    assert not scoped.applies(group="ollama", key=None, model="m")
    for bad, words in [
        ({**good, "fail": "sometimes"}, "policy.fail must be one of open, closed"),
        ({**good, "judges": [{"model": "g", "format": "gpt"}]}, "policy.judges[0].format"),
        ({**good, "scope": {"groups": ["web"]}}, "unknown groups ['web']"),
        ({"enabled": True}, "switchyard guard enable"),
        ({**good, "colour": 1}, "unknown keys ['colour']"),
    ]:
        with pytest.raises(SettingsError, match=words.replace("[", r"\[").replace("]", r"\]")):
            settings_from_mapping({"policy": bad})


def test_controversial_counts_as_the_policy_says() -> None:
    v = parse("qwen3guard", "Safety: Controversial\nCategories: Unethical Acts")
    judge = [{"model": "g", "format": "qwen3guard"}]
    assert not blocks(v, parse_policy({"enabled": True, "judges": judge}))
    assert blocks(v, parse_policy({"enabled": True, "judges": judge, "controversial": "unsafe"}))
