"""`switchyard gui` (and no command at all): the desktop window, or `serve` where there can be none."""

from __future__ import annotations

import argparse
import os
import sys

from app.cli import serve
from app.cli.context import CliContext
from app.cli.options import Subparsers


def register(sub: Subparsers) -> None:
    sub.add_parser("gui", help="open the desktop window (default)")


def _has_display() -> bool:
    if sys.platform in ("win32", "darwin") or os.environ.get("QT_QPA_PLATFORM"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    why = None
    try:
        from app.ui.main import run_gui  # app/ui: the only package that imports Qt (docs/desktop.md)
    except ImportError:
        why = "the desktop window is not installed (pip install 'switchyard[gui]')"
    if why is None and not _has_display():
        why = "no display (DISPLAY/WAYLAND_DISPLAY unset)"
    if why is not None:
        print(f"{why}; running headless: `switchyard serve`", file=sys.stderr)
        return serve.run_defaults(ctx)
    return int(run_gui(ctx.paths))
