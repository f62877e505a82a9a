"""The `switchyard` command line: the parser is built from the command groups in app/cli (gui is the
default command). The GUI is imported lazily, so every headless command runs without Qt installed."""

from __future__ import annotations

import argparse
import sys
from types import ModuleType

from app import __version__
from app.cli import GROUPS
from app.cli.context import CliContext
from app.cli.options import reader_gone
from app.core.errors import SwitchyardError


def _parser(owners: dict[str | None, ModuleType] | None = None) -> argparse.ArgumentParser:
    """The whole parser; `owners` is filled with each command's group module."""
    ap = argparse.ArgumentParser(
        prog="switchyard", description="Local AI models behind one OpenAI-compatible endpoint."
    )
    ap.add_argument("--version", action="version", version=f"switchyard {__version__}")
    ap.add_argument(
        "--cacert",
        metavar="FILE",
        help="trust this PEM certificate for an https server (default: the one the running server recorded)",
    )
    sub = ap.add_subparsers(dest="command")
    for group in GROUPS:
        before = set(sub.choices)
        group.register(sub)
        if owners is not None:
            owners.update(dict.fromkeys(set(sub.choices) - before, group))
    return ap


def main(argv: list[str] | None = None) -> int:
    owners: dict[str | None, ModuleType] = {}
    args = _parser(owners).parse_args(argv)
    owners[None] = owners["gui"]  # no command: the window
    try:
        return int(owners[args.command].run(args, CliContext.from_args(args)))
    except SwitchyardError as exc:
        print(f"switchyard: error: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `switchyard ls --json | head -1`: the reader has what it wanted
        return reader_gone()


if __name__ == "__main__":
    raise SystemExit(main())
