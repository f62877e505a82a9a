"""`switchyard version`: the same line as `switchyard --version`."""

from __future__ import annotations

import argparse

from app import __version__
from app.cli.context import CliContext
from app.cli.options import Subparsers


def register(sub: Subparsers) -> None:
    sub.add_parser("version", help="print the version")


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    print(f"switchyard {__version__}")
    return 0
