"""The window applies settings without a restart (issue 20 defect 10, issue 16): the Settings page shows the
hub HF_ENDPOINT names, writes only the keys changed and a new hub answers at once; the Tune panel writes
only the values changed and restarts the loaded model's lane alone, with the plan before shown beside."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
qasync = pytest.importorskip("qasync")

from app.core.paths import Paths  # noqa: E402
from app.core.settings import Settings  # noqa: E402
from app.hub.api import SearchQuery  # noqa: E402
from tests.conftest import link_models  # noqa: E402
from tests.support.fakehub import FakeHub  # noqa: E402


def test_settings_and_tune_apply_live(
    qloop: asyncio.AbstractEventLoop,
    qapp: Any,
    tmp_path: Path,
    fake_hub: FakeHub,
    isolated_env: Path,
    model_store: Path,
) -> None:
    from app.ui.desktop import Desktop

    fake_hub.add_repo("acme/first-GGUF", {"README.md": b"# one\n"}, tags=["gguf"])
    paths = Paths(home=isolated_env)
    models = link_models(tmp_path / "models", model_store / "tiny.gguf", model_store / "tiny2.gguf")
    settings = Settings.flat(port=0, models_dirs=(models,), monitor_interval_s=0, max_loaded_lanes=2)

    async def scenario() -> None:
        with FakeHub() as second:
            second.add_repo("acme/second-GGUF", {"README.md": b"# two\n"}, tags=["gguf"])
            async with Desktop(paths, settings, qapp=qapp) as desk:
                sp = desk.window.show_page("Settings")
                # the hub in use is HF_ENDPOINT's, not the default; the field itself stays unset
                assert sp.hub_in_use.text() == f"Hub in use: {fake_hub.url} (HF_ENDPOINT)"
                assert sp.endpoint.text() == "" and fake_hub.url in sp.endpoint.placeholderText()
                sp.endpoint.setText(second.url)
                sp.ttl.setValue(120)
                assert sp.save() is True and sp.applying is not None
                await sp.applying
                # only what changed was written, and the running window took it at once
                assert json.loads(paths.settings_file.read_text()) == {
                    "hf_endpoint": second.url,
                    "idle_ttl_s": 120.0,
                }
                assert desk.runtime.settings.memory.idle_ttl_s == 120.0
                assert sp.hub_in_use.text() == f"Hub in use: {second.url} (this setting)"
                assert "In use now: Unload idle models after, Hugging Face mirror." in sp.saved.text()
                page = await asyncio.to_thread(lambda: desk.hub.client().search(SearchQuery(text="GGUF")))
                assert "acme/second-GGUF" in json.dumps(page.public())

                # Tune: a loaded model's new context restarts its lane only, and only ctx_size is written
                rt = desk.runtime
                tiny, other = await rt.supervisor.load("tiny"), await rt.supervisor.load("tiny2")
                pid, other_pid = tiny.proc.pid if tiny.proc else None, other.proc.pid if other.proc else None
                tune = desk.window.show_page("Library").tune
                tune.show_model("tiny")
                await tune._task
                tune.ctx.setValue(2048)
                await tune._task
                assert "(now: " in tune.verdict.text()  # the plan it runs with, beside the new one
                assert tune.save() is True and tune.applying is not None
                await tune.applying
                saved = json.loads(paths.settings_file.read_text())["model_overrides"]
                assert saved == {"tiny": {"ctx_size": 2048}}
                assert "its lane restarted with ctx_size" in tune.verdict.text()
                assert tiny.proc is not None and tiny.proc.pid != pid and tiny.state == "ready"
                assert tiny.plan is not None and tiny.plan.public()["params"]["ctx_size"] == 2048
                assert other.proc is not None and other.proc.pid == other_pid
                desk.quit()
                await desk.run()

    qloop.run_until_complete(asyncio.wait_for(scenario(), 120))
