"""Flags several command groups share, and the plain-text table they print."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeAlias

# what each group's register() is given
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def models_dir_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--models-dir",
        action="append",
        type=Path,
        dest="models_dirs",
        metavar="DIR",
        help="folder of models (repeatable; default $SWITCHYARD_HOME/models)",
    )


def api_key_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api-key", help="key for a server that requires one (default: $SWITCHYARD_API_KEY)")


def table(rows: Sequence[Sequence[str]], *, pad_last: bool = False) -> None:
    """Columns two spaces apart; the last one is left ragged unless `pad_last` (then lines are stripped)."""
    last = len(rows[0]) if pad_last else len(rows[0]) - 1
    widths = [max(len(r[i]) for r in rows) for i in range(last)]
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r, widths, strict=False)]
        print(("  ".join(cells)).rstrip() if pad_last else "  ".join(cells) + "  " + r[-1])


def show_list(
    doc: object,
    *,
    as_json: bool,
    empty: str,
    rows: Callable[[], Sequence[Sequence[str]]],
    pad_last: bool = True,
) -> None:
    """A listing as a command prints it: `doc` as JSON with --json; else `empty` (what to do to have
    something) when `rows()` holds only its header, else `rows()` as a table."""
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    lines = rows()
    if len(lines) <= 1:
        print(empty)
        return
    table(lines, pad_last=pad_last)


# a command whose reader went away (`switchyard ps | head -1`): the exit status of a process ended by SIGPIPE
PIPE_CLOSED_STATUS = 128 + 13


def reader_gone() -> int:
    """What a command returns when stdout's reader closed the pipe: no traceback. Python ignores SIGPIPE, so
    a write raises BrokenPipeError instead, and so would the flush at exit: stdout is pointed at the null
    device first, where that flush succeeds."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return PIPE_CLOSED_STATUS
