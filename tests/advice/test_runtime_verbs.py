"""The Runtime's verbs (explain, fit_hub_model, hardware_now, check_pin), the one owner of pins.json, and a
start that unwinds the parts already started when a later one fails."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest

from app.advice.explain import Explanation
from app.advice.inputs import with_overrides
from app.core.errors import ModelNotFoundError, SettingsError
from app.core.paths import Paths
from app.core.pins import PinStore
from app.core.settings import Settings
from app.runtime import Runtime
from tests.conftest import link_models

PART_TASKS = {"ttl-reaper", "remote-checks", "hardware-monitor"}


# ---- pins: one owner ---------------------------------------------------------------------------------
def test_pin_store_sets_reads_and_refuses_a_corrupt_file(tmp_path: Path) -> None:
    store = PinStore(tmp_path / "pins.json")
    assert store.all() == {} and store.get("tiny") is None
    assert store.set("tiny", "llama.cpp") is None
    assert store.set("tiny", "mistral.rs") == "llama.cpp"  # the previous lane comes back
    assert store.get("tiny") == "mistral.rs"
    assert store.set("tiny", None) == "mistral.rs" and store.all() == {}
    store.replace({"a": "llama.cpp", "b": "mlx"})
    assert json.loads(store.path.read_text()) == {"a": "llama.cpp", "b": "mlx"}
    store.path.write_text("{broken")
    with pytest.raises(SettingsError, match="fix or remove it"):
        store.get("a")
    assert store.path.read_text() == "{broken"  # reported, never rewritten


def test_overrides_win_over_the_models_saved_ones() -> None:
    saved = Settings.flat(model_overrides={"tiny": {"ctx_size": 1024, "kv_type": "q8_0"}})
    changed = with_overrides(saved, "tiny", {"ctx_size": 2048})
    assert changed.models.model_overrides["tiny"] == {"ctx_size": 2048, "kv_type": "q8_0"}
    assert with_overrides(saved, "tiny", None) is saved and with_overrides(saved, "tiny", {}) is saved


# ---- start and stop ------------------------------------------------------------------------------------
def test_the_constructor_does_no_io(tmp_path: Path) -> None:
    home = tmp_path / "not-yet"
    Runtime(settings=Settings.flat(monitor_interval_s=0), paths=Paths(home=home))
    assert not home.exists()


async def test_a_part_that_fails_to_start_unwinds_the_others(tmp_path: Path) -> None:
    paths = Paths(home=tmp_path / "home")
    paths.home.mkdir(parents=True)
    (paths.home / "remotes.json").write_text("{broken")  # remote lanes start after lanes and downloads
    before = asyncio.all_tasks()
    rt = Runtime(settings=Settings.flat(plan_memory=False, monitor_interval_s=0.05), paths=paths)
    with pytest.raises(SettingsError, match=r"remotes\.json"):
        async with rt:
            pytest.fail("the Runtime started with a corrupt remotes.json")
    # the supervisor and the downloads were started, then stopped; the remotes' half-open session too
    assert rt.supervisor.http.closed and rt.remotes.http.closed
    left = {t.get_name() for t in asyncio.all_tasks() - before}
    assert not left & PART_TASKS, left
    with pytest.raises(sqlite3.ProgrammingError):  # library.db was closed
        rt.library.db.query("SELECT 1")
    # a fixed file starts it; the exit stops every part it started
    (paths.home / "remotes.json").unlink()
    async with Runtime(settings=Settings.flat(plan_memory=False, monitor_interval_s=0.05), paths=paths) as ok:
        running = {t.get_name() for t in asyncio.all_tasks()}
        assert PART_TASKS <= running
    assert not {t.get_name() for t in asyncio.all_tasks() - before} & PART_TASKS
    assert ok.supervisor.http.closed


# ---- the verbs ---------------------------------------------------------------------------------------------
async def test_explain_verb_is_typed_follows_pins_and_overrides(tmp_path: Path, model_store: Path) -> None:
    models = link_models(tmp_path / "m", model_store / "tiny.gguf")
    settings = Settings.flat(models_dirs=(models,), monitor_interval_s=0)
    async with Runtime(settings=settings, paths=Paths.from_env()) as rt:
        found = await rt.explain("tiny")
        assert isinstance(found, Explanation) and found.lane == "llama.cpp" and not found.decision.pinned
        assert found.fit is not None and found.public()["fit"] == found.fit.public()
        assert found.hardware.memory.available is not None  # memory read now
        json.dumps(found.public())  # the wire form is plain JSON
        wider = await rt.explain("tiny", overrides={"ctx_size": 2048})
        assert wider.requested.ctx_size == 2048 and found.requested.ctx_size != 2048
        assert rt.settings.models.model_overrides == {}  # an override is asked, never saved
        rt.pins.set("tiny", "llama.cpp")
        assert (await rt.explain("tiny")).decision.pinned
        await asyncio.to_thread(rt.catalog.scan)  # the library's pins table mirrors pins.json on a scan
        assert rt.library.pins() == {"tiny": "llama.cpp"}
        refusal = await rt.check_pin("tiny", "mlx")  # MLX does not read GGUF
        assert refusal and rt.pins.get("tiny") == "llama.cpp"  # asking never pins
        assert await rt.check_pin("tiny", "llama.cpp") is None
        brief = rt.explain_brief("tiny")
        assert brief is not None and brief.lane == "llama.cpp" and brief.loaded is None
        with pytest.raises(ModelNotFoundError):
            await rt.explain("no-such-model")
        now = await rt.hardware_now()
        assert now.bandwidth is not None and now.memory.total
