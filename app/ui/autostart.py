"""Start on login: a Linux XDG autostart entry, a macOS LaunchAgent, or a Windows Run key. Off by default;
the entry itself is the setting (nothing else records it), so removing it by hand turns it off too."""

from __future__ import annotations

import importlib
import os
import plistlib
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

NAME = "switchyard"
LABEL = "org.switchyard.desktop"
RUN_KEY = r"Software\Microsoft\Windows\CurrentVersion\Run"


def command() -> list[str]:
    """What login runs: the frozen app itself, or this Python with `-m app gui`."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "gui"]
    return [sys.executable, "-m", "app", "gui"]


def entry_path(
    *, platform: str = sys.platform, home: Path | None = None, env: Mapping[str, str] | None = None
) -> Path | None:
    env = os.environ if env is None else env
    home = home or Path.home()
    if platform == "darwin":
        return home / "Library" / "LaunchAgents" / f"{LABEL}.plist"
    if platform == "win32":
        return None  # a registry value, not a file
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else home / ".config"
    return base / "autostart" / f"{NAME}.desktop"


def _desktop_entry(cmd: list[str]) -> str:
    return (
        "[Desktop Entry]\nType=Application\nName=Switchyard\nComment=Local AI models behind one API\n"
        f"Exec={shlex.join(cmd)}\nTerminal=false\nX-GNOME-Autostart-enabled=true\n"
    )


def _launch_agent(cmd: list[str]) -> bytes:
    return plistlib.dumps({"Label": LABEL, "ProgramArguments": cmd, "RunAtLoad": True})


def enabled(
    *, platform: str = sys.platform, home: Path | None = None, env: Mapping[str, str] | None = None
) -> bool:
    if platform == "win32":
        return _win_get() is not None
    path = entry_path(platform=platform, home=home, env=env)
    return path is not None and path.exists()


def set_enabled(
    on: bool, *, platform: str = sys.platform, home: Path | None = None, env: Mapping[str, str] | None = None
) -> Path | None:
    """Write or remove the entry; returns the file (None on Windows)."""
    cmd = command()
    if platform == "win32":
        _win_set(subprocess_line(cmd) if on else None)
        return None
    path = entry_path(platform=platform, home=home, env=env)
    assert path is not None
    if on:
        path.parent.mkdir(parents=True, exist_ok=True)
        if platform == "darwin":
            path.write_bytes(_launch_agent(cmd))
        else:
            path.write_text(_desktop_entry(cmd), encoding="utf-8")
    else:
        path.unlink(missing_ok=True)
    return path


def subprocess_line(cmd: list[str]) -> str:
    return " ".join(f'"{a}"' if " " in a else a for a in cmd)


def _win_get() -> str | None:  # pragma: no cover - Windows only
    winreg: Any = importlib.import_module("winreg")

    try:
        with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY) as k:
            return str(winreg.QueryValueEx(k, "Switchyard")[0])
    except OSError:
        return None


def _win_set(value: str | None) -> None:  # pragma: no cover - Windows only
    winreg: Any = importlib.import_module("winreg")

    with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY, 0, winreg.KEY_SET_VALUE) as k:
        if value is None:
            try:
                winreg.DeleteValue(k, "Switchyard")
            except FileNotFoundError:
                pass
        else:
            winreg.SetValueEx(k, "Switchyard", 0, winreg.REG_SZ, value)
