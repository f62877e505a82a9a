"""`switchyard engine install` surveys the architectures a build loads only for the capability lane, and
knows that lane by its registered kind (app/lanes/engines/llamacpp/compat.py), never by its name."""

from __future__ import annotations

from app.cli.engine import _is_capability_lane
from app.routing.engines import LANES

LLAMA_CPP_COMPAT = "llama.cpp-compat"


def test_only_the_capability_lane_is_surveyed_after_install() -> None:
    assert [lane for lane in LANES if _is_capability_lane(lane)] == [LLAMA_CPP_COMPAT]
    assert not _is_capability_lane("no-such-engine")
