"""The Tune panel's speculative decoding and LoRA adapters (issue 16), on the real desktop and Runtime, with
tiny generated models so the pairing is real: the knobs follow the type, within speculation.py's ranges;
the draft picker offers the library's proposal and the other models with the same tokenizer (none where
none qualifies, saying why); the adapters that pair are listed with a scale, one that no longer pairs is
shown as such; a save writes only the keys changed and restarts that model's lane alone; a minimum above
its maximum cannot be saved; every control is reached by Tab and the panel is whole at 1024x640."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
pytest.importorskip("qasync")

from PySide6.QtWidgets import QDoubleSpinBox, QWidget

from app.core.errors import SettingsError
from app.core.paths import Paths
from app.core.settings import Settings
from app.core.speculation import adapters_of, speculation_of
from tests.conftest import link_models
from tests.support.loragen import write_tiny_lora
from tests.support.tinymodels import CHAT, MEDIUM, write_tiny_gguf


@pytest.fixture
def models(tmp_path: Path, model_store: Path) -> Path:
    """mid (the model tuned); tiny and tiny2 (smaller, mid's tokenizer: tiny is proposed, the first by id
    of the smallest); alien (tiny with another token list: no draft for anything); an adapter made for
    mid and one made for tiny (which llama.cpp would refuse on mid)."""
    d = link_models(tmp_path / "models", model_store / "tiny.gguf", model_store / "tiny2.gguf")
    write_tiny_gguf(d / "mid.gguf", MEDIUM)
    data = (model_store / "tiny.gguf").read_bytes()
    word = "\u2581answer".encode()
    assert data.count(word) == 1
    (d / "alien.gguf").write_bytes(data.replace(word, "\u2581ANSWER".encode()))
    write_tiny_lora(d / "mid-style.gguf", MEDIUM)
    write_tiny_lora(d / "chat-lora.gguf", CHAT)
    return d


def saved(paths: Paths) -> dict[str, Any]:
    if not paths.settings_file.exists():
        return {}
    return dict(json.loads(paths.settings_file.read_text()).get("model_overrides") or {})


async def shown(tune: Any, model: str) -> None:
    """Show `model` and wait for its pairings and its fit."""
    tune.show_model(model)
    await tune.pairing
    await tune._task


async def settled(tune: Any) -> None:
    await asyncio.sleep(0)  # the last change's computation was spawned by its signal
    await tune._task


def run(qloop: asyncio.AbstractEventLoop, qapp: Any, home: Path, models: Path, scenario: Any) -> None:
    from app.ui.desktop import Desktop

    settings = Settings.flat(port=0, models_dirs=(models,), monitor_interval_s=0, max_loaded_lanes=2)

    async def main() -> None:
        async with Desktop(Paths(home=home), settings, qapp=qapp) as desk:
            library: Any = desk.window.show_page("Library")
            await scenario(desk, library.tune, Paths(home=home))
            desk.quit()
            await desk.run()

    qloop.run_until_complete(asyncio.wait_for(main(), 180))


def test_ngram_knobs_follow_the_type_and_only_changed_keys_are_saved(
    qloop: asyncio.AbstractEventLoop, qapp: Any, isolated_env: Path, models: Path
) -> None:
    async def scenario(desk: Any, tune: Any, paths: Paths) -> None:
        await shown(tune, "mid")
        assert tune.spec.currentData() == "off" and tune.stack.currentWidget() is tune.pages["off"]
        tune.spec.setCurrentIndex(tune.spec.findData("ngram_simple"))
        page = tune.stack.currentWidget()
        assert page is tune.pages["ngram_simple"] and set(page.spins) == {"size_n", "size_m", "min_hits"}
        assert tune.pages["ngram_mod"] is tune.pages["ngram"] and set(tune.pages["ngram"].spins) == {
            "n_match",
            "n_min",
            "n_max",
        }
        # each knob's box spans exactly what the setting accepts; its lowest step is "default" (left out)
        for kind in ("ngram_simple", "ngram_mod", "draft"):
            for key, spin in tune.pages[kind].spins.items():
                top = spin.maximum()
                speculation_of({"type": kind, key: top})
                with pytest.raises(SettingsError):
                    speculation_of(
                        {"type": kind, key: top + (0.01 if isinstance(spin, QDoubleSpinBox) else 1)}
                    )
                low = spin.minimum() + (0.05 if isinstance(spin, QDoubleSpinBox) else 1)
                speculation_of({"type": kind, key: round(low, 2)})
                assert spin.specialValueText().startswith("default")
                spin.setValue(top + 5)  # typed past the end: held at the top
                assert spin.value() == top
                spin.setValue(spin.minimum())
        page.spins["size_n"].setValue(3)
        page.spins["min_hits"].setValue(2)
        await settled(tune)
        assert (
            tune.verdict.text().startswith("<span style='color:") and ">Fits</span>: " in tune.verdict.text()
        )
        assert tune.save() is True and tune.applying is not None
        await tune.applying
        assert saved(paths) == {"mid": {"speculative": {"type": "ngram_simple", "size_n": 3, "min_hits": 2}}}
        assert "used from its next start" in tune.verdict.text()
        assert desk.runtime.settings.models.model_overrides["mid"]["speculative"]["size_n"] == 3
        # shown again: the saved type and knobs come back, and nothing reads as changed
        await shown(tune, "tiny")
        assert tune.spec.currentData() == "off"
        await shown(tune, "mid")
        assert tune.spec.currentData() == "ngram_simple"
        knobs = tune.pages["ngram_simple"].spins
        assert (knobs["size_n"].value(), knobs["min_hits"].value()) == (3, 2)
        assert knobs["size_m"].value() == knobs["size_m"].minimum()  # never set: still "default"
        assert tune.changed() == {}
        # another knob on the same type: the speculative value is written whole, the other keys are not
        knobs["size_m"].setValue(12)
        await settled(tune)
        assert tune.save() is True
        await tune.applying
        want = {"type": "ngram_simple", "size_n": 3, "size_m": 12, "min_hits": 2}
        assert saved(paths) == {"mid": {"speculative": want}}

    run(qloop, qapp, isolated_env, models, scenario)


def test_draft_picker_proposes_and_refuses_min_above_max(
    qloop: asyncio.AbstractEventLoop, qapp: Any, isolated_env: Path, models: Path
) -> None:
    async def scenario(desk: Any, tune: Any, paths: Paths) -> None:
        await shown(tune, "mid")
        tune.spec.setCurrentIndex(tune.spec.findData("draft"))
        page = tune.pages["draft"]
        assert tune.stack.currentWidget() is page
        box = page.draft
        items = [(box.itemText(i), box.itemData(i)) for i in range(box.count())]
        # the proposal first, labelled, naming none in the setting; then the other model with the tokenizer
        # each with how much smaller than the model it is (what a guess costs beside a model step)
        assert [d for _t, d in items] == [None, "tiny2"], items
        assert items[0][0].startswith("tiny (proposed, ") and items[0][0].endswith("x smaller)"), items
        assert items[1][0].startswith("tiny2 (") and items[1][0].endswith("x smaller)"), items
        assert "Proposed: tiny" in page.note.text()
        assert set(page.spins) == {"n_max", "n_min", "p_min", "max_temperature"}
        await settled(tune)
        # a minimum above the maximum: said at once, and Save refuses it
        page.spins["n_min"].setValue(8)
        page.spins["n_max"].setValue(4)
        await settled(tune)
        assert "Cannot be applied" in tune.verdict.text()
        assert "Min. drafted (8) is above Max. drafted (4)" in tune.verdict.text()
        assert tune.save() is False and tune.verdict.text().startswith("Not saved: Min. drafted (8)")
        assert saved(paths) == {}
        page.spins["n_max"].setValue(16)
        page.spins["p_min"].setValue(0.75)
        box.setCurrentIndex(box.findData("tiny2"))
        await settled(tune)
        assert "Fits" in tune.verdict.text() and "tiny2 shares this model's tokenizer" in page.note.text()
        assert tune.save() is True
        await tune.applying
        want = {"type": "draft", "draft": "tiny2", "n_min": 8, "n_max": 16, "p_min": 0.75}
        assert saved(paths) == {"mid": {"speculative": want}}
        speculation_of(want)  # what was written is what the lane reads
        await shown(tune, "mid")
        assert box.currentData() == "tiny2" and page.spins["p_min"].value() == pytest.approx(0.75)
        assert tune.changed() == {}
        # a model whose tokenizer nothing shares: none qualifies, with why, and a draft cannot be saved
        await shown(tune, "alien")
        tune.spec.setCurrentIndex(tune.spec.findData("draft"))
        await settled(tune)
        assert [box.itemText(i) for i in range(box.count())] == ["none qualifies"]
        assert "None qualifies: no smaller GGUF model in the library shares" in page.note.text()
        assert (
            "Cannot be applied" in tune.verdict.text() and "no draft model qualifies" in tune.verdict.text()
        )
        assert tune.save() is False and "alien" not in saved(paths)
        # a named draft that does not pair (any more) is shown as refused, with why, not dropped
        raw = json.loads(paths.settings_file.read_text())
        raw["model_overrides"]["mid"]["speculative"] = {"type": "draft", "draft": "alien"}
        paths.settings_file.write_text(json.dumps(raw))
        await shown(tune, "mid")
        assert box.currentText() == "alien (refused)" and box.currentData() == "alien"
        assert page.note.text().startswith("alien is refused: its token list differs from the model's")
        assert "Cannot be applied" in tune.verdict.text() and tune.save() is False
        box.setCurrentIndex(0)  # back to the library's proposal: the setting names no draft
        await settled(tune)
        assert tune.save() is True
        await tune.applying
        assert saved(paths) == {"mid": {"speculative": {"type": "draft"}}}

    run(qloop, qapp, isolated_env, models, scenario)


def test_lora_adapters_save_their_scale_and_restart_only_that_lane(
    qloop: asyncio.AbstractEventLoop, qapp: Any, isolated_env: Path, models: Path
) -> None:
    async def scenario(desk: Any, tune: Any, paths: Paths) -> None:
        rt = desk.runtime
        mid, tiny = await rt.supervisor.load("mid"), await rt.supervisor.load("tiny")
        pid, tiny_pid = mid.proc.pid if mid.proc else None, tiny.proc.pid if tiny.proc else None
        await shown(tune, "mid")
        rows = tune.adapters.rows
        # the adapter made for mid pairs; the one made for tiny (other shapes) is not offered
        assert [r.file for r in rows] == ["mid-style.gguf"]
        assert not rows[0].check.isChecked() and rows[0].note.text() == "pairs with this model"
        top = rows[0].scale.maximum()  # the scale's box spans what the setting accepts
        assert adapters_of([{"file": "a.gguf", "scale": top}]) and rows[0].scale.minimum() == -top
        with pytest.raises(SettingsError):
            adapters_of([{"file": "a.gguf", "scale": top + 0.01}])
        rows[0].check.setChecked(True)
        rows[0].scale.setValue(0.5)
        await settled(tune)
        assert (
            tune.verdict.text().startswith("<span style='color:") and ">Fits</span>: " in tune.verdict.text()
        )
        assert tune.save() is True
        await tune.applying
        assert saved(paths) == {"mid": {"lora": [{"file": "mid-style.gguf", "scale": 0.5}]}}
        assert "its lane restarted with lora" in tune.verdict.text()
        assert mid.proc is not None and mid.proc.pid != pid and mid.state == "ready"
        params = mid.plan.public()["params"] if mid.plan else {}
        assert params["lora_paths"][0].endswith("mid-style.gguf") and list(params["lora_scales"]) == [0.5]
        assert tiny.proc is not None and tiny.proc.pid == tiny_pid  # the other lane did not restart

        # the file names an adapter that no longer pairs: shown, ticked, marked, and it blocks the save
        raw = json.loads(paths.settings_file.read_text())
        raw["model_overrides"]["mid"]["lora"].append({"file": "chat-lora.gguf", "scale": 1.0})
        paths.settings_file.write_text(json.dumps(raw))
        await shown(tune, "mid")
        rows = tune.adapters.rows
        assert [(r.file, r.check.isChecked()) for r in rows] == [
            ("mid-style.gguf", True),
            ("chat-lora.gguf", True),
        ]
        assert "no longer pairs" in rows[1].note.text() and "attn_q" in rows[1].note.text()
        assert (
            "Cannot be applied" in tune.verdict.text()
            and "chat-lora.gguf no longer pairs" in tune.verdict.text()
        )
        assert tune.save() is False
        rows[1].check.setChecked(False)
        await settled(tune)
        assert tune.save() is True
        await tune.applying
        assert saved(paths) == {"mid": {"lora": [{"file": "mid-style.gguf", "scale": 0.5}]}}
        adapters_of(saved(paths)["mid"]["lora"])

    run(qloop, qapp, isolated_env, models, scenario)


def test_every_control_is_reached_by_tab_and_whole_at_1024x640(
    qloop: asyncio.AbstractEventLoop, qapp: Any, isolated_env: Path, models: Path
) -> None:
    async def scenario(desk: Any, tune: Any, paths: Paths) -> None:
        w = desk.window
        w.resize(1024, 640)
        w.show()
        await shown(tune, "mid")
        tune.spec.setCurrentIndex(tune.spec.findData("draft"))
        await settled(tune)
        page = tune.pages["draft"]
        row = tune.adapters.rows[0]
        want = [*page.spins.values(), page.draft, row.check, row.scale, tune.save_btn]
        seen: list[QWidget] = []
        focus = tune.spec
        for _ in range(200):  # Tab's order: the next widget in the chain that takes it and is shown
            focus = focus.nextInFocusChain()
            if focus is tune.ctx:
                break
            if focus.isVisibleTo(tune) and focus.isEnabled() and focus.focusPolicy().value & 1:
                seen.append(focus)
        assert [x for x in seen if x in want] == want, [type(x).__name__ for x in seen]
        assert [x for x in seen if tune.isAncestorOf(x)][-1] is tune.save_btn  # Save comes last
        area = tune.parentWidget().parentWidget()
        await asyncio.sleep(0.05)
        # not cut sideways nor at the bottom: the panel's width within the page, its height for that width
        assert tune.minimumSizeHint().width() <= area.width() <= 1024
        assert tune.heightForWidth(tune.width()) <= tune.height(), (
            tune.heightForWidth(tune.width()),
            tune.height(),
        )
        for label in (page.note, tune.verdict, row.note):
            assert label.wordWrap() and label.isVisibleTo(tune)

    run(qloop, qapp, isolated_env, models, scenario)
