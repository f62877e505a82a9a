"""The signals that end a process cleanly, and handlers for them on an asyncio loop or a plain process.

POSIX: SIGTERM (a stop, logout), SIGINT (Ctrl-C), SIGHUP (a closed terminal, a service manager's reload).
Windows has no SIGHUP and its asyncio loop has no add_signal_handler: SIGINT (Ctrl-C) and SIGBREAK
(Ctrl-Break, sent to a console process group) arrive through signal.signal, on the main thread.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable

_NAMES = ("SIGBREAK", "SIGINT") if sys.platform == "win32" else ("SIGTERM", "SIGINT", "SIGHUP")


def stop_signals() -> tuple[signal.Signals, ...]:
    """The signals this OS uses to ask a process to end."""
    return tuple(getattr(signal, name) for name in _NAMES if hasattr(signal, name))


def on_stop_signals(
    loop: asyncio.AbstractEventLoop, callback: Callable[[], None]
) -> tuple[signal.Signals, ...]:
    """Call `callback` on `loop` when a stop signal arrives; the signals handled. Call it from the main
    thread (Python delivers signals only there)."""
    handled = []
    for sig in stop_signals():
        try:
            loop.add_signal_handler(sig, callback)
        except NotImplementedError:  # Windows' loops, and qasync's: a plain handler hands over to the loop
            signal.signal(sig, lambda *_: loop.call_soon_threadsafe(callback))
        except (RuntimeError, ValueError):  # not the main thread, or a signal this process cannot catch
            continue
        handled.append(sig)
    return tuple(handled)


def on_stop_signals_plain(handler: Callable[[int, object], None]) -> tuple[signal.Signals, ...]:
    """signal.signal(sig, handler) for every stop signal of this OS (a process without a loop)."""
    for sig in stop_signals():
        signal.signal(sig, handler)
    return stop_signals()
