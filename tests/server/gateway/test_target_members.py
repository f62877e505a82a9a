"""What the gateway asks a Target (app/lanes/target.py) instead of testing its class: a local Lane and a
RemoteLane each answer for themselves (the session, the trace, the byte relay, the prompt count, a garbled
answer, the request defaults, the draft)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from app.core.errors import RemoteFailedError, UpstreamRefusedError
from app.core.events import EventBus
from app.core.settings import Settings
from app.lanes.engines.plan import LaunchPlan
from app.lanes.lane import Lane
from app.lanes.proc import LogRing
from app.lanes.remote.lane import Remote, RemoteLane
from app.lanes.remote.registry import RemoteRegistry
from app.lanes.remote.store import RemoteSpec, RemoteStore
from app.lanes.target import Target

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _no_plan() -> LaunchPlan:
    raise AssertionError("no start in this test")


async def test_a_local_lane_answers_as_a_local_engine(tmp_path: Path) -> None:
    async with aiohttp.ClientSession() as http:
        lane = Lane(
            model_id="tiny",
            kind="chat",
            plan_factory=_no_plan,
            settings=Settings(),
            bus=EventBus(),
            ring=LogRing(max_lines=10, file=None),
            http=http,
        )
        try:
            assert isinstance(lane, Target)
            assert lane.http is http and lane.relays_raw and lane.tokenizes and not lane.traced
            err = lane.garbled("/tokenize")
            assert isinstance(err, UpstreamRefusedError) and err.status == 502 and err.source == "engine"
            assert "'tiny'" in err.message and "/tokenize" in err.message
            # no plan yet: no llama.cpp slots to fill defaults for, no draft
            assert lane.request_defaults(CHAT, route="chat", settings=Settings()) is None
            assert lane.draft_unsuited(CHAT, settings=Settings()) is None
        finally:
            await lane.close()


async def test_a_remote_model_answers_as_another_host(tmp_path: Path) -> None:
    spec = RemoteSpec(name="box", url="http://127.0.0.1:9/v1")
    lone = Remote(spec, bus=EventBus(), key=(None, None)).lane("big")
    assert not isinstance(lone, Target)  # no session outside a server's registry: nothing to send with
    with pytest.raises(AttributeError, match="outside a server's remote registry"):
        lone.http  # noqa: B018 - the property is what is tested
    assert lone.traced and not lone.relays_raw and not lone.tokenizes
    err = lone.garbled("/v1/chat/completions")
    assert isinstance(err, RemoteFailedError) and "box" in err.message and spec.url in err.message
    assert lone.request_defaults(CHAT, route="chat", settings=Settings()) is None
    assert lone.draft_unsuited(CHAT, settings=Settings()) is None

    store = RemoteStore.at(tmp_path / "home")
    store.add(spec, None)
    async with RemoteRegistry(store, bus=EventBus(), settings=Settings()) as registry:
        held: RemoteLane = registry.remotes["box"].lane("big")
        assert isinstance(held, Target)
        assert held.http is registry.http  # the registry's own session, not the engines'
