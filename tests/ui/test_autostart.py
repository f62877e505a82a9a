"""Start on login entries (no Qt): Linux XDG autostart and a macOS LaunchAgent, written and removed."""

from __future__ import annotations

import plistlib
import sys
from pathlib import Path

from app.ui import autostart


def test_linux_entry_follows_xdg_config_home(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    assert not autostart.enabled(platform="linux", home=tmp_path, env=env)
    path = autostart.set_enabled(True, platform="linux", home=tmp_path, env=env)
    assert path == tmp_path / "cfg" / "autostart" / "switchyard.desktop"
    text = path.read_text()
    assert text.startswith("[Desktop Entry]") and f"Exec={sys.executable} -m app gui" in text
    assert autostart.enabled(platform="linux", home=tmp_path, env=env)
    autostart.set_enabled(False, platform="linux", home=tmp_path, env=env)
    assert not path.exists() and not autostart.enabled(platform="linux", home=tmp_path, env=env)
    # without XDG_CONFIG_HOME: ~/.config
    assert autostart.entry_path(platform="linux", home=tmp_path, env={}) == (
        tmp_path / ".config" / "autostart" / "switchyard.desktop"
    )


def test_macos_launch_agent_is_a_valid_plist(tmp_path: Path) -> None:
    path = autostart.set_enabled(True, platform="darwin", home=tmp_path, env={})
    assert path == tmp_path / "Library" / "LaunchAgents" / "org.switchyard.desktop.plist"
    doc = plistlib.loads(path.read_bytes())
    assert doc["RunAtLoad"] is True and doc["ProgramArguments"] == [sys.executable, "-m", "app", "gui"]
    autostart.set_enabled(False, platform="darwin", home=tmp_path, env={})
    assert not path.exists()
