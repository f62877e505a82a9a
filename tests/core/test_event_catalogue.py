"""The event catalogue (app/core/events.py): every kind published anywhere in app/ is an `EventKind` member,
never a string made up at the call site, and the bus refuses a kind the catalogue does not hold."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from app.core.events import EventBus, EventKind

REPO = Path(__file__).resolve().parents[2]


def _publish_calls() -> list[tuple[str, ast.Call]]:
    calls = []
    for f in sorted((REPO / "app").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "publish"
                and node.args
            ):
                calls.append((str(f.relative_to(REPO)), node))
    return calls


def test_no_publisher_names_a_kind_by_string() -> None:
    calls = _publish_calls()
    assert len(calls) >= 10, "the walk must see the publishers"
    literal = [f"{f}:{c.lineno}" for f, c in calls if isinstance(c.args[0], ast.Constant)]
    assert not literal, f"publish an EventKind member instead of a string: {literal}"


def test_the_catalogue_holds_every_kind_subscribers_read() -> None:
    # the kinds the desktop, the notifier and the CLI compare against, by their wire names
    names = (
        "lane.state",
        "lane.ready",
        "download.progress",
        "engine.done",
        "job.completed",
        "safety.refused",
    )
    for name in names:
        assert EventKind(name).value == name


async def test_the_bus_refuses_a_kind_outside_the_catalogue() -> None:
    bus = EventBus()
    async with bus.subscribe() as q:
        bus.publish(EventKind.LIBRARY_CHANGED, model="m", reason="test")
        ev = q.get_nowait()
        assert ev.kind is EventKind.LIBRARY_CHANGED and ev.data == {"model": "m", "reason": "test"}
        with pytest.raises(ValueError):
            bus.publish("made.up", x=1)  # type: ignore[arg-type]
        assert q.empty()
