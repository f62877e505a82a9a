"""vLLM and SGLang are built on the one Python-engine base (issue 13): frozen data, the base's install
check, and their own GPU refusal on top of it."""

from __future__ import annotations

import dataclasses

import pytest

from app.core.settings import Settings
from app.hardware.model import Hardware
from app.lanes.engines.cuda import SGLANG, VLLM
from app.lanes.engines.python_kind import PythonEngineKind
from app.lanes.engines.registry import engine_kinds


def test_cuda_kinds_share_the_python_engine_base() -> None:
    kinds = engine_kinds()
    for kind, title in ((VLLM, "vLLM"), (SGLANG, "SGLang")):
        assert isinstance(kind, PythonEngineKind) and kinds[kind.lane] is kind
        assert (kind.title, kind.memory, kind.formats) == (title, "fraction", frozenset({"safetensors"}))
        install = kind.install(Settings())
        why = kind.start_refusal(Settings(), None)
        assert why is not None  # no NVIDIA GPU here, or not installed: both say so
        if install.installed:  # the GPU check speaks: no hardware was passed
            assert "plan_memory is off" in why
        else:  # the install check speaks first, in its own words, and they say what to install
            assert install.note and why == install.note
            assert f"{kind.dist()} is not installed" in why or "is here but" in why
    with pytest.raises(dataclasses.FrozenInstanceError):
        VLLM.lane = "other"  # type: ignore[misc]


def test_cuda_refusal_comes_after_the_install_check() -> None:
    bare = Hardware.__new__(Hardware)  # the fields are never read: the install check refuses first
    missing = dataclasses.replace(VLLM, module="no_such_module_here", dists=("no-such-dist",))
    assert "no-such-dist is not installed" in (missing.start_refusal(Settings(), bare) or "")


def test_a_remote_lane_counts_its_own_requests() -> None:
    from app.core.events import EventBus
    from app.lanes.remote.lane import Remote
    from app.lanes.remote.store import RemoteSpec

    remote = Remote(RemoteSpec(name="home", url="http://127.0.0.1:9/v1"), bus=EventBus(), key=(None, None))
    lane = remote.lane("m")
    assert lane.in_flight == 0 and lane.last_used is None
    with lane.request(), remote.lane("m").request():
        assert lane.in_flight == 2 and remote.in_flight() == 2 and lane.last_used is not None
    assert lane.in_flight == 0 and remote.in_flight() == 0
    with pytest.raises(AttributeError):
        lane.in_flight = 5  # type: ignore[misc]  # read-only: only request() counts
