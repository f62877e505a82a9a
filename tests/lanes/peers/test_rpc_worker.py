"""A lent RPC worker's CPU threads: the `threads` setting when set, else the cores this process may use.

Real `ggml-rpc-server` processes (the RPC build of scripts/build-llama-rpc.sh). A worker that ran on every
CPU of the machine whatever its affinity mask or cgroup quota said spun its threads against the engines
beside it (llama.cpp's CPU backend spins between graph nodes): on two shared cores that cost 30 to 250 ms
per token, where one thread per engine cost about 1 ms.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psutil
import pytest

from app.lanes.peers import rpc

pytestmark = pytest.mark.skipif(
    rpc.rpc_bin() is None, reason=f"no llama.cpp RPC build: {rpc.missing_build_advice()}"
)


@pytest.fixture
async def workers(tmp_path: Path) -> AsyncIterator[rpc.RpcWorkers]:
    pool = rpc.RpcWorkers(logs=tmp_path / "logs")
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
def one_cpu() -> Iterator[int]:
    """This process (and so the worker it starts) limited to one CPU of several, as a cgroup or `taskset`
    would; the mask is restored after."""
    before = os.sched_getaffinity(0)
    if len(before) < 2:
        pytest.skip("needs a machine with two CPUs or more to narrow the mask")
    os.sched_setaffinity(0, {min(before)})
    try:
        yield len(before)
    finally:
        os.sched_setaffinity(0, before)


def threads_of(worker: rpc.Worker) -> int:
    """The `--threads` the rpc-server itself was started with (it runs under the guard: a child)."""
    procs = [psutil.Process(worker.engine.pid), *psutil.Process(worker.engine.pid).children(recursive=True)]
    for proc in procs:
        argv = proc.cmdline()
        if argv and Path(argv[0]).name == rpc.WORKER:
            return int(argv[argv.index("--threads") + 1])
    raise AssertionError(f"no {rpc.WORKER} under pid {worker.engine.pid}")


async def test_the_threads_setting_is_what_the_worker_computes_on(workers: rpc.RpcWorkers) -> None:
    worker = await workers.start("desk", threads=1)
    assert threads_of(worker) == 1
    assert worker.public()["alive"] and worker.public()["listens"].startswith("127.0.0.1:")


async def test_automatic_threads_follow_the_cpus_this_process_may_use(
    workers: rpc.RpcWorkers, one_cpu: int
) -> None:
    # before the fix the worker took os.cpu_count() (every CPU of the machine, here `one_cpu` of them)
    worker = await workers.start("desk")
    assert threads_of(worker) == 1 < one_cpu
