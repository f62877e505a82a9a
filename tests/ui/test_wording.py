"""The window's wording of the core's messages (issue 20, defects 8 and 12): buttons, not commands; sizes,
not byte counts; no Python class names."""

from __future__ import annotations

import os
from typing import Any

from app.core.secrets import Secret
from app.core.vault import keyring_put
from app.hub.errors import LOGIN_HINT
from app.routing.engines import install_hint
from app.server.auth import CREATE_HINT
from app.ui.wording import for_window

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before pytest-qt makes its QApplication


def test_commands_become_the_windows_buttons() -> None:
    assert "switchyard" not in for_window(f"the repository is gated: {LOGIN_HINT}")
    assert "Settings page" in for_window(LOGIN_HINT)
    assert for_window(CREATE_HINT) == "create one on the Server page (API keys tab, Create key)"
    hint = for_window(install_hint("mlx"))
    assert "Lanes page and press Install" in hint and "switchyard engine" not in hint
    msg = "ollama can run it too; `switchyard pin acme/m:Q4_0 mistral.rs` to use mistral.rs instead."
    assert "choose mistral.rs under Lane on the Library page" in for_window(msg)
    corrupt = "x is corrupt: expected sha256 a, got b. The bad bytes were deleted; retry the pull"
    assert for_window(corrupt).endswith("press Resume in the Downloads list")


def test_sizes_and_no_class_names() -> None:
    full = "the disk is full: m.gguf stopped at 1048576 of 4294967296 bytes. Free some space"
    assert "1.0 MiB of 4.00 GiB" in for_window(full) and "bytes" not in for_window(full)
    problem = keyring_put("test-user", Secret("value"))  # the tests' keyring backend is the failing one
    assert problem is not None and "keyring.backends" in problem
    assert "keyring.backends" not in for_window(problem) and "password store" in for_window(problem)


def test_the_guard_command_becomes_the_settings_switch() -> None:
    from app.core.errors import SettingsError
    from app.core.policy import parse_policy

    try:
        parse_policy({"enabled": True})
    except SettingsError as exc:
        said = for_window(exc.message)
    else:
        raise AssertionError("a policy with no judge was accepted")
    assert "switchyard" not in said and "`" not in said
    assert "tick Judge requests and answers with a safety model and press Save settings" in said


def test_no_command_line_in_the_windows_own_strings() -> None:
    """Every string the window shows (docstrings aside) names a button, never a `switchyard ...` command;
    wording.py holds them only as patterns to replace."""
    import ast
    from pathlib import Path

    import app.ui

    root = Path(app.ui.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "wording.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and n.body
            and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                if "`switchyard" in node.value:
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {node.value}")
    assert found == []


def test_turning_safety_on_with_no_judge_fetches_one(
    qloop: Any, qapp: Any, fake_hub: Any, tmp_path: Any, isolated_env: Any
) -> None:
    """Settings says what to do in the window, and doing it (tick, Save) sets the default judge and
    downloads it, as `switchyard guard enable` does on the command line."""
    import asyncio
    import json

    import pytest

    pytest.importorskip("qasync")
    from app.core.paths import Paths
    from app.core.settings import Settings
    from app.ui.desktop import Desktop
    from app.ui.pages.settings import default_judge
    from tests.support.asyncwait import until
    from tests.support.tinymodels import CHAT, write_tiny_gguf

    judge = default_judge()
    gguf = write_tiny_gguf(tmp_path / "guard.gguf", CHAT)
    fake_hub.add_repo(judge.repo, {f"guard-{judge.quant}.gguf": gguf}, tags=["gguf"])
    paths = Paths(home=isolated_env)
    settings = Settings.flat(port=0, models_dirs=(tmp_path / "models",), monitor_interval_s=0)

    async def scenario() -> None:
        async with Desktop(paths, settings, qapp=qapp) as desk:
            sp = desk.window.show_page("Settings")
            said = sp.safety_judges.text()
            assert "switchyard" not in said and "tick the box above and press Save settings" in said
            sp.safety_on.setChecked(True)
            assert sp.save() is True, sp.status.text()
            assert sp.applying is not None and sp.judge_download is not None
            await sp.applying
            written = json.loads(paths.settings_file.read_text())
            assert written["policy"]["enabled"] is True
            assert written["policy"]["judges"] == [{"model": judge.model, "format": judge.format}]
            assert "max_loaded_lanes" not in written  # the judge has a lane of its own beside the text lane
            job = await sp.judge_download
            assert job.repo == judge.repo
            await until(lambda: desk.window.pages["Discover"].job_state(job.id) == "completed", what="judge")
            assert sp.safety_judges.text().startswith(f"Judges: {judge.model}")

    qloop.run_until_complete(asyncio.wait_for(scenario(), 90))
