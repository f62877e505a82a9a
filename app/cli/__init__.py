"""The `switchyard` command line, one module per command group.

The contract of a group module (adding one is one line in GROUPS below):

- `register(sub)` adds its subcommand(s) to the top-level subparsers (`sub.add_parser(...)`); every flag
  has help in words. A module may register several commands (library: ls, import, rm).
- `run(args, ctx) -> int` runs whichever of its commands `args.command` names, with a
  `CliContext` (app/cli/context.py: the data dir, the settings with the command's flags laid over, and
  the client of a running server) and returns the exit code.
- Errors are raised as SwitchyardError (app/core/errors.py) with a message that says what to do next;
  app/__main__.py prints `switchyard: error: MESSAGE` and exits 2. Ctrl-C exits 130 unless the command
  handles it itself.
- Anything that talks to a running server goes through app/cli/client.py (found once, one JSON client
  with the key and TLS trust, one server-sent event reader); heavy imports stay inside `run`, so a
  command's start does not pay for the others.
"""

from __future__ import annotations

from types import ModuleType

from app.cli import (
    bank,
    doctor,
    engine,
    evaluate,
    explain,
    gate,
    guard,
    gui,
    hub,
    jobs,
    keys,
    launch,
    library,
    load,
    mcp,
    notify,
    peers,
    pin,
    ps,
    pull,
    recommend,
    remote,
    run,
    serve,
    updates,
    version,
)

# the order `switchyard --help` lists them in
GROUPS: tuple[ModuleType, ...] = (
    serve,
    library,
    ps,
    load,
    explain,
    doctor,
    pin,
    keys,
    pull,
    recommend,
    hub,
    remote,
    peers,
    engine,
    bank,
    evaluate,
    gate,
    guard,
    jobs,
    updates,
    notify,
    run,
    launch,
    mcp,
    version,
    gui,
)
