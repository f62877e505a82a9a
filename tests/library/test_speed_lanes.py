"""Which lanes' measured speeds calibrate the speed model: the engine registry says (calibrating_lanes), and
app/library/speeds.py counts exactly the lanes its caller passes, naming none itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.paths import Paths
from app.fit.memory import MIB
from app.lanes.engines.registry import calibrating_lanes
from app.library.speeds import LoadKey, Speed, SpeedStore, calibrate
from app.library.store import Library
from app.routing.engines import LANES

LLAMA_CPP = "llama.cpp"

BANDWIDTH = 20e9  # bytes/s: 100 MiB a token bounds a model at ~190 tokens/s


def _rows(lane: str) -> list[Speed]:
    return [
        Speed("big", lane, "CPU", None, 50.0, 100 * MIB, 5, 0.0),
        Speed("small", lane, "CPU", None, 2000.0, MIB // 2, 5, 0.0),
    ]


def test_only_llamacpp_on_its_chosen_runtime_calibrates() -> None:
    """The capability build may be another runtime: its speeds never teach the default build's efficiency."""
    assert calibrating_lanes() == {LLAMA_CPP}
    assert calibrating_lanes() <= set(LANES)


def test_calibration_counts_only_the_lanes_passed() -> None:
    lanes = calibrating_lanes()
    own = calibrate(_rows(LLAMA_CPP), bandwidth=BANDWIDTH, lanes=lanes)
    assert set(own) == {"CPU"} and own["CPU"].models == 2
    for other in (lane for lane in LANES if lane not in lanes):
        assert calibrate(_rows(other), bandwidth=BANDWIDTH, lanes=lanes) == {}, other
        mixed = calibrate([*_rows(LLAMA_CPP), *_rows(other)], bandwidth=BANDWIDTH, lanes=lanes)
        assert mixed == own, other  # another lane's rows change nothing
    assert calibrate(_rows(LLAMA_CPP), bandwidth=BANDWIDTH, lanes=frozenset()) == {}


def test_a_store_asked_to_calibrate_without_its_lanes_says_so(tmp_path: Path) -> None:
    """An empty calibration would hide the missing lanes: the store refuses instead."""
    library = Library.open(Paths(home=tmp_path))
    try:
        store = SpeedStore(library, calibrating=calibrating_lanes())
        store.record("big", key=LoadKey(LLAMA_CPP, "CPU", 100 * MIB, object()), prompt_tps=None, gen_tps=50.0)
        assert set(store.calibration(bandwidth=BANDWIDTH)) == {"CPU"}  # the owner's store calibrates
        with pytest.raises(TypeError, match="calibrating="):
            SpeedStore(library).calibration(bandwidth=BANDWIDTH)
    finally:
        library.close()
