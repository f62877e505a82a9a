"""Which llama.cpp runtime a start uses (app/lanes/install/runtimes.py decides), asked once per start.

Its own module: the kind (server.py) and the capability lane (compat.py) both ask it, and neither may
import the other.
"""

from __future__ import annotations

from app.core.settings import Settings
from app.hardware.model import Hardware
from app.lanes.engines.once import once
from app.lanes.install.runtimes import RuntimeChoice, choose_runtime


def runtime_choice(settings: Settings, hardware: Hardware | None) -> RuntimeChoice:
    """`choose_runtime`, asked once per start (engines/once.py): the kind choice and the build both ask."""
    return once(
        ("llama.cpp runtime", id(settings), hardware is None), lambda: choose_runtime(settings, hardware)
    )
