"""core/platform on this (POSIX) machine; the same module runs as Windows code in tests/windows/."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from app.core.errors import PlatformError
from app.core.platform import files, locks, procs
from app.core.platform.home import data_home
from app.core.platform.jobs import Job
from app.core.platform.parent import server_check
from app.core.platform.ports import port_owner
from app.core.platform.signals import stop_signals


def test_a_held_lock_refuses_a_second_descriptor_until_released(tmp_path: Path) -> None:
    a = os.open(tmp_path / "x.lock", os.O_RDWR | os.O_CREAT)
    b = os.open(tmp_path / "x.lock", os.O_RDWR | os.O_CREAT)
    try:
        locks.lock(a)
        with pytest.raises(BlockingIOError):
            locks.lock(b, wait=False)
        locks.unlock(a)
        locks.lock(b, wait=False)
    finally:
        os.close(a)
        os.close(b)


def test_replace_and_fsync_dir(tmp_path: Path) -> None:
    (tmp_path / "new").write_text("2")
    (tmp_path / "old").write_text("1")
    files.replace(tmp_path / "new", tmp_path / "old")
    files.fsync_dir(tmp_path)
    assert (tmp_path / "old").read_text() == "2" and not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    ("system", "env", "expected"),
    [
        ("win32", {"LOCALAPPDATA": "/w/Local"}, "/w/Local/Switchyard"),
        ("linux", {"XDG_DATA_HOME": "/x/data"}, "/x/data/switchyard"),
        ("darwin", {}, str(Path.home() / "Library" / "Application Support" / "Switchyard")),
    ],
)
def test_data_home_per_os(system: str, env: dict[str, str], expected: str) -> None:
    assert data_home(env, system=system) == Path(expected)


def test_stop_signals_on_posix() -> None:
    assert stop_signals() == (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def test_job_objects_say_they_are_windows_only() -> None:
    with pytest.raises(PlatformError, match="only on Windows"):
        Job.create()


def test_a_group_is_asked_then_killed_whole() -> None:
    # a shell that ignores the polite stop and has a child of its own: kill must end both
    tree = subprocess.Popen(
        ["sh", "-c", "trap '' TERM; sleep 300 & echo $!; wait"],
        stdout=subprocess.PIPE,
        text=True,
        **procs.spawn_options(),
    )
    child = int(tree.stdout.readline())  # type: ignore[union-attr]
    group = procs.ProcessGroup(tree.pid)
    assert group.ask_to_stop()
    time.sleep(0.3)
    assert procs.pid_alive(child) and tree.poll() is None  # both ignore SIGTERM (sleep inherits the trap)
    group.kill()
    tree.wait(timeout=10)
    _gone, alive = psutil.wait_procs([psutil.Process(child)], timeout=10)
    assert not alive
    group.close()


def test_checking_a_pid_leaves_it_running() -> None:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert procs.pid_alive(p.pid) and procs.pid_alive(p.pid)
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()
    assert not procs.pid_alive(p.pid)


def test_the_server_check_follows_the_parent() -> None:
    alive = server_check(os.getppid())
    assert alive is not None and alive()


def test_port_owner_names_a_listener_or_none() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        owner = port_owner(s.getsockname()[1])
    assert owner is None or owner.startswith(f"pid {os.getpid()} ")


def test_swap_is_unknown_where_the_os_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.hardware import swap

    assert swap.swap_now() is not None  # Linux says

    def refuse() -> None:
        raise RuntimeError("no performance counters")  # what psutil raises under wine

    monkeypatch.setattr(swap.psutil, "swap_memory", refuse)
    assert swap.swap_now() is None
