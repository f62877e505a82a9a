"""Whether a process tree is stopped (SIGSTOP, a debugger, a frozen cgroup), asked once a second per engine.

On Linux the tree is walked through its own /proc entries (each thread's `children` list and each
process's `stat` state), so the cost is the engine's few processes. psutil's `children()` reads the
`stat` of every process on the machine instead, which on a busy machine made this check 4 to 8 % of the
server's CPU, on the event loop. Elsewhere (or without `children` lists) psutil answers (imported
only then).
"""

from __future__ import annotations

import os
import threading

_FROZEN_STATES = (b"T", b"t")  # /proc/<pid>/stat: stopped, tracing stop (psutil's "stopped", "tracing-stop")


def tree_stopped(pid: int) -> bool:
    """Whether `pid` or any process under it is stopped; False when `pid` is gone (its exit is reported
    elsewhere)."""
    if _has_children_lists():
        return _proc_tree_stopped(pid)
    # imported here: this package is standard library only at import (engine workers import it)
    import psutil

    frozen = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    try:
        root = psutil.Process(pid)
        return any(p.status() in frozen for p in (root, *root.children(recursive=True)))
    except psutil.Error:
        return False


def _has_children_lists() -> bool:
    """Linux with CONFIG_PROC_CHILDREN: each thread lists the children it forked."""
    return os.path.exists(f"/proc/self/task/{threading.get_native_id()}/children")


def _proc_tree_stopped(pid: int) -> bool:
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                stat = f.read()
            at = stat.rindex(b")") + 2  # the name may hold spaces and parentheses; the state follows it
            if stat[at : at + 1] in _FROZEN_STATES:
                return True
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children", "rb") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue  # gone meanwhile (the root too): nothing stopped there
    return False
