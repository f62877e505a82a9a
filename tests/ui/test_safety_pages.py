"""The desktop Settings page's Safety section: it shows the policy's judges, and a switch turned off is
written into `policy` and applied to the running Runtime at once."""

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


def test_safety_section_writes_the_policy(
    qloop: asyncio.AbstractEventLoop, qapp: Any, isolated_env: Path
) -> None:
    from app.ui.desktop import Desktop

    paths = Paths(home=isolated_env)
    policy = {"enabled": True, "judges": [{"model": "guard-a", "format": "qwen3guard"}]}
    settings = Settings.flat(port=0, monitor_interval_s=0, policy=policy, start_server_with_app=False)

    async def scenario() -> None:
        async with Desktop(paths, settings, qapp=qapp) as desk:
            sp = desk.window.show_page("Settings")
            assert sp.safety_judges.text() == "Judges: guard-a" and sp.safety_on.isChecked()
            sp.safety_on.setChecked(False)
            sp.safety_fail.setCurrentText("closed")
            assert sp.save() is True and sp.applying is not None
            await sp.applying
            written = json.loads(paths.settings_file.read_text())["policy"]
            assert written["enabled"] is False and written["fail"] == "closed"
            assert written["judges"] == policy["judges"]
            assert desk.runtime.settings.safety.policy["enabled"] is False

    qloop.run_until_complete(scenario())
