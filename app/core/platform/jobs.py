"""Windows Job Objects: an engine's whole process tree as one thing that can be ended, and that ends
by itself when the server's handle to it closes, however the server ends (quit, crash, killed).

A job is created with JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE and its handle is not inherited, so only the
server holds it: when the server's process goes away, Windows closes the handle and kills every process
in the job. Processes an engine starts after it was added join the job by themselves.

Windows only: `Job.create()` raises PlatformError elsewhere (POSIX uses process groups: procs.py).
"""

from __future__ import annotations

import ctypes
import sys
from ctypes import wintypes
from typing import Any

from app.core.errors import PlatformError

_KILL_ON_JOB_CLOSE = 0x2000
_EXTENDED_LIMIT_INFORMATION = 9
_BASIC_ACCOUNTING_INFORMATION = 1
_PROCESS_SET_QUOTA, _PROCESS_TERMINATE = 0x0100, 0x0001


class _BasicLimit(ctypes.Structure):
    _fields_ = [
        ("PerProcessUserTimeLimit", ctypes.c_int64),
        ("PerJobUserTimeLimit", ctypes.c_int64),
        ("LimitFlags", wintypes.DWORD),
        ("MinimumWorkingSetSize", ctypes.c_size_t),
        ("MaximumWorkingSetSize", ctypes.c_size_t),
        ("ActiveProcessLimit", wintypes.DWORD),
        ("Affinity", ctypes.c_size_t),
        ("PriorityClass", wintypes.DWORD),
        ("SchedulingClass", wintypes.DWORD),
    ]


class _IoCounters(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("R", "W", "O", "RB", "WB", "OB")]


class _ExtendedLimit(ctypes.Structure):
    _fields_ = [
        ("BasicLimitInformation", _BasicLimit),
        ("IoInfo", _IoCounters),
        ("ProcessMemoryLimit", ctypes.c_size_t),
        ("JobMemoryLimit", ctypes.c_size_t),
        ("PeakProcessMemoryUsed", ctypes.c_size_t),
        ("PeakJobMemoryUsed", ctypes.c_size_t),
    ]


class _Accounting(ctypes.Structure):
    _fields_ = [
        ("TotalUserTime", ctypes.c_int64),
        ("TotalKernelTime", ctypes.c_int64),
        ("ThisPeriodTotalUserTime", ctypes.c_int64),
        ("ThisPeriodTotalKernelTime", ctypes.c_int64),
        ("TotalPageFaultCount", wintypes.DWORD),
        ("TotalProcesses", wintypes.DWORD),
        ("ActiveProcesses", wintypes.DWORD),
        ("TotalTerminatedProcesses", wintypes.DWORD),
    ]


def _kernel32() -> Any:
    if sys.platform != "win32":
        raise PlatformError("Job Objects exist only on Windows; POSIX engines run in a process group")
    k = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined,unused-ignore]
    k.CreateJobObjectW.restype = wintypes.HANDLE
    k.CreateJobObjectW.argtypes = (ctypes.c_void_p, wintypes.LPCWSTR)
    k.SetInformationJobObject.argtypes = (wintypes.HANDLE, ctypes.c_int, ctypes.c_void_p, wintypes.DWORD)
    k.QueryInformationJobObject.argtypes = (
        wintypes.HANDLE,
        ctypes.c_int,
        ctypes.c_void_p,
        wintypes.DWORD,
        ctypes.c_void_p,
    )
    k.OpenProcess.restype = wintypes.HANDLE
    k.OpenProcess.argtypes = (wintypes.DWORD, wintypes.BOOL, wintypes.DWORD)
    k.AssignProcessToJobObject.argtypes = (wintypes.HANDLE, wintypes.HANDLE)
    k.TerminateJobObject.argtypes = (wintypes.HANDLE, wintypes.UINT)
    k.CloseHandle.argtypes = (wintypes.HANDLE,)
    return k


def _failed(what: str) -> PlatformError:
    code = getattr(ctypes, "get_last_error", lambda: 0)()  # Windows-only in ctypes
    return PlatformError(f"Windows refused to {what} (error {code})")


class Job:
    """One Job Object owned by this process. Not thread-safe; one owner (an engine's EngineProcess)."""

    def __init__(self, handle: int) -> None:
        self._k = _kernel32()
        self._handle: int | None = handle

    @classmethod
    def create(cls) -> Job:
        """A new job whose processes all die when its last handle closes."""
        k = _kernel32()
        handle = k.CreateJobObjectW(None, None)
        if not handle:
            raise _failed("create a Job Object")
        info = _ExtendedLimit()
        info.BasicLimitInformation.LimitFlags = _KILL_ON_JOB_CLOSE
        if not k.SetInformationJobObject(
            handle, _EXTENDED_LIMIT_INFORMATION, ctypes.byref(info), ctypes.sizeof(info)
        ):
            err = _failed("set a Job Object's kill-on-close limit")
            k.CloseHandle(handle)
            raise err
        return cls(handle)

    def add(self, pid: int) -> None:
        """Put process `pid` (and so everything it starts from now on) into the job."""
        process = self._k.OpenProcess(_PROCESS_SET_QUOTA | _PROCESS_TERMINATE, False, pid)
        if not process:
            raise _failed(f"open process {pid}")
        try:
            if not self._k.AssignProcessToJobObject(self._live(), process):
                raise _failed(f"add process {pid} to a Job Object")
        finally:
            self._k.CloseHandle(process)

    def active_processes(self) -> int:
        """How many processes of the job are still running."""
        info = _Accounting()
        if not self._k.QueryInformationJobObject(
            self._live(), _BASIC_ACCOUNTING_INFORMATION, ctypes.byref(info), ctypes.sizeof(info), None
        ):
            raise _failed("read a Job Object's process count")
        return int(info.ActiveProcesses)

    def terminate(self, *, code: int = 1) -> None:
        """End every process of the job now (the job itself stays until close)."""
        if self._handle is not None:
            self._k.TerminateJobObject(self._handle, code)

    def close(self) -> None:
        """Close our handle: whatever still runs in the job is killed (kill-on-close)."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            self._k.CloseHandle(handle)

    def _live(self) -> int:
        if self._handle is None:
            raise PlatformError("this Job Object is closed already")
        return self._handle
