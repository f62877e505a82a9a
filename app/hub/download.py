"""The download manager: a queue of jobs, a few files at once, progress on the event bus.

A job is one repository commit and a set of its files (a quantization with all its parts and its
projector, or one named file). Jobs are kept in `<state_dir>/<id>.json` (written atomically), so a job
that was queued or running when the process stopped - or was killed - continues on the next start, from
the partial bytes its files left in the cache (app/hub/transfer.py). A paused job stays paused.

Events, each with {id, repo, revision, file, bytes_done, bytes_total, rate_bps, eta_s, delta, error}:
download.queued, started, progress (at most every `progress_interval_s` per job; `delta` counts the bytes
received since the previous progress event of that job), paused, resumed, completed, failed, cancelled.

A job's state moves only as JOB_TRANSITIONS allows, through `DownloadManager._set`, which saves the job and
publishes the move as its event (MOVE_EVENTS); `download.queued` announces a new job, not a move.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import secrets
import shutil
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import aiohttp

from app.core import background, statefile
from app.core.background import all_cancelled
from app.core.errors import (
    BadRequestError,
    DiskFullError,
    DownloadBusyError,
    DownloadError,
    DownloadNotFoundError,
    HubFileNotFoundError,
    SwitchyardError,
)
from app.core.events import EventBus, EventKind
from app.core.jobs import ACTIVE, TRANSITIONS, JobState
from app.core.secrets import Secret
from app.core.settings import Settings
from app.core.units import fmt_bytes
from app.hub import cache_layout, safe_names
from app.hub.client import explicit_proxy, offline_error
from app.hub.config import HubConfig, hub_config
from app.hub.selection import RepoCommit, fetch_commit, select
from app.hub.slots import Slots
from app.hub.transfer import FileSpec, Transfer, TransferOptions, partial_bytes, remove_partial

# one state machine for every job (app/core/jobs.py): a download uses all of it
JOB_TRANSITIONS = TRANSITIONS
MOVE_EVENTS = {
    JobState.QUEUED: EventKind.DOWNLOAD_RESUMED,
    JobState.RUNNING: EventKind.DOWNLOAD_STARTED,
    JobState.PAUSED: EventKind.DOWNLOAD_PAUSED,
    JobState.COMPLETED: EventKind.DOWNLOAD_COMPLETED,
    JobState.FAILED: EventKind.DOWNLOAD_FAILED,
    JobState.CANCELLED: EventKind.DOWNLOAD_CANCELLED,
}
MIB = 1024 * 1024
# a job resumed at start may find its partial still locked by the process that ran it before, while that
# one shuts down (a quick quit and restart): the resume waits this long for the lock before it fails
RESUME_LOCK_WAIT_S = 30.0


def env_token() -> Secret | None:
    """HF_TOKEN from the environment: the fallback where no token store is passed in."""
    value = os.environ.get("HF_TOKEN", "").strip()
    return Secret(value) if value else None


def _size(n: int) -> str:
    return f"{n} bytes ({fmt_bytes(n)})"


def disk_margin(need: int) -> int:
    """Room kept free beside a download: 1% of it, at least 32 MiB (filesystem metadata, other writers)."""
    return max(32 * MIB, need // 100)


@dataclass
class Job:
    id: str
    repo: str
    revision: str
    commit: str
    files: list[FileSpec]
    selector: str | None = None
    kind: str = "pull"  # or "update": refs move only when every file is in; "candidate": a gated update
    previous: str | None = None  # update: the commit refs/<revision> pointed at before
    state: JobState = JobState.QUEUED
    error: str | None = None
    error_code: str | None = None
    created: float = field(default_factory=time.time)
    # live, not persisted
    bytes_done: int = 0
    per_file: dict[str, int] = field(default_factory=dict)
    file: str | None = None
    received: int = 0
    _sent: int = 0
    _last_emit: float = 0.0
    _samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=64))

    @property
    def bytes_total(self) -> int:
        return sum(f.size for f in self.files)

    def rate(self) -> float:
        """Bytes per second over the last few seconds of received bytes."""
        now = time.monotonic()
        while len(self._samples) > 2 and now - self._samples[0][0] > 5:
            self._samples.popleft()
        if len(self._samples) < 2:
            return 0.0
        (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        return (b1 - b0) / (now - t0) if now > t0 and t1 > t0 else 0.0

    def data(self) -> dict[str, Any]:
        rate = self.rate() if self.state is JobState.RUNNING else 0.0
        left = self.bytes_total - self.bytes_done
        return {
            "id": self.id,
            "repo": self.repo,
            "revision": self.revision,
            "file": self.file,
            "file_bytes": self.per_file.get(self.file, 0) if self.file else None,
            "file_total": next((f.size for f in self.files if f.path == self.file), None),
            "bytes_done": self.bytes_done,
            "bytes_total": self.bytes_total,
            "rate_bps": round(rate),
            "eta_s": round(left / rate, 1) if rate > 0 else None,
            "delta": 0,
            "error": self.error,
        }

    def public(self) -> dict[str, Any]:
        return {
            **self.data(),
            "commit": self.commit,
            "state": self.state,
            "kind": self.kind,
            "selector": self.selector,
            "previous": self.previous,
            "error_code": self.error_code,
            "created": self.created,
            "files": [f.public() for f in self.files],
        }

    def persisted(self) -> dict[str, Any]:
        keys = ("id", "repo", "revision", "commit", "selector", "kind", "previous", "state", "error",
                "error_code", "created")  # fmt: skip
        return {**{k: getattr(self, k) for k in keys}, "files": [f.public() for f in self.files]}

    @classmethod
    def restore(cls, doc: dict[str, Any]) -> Job:
        files = [FileSpec(f["path"], int(f["size"]), f.get("sha256"), f.get("oid")) for f in doc["files"]]
        keys = ("id", "repo", "revision", "commit", "selector", "kind", "previous", "state", "error",
                "error_code", "created")  # fmt: skip
        known = {k: doc[k] for k in keys if k in doc}
        if "state" in known:
            known["state"] = JobState(known["state"])  # a foreign state: ValueError, the file is skipped
        return cls(files=files, **known)


class DownloadManager:
    """Owns the HTTP session and the job tasks; use as an async context manager."""

    def __init__(
        self,
        *,
        settings: Settings,
        bus: EventBus,
        state_dir: Path,
        token: Callable[[], Secret | None] = env_token,
        options: TransferOptions | None = None,
        margin: Callable[[int], int] = disk_margin,
        progress_interval_s: float = 0.25,
        resume_on_start: bool = True,
        on_complete: Callable[[str], None] | None = None,
    ) -> None:
        self.on_complete = on_complete  # called with the repo id once a job's files are all in place
        self.settings = settings
        self.bus = bus
        self.state_dir = state_dir
        self.token = token
        self.options = options or TransferOptions(parts=settings.downloads.download_parts)
        self.margin = margin
        self.progress_interval_s = progress_interval_s
        self.resume_on_start = resume_on_start
        self.jobs: dict[str, Job] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        # paused or cancelled tasks until their cleanup is over: a resume waits for it, or it would find
        # the partial still locked by the task it replaces ("being downloaded by another process")
        self._stopping: dict[str, asyncio.Task[None]] = {}
        self._slots = Slots(settings.downloads.download_concurrency)
        self._session: aiohttp.ClientSession | None = None
        self._persisted: set[str] = set()  # ids of the jobs whose state file this manager read or wrote
        self._resumed: set[str] = set()  # jobs this manager resumed at its start (see RESUME_LOCK_WAIT_S)

    def config(self) -> HubConfig:
        return hub_config(self.settings, token=self.token())

    async def apply_settings(self, settings: Settings) -> None:
        """New settings for the jobs to come and those running: the hub endpoint, proxy and offline mode
        are read at each job's start; the concurrency limit changes now; parts apply to the next transfer."""
        self.settings = settings
        self.options = dataclasses.replace(self.options, parts=settings.downloads.download_parts)
        await self._slots.resize(settings.downloads.download_concurrency)

    # --- lifecycle --------------------------------------------------------------------------------

    async def __aenter__(self) -> DownloadManager:
        self._session = aiohttp.ClientSession(auto_decompress=False, trust_env=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for p in sorted(self.state_dir.glob("*.json")):
            try:
                job = Job.restore(json.loads(p.read_text()))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # a half-written file cannot happen (atomic writes); a foreign one is skipped
            self.jobs[job.id] = job
            self._persisted.add(job.id)
            job.bytes_done = self._have(job)
        if self.resume_on_start and not self.config().offline:
            for job in self.jobs.values():
                if job.state in ACTIVE:
                    self._resumed.add(job.id)
                    self._set(job, JobState.QUEUED)
                    self._start(job)
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        # stopping keeps every job's recorded state: queued and running ones continue on the next start
        await all_cancelled(self._tasks.values())
        await asyncio.gather(*self._stopping.values(), return_exceptions=True)
        self._tasks.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # --- jobs -------------------------------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise DownloadNotFoundError(f"no download {job_id!r}; GET /api/downloads lists them")
        return job

    def all_jobs(self) -> list[Job]:
        return sorted(self.jobs.values(), key=lambda j: j.created)

    async def submit(
        self,
        repo: str,
        *,
        revision: str | None = None,
        quant: str | None = None,
        file: str | None = None,
        mmproj: str | None = None,
    ) -> Job:
        """Resolve `repo[:quant|:file]` on the hub and queue it; an unfinished job for the same files
        is resumed instead of doubled. `mmproj` names the vision projector pulled with a quantization
        (default: the matching f16 one; "none": none)."""
        safe_names.check_repo_id(repo)
        if quant and file:
            raise BadRequestError("give either a quantization or a file, not both", param="quant")
        revision = safe_names.check_revision(revision or "main")
        rc = await asyncio.to_thread(fetch_commit, self.config(), repo, revision)
        files = select(rc, file or quant, mmproj=mmproj)
        if file and [f.path for f in files] != [file]:
            raise HubFileNotFoundError(f"{repo} has no file {file!r} at {revision}", param="file")
        return self._queue(rc, revision, files, selector=file or quant)

    def _queue(
        self,
        rc: RepoCommit,
        revision: str,
        files: list[FileSpec],
        *,
        selector: str | None,
        kind: str = "pull",
        previous: str | None = None,
    ) -> Job:
        paths = sorted(f.path for f in files)
        for job in self.jobs.values():
            same = (
                job.repo == rc.repo and job.commit == rc.commit and sorted(f.path for f in job.files) == paths
            )
            if same and job.state not in (JobState.COMPLETED, JobState.CANCELLED) and job.kind == kind:
                if job.state in (JobState.PAUSED, JobState.FAILED):
                    self.resume(job.id)
                elif job.id not in self._tasks:  # recorded as active by a process that stopped or died
                    self._set(job, JobState.QUEUED)
                    self._start(job)
                return job
        job = Job(
            id=secrets.token_hex(6), repo=rc.repo, revision=revision, commit=rc.commit, files=files,
            selector=selector, kind=kind, previous=previous,
        )  # fmt: skip
        job.bytes_done = self._have(job)
        self.jobs[job.id] = job
        self._save(job)
        self._emit(job, EventKind.DOWNLOAD_QUEUED)
        self._start(job)
        return job

    def pause(self, job_id: str) -> Job:
        job = self.get(job_id)
        if job.state in ACTIVE:
            self._stop(job, JobState.PAUSED)
        return job

    def resume(self, job_id: str) -> Job:
        job = self.get(job_id)
        if job.state in (JobState.PAUSED, JobState.FAILED):
            self._set(job, JobState.QUEUED)
            self._start(job)
        return job

    async def cancel(self, job_id: str) -> Job:
        """Stop the job and delete its partial bytes (finished blobs stay: other snapshots may use them)."""
        job = self.get(job_id)
        if job.state is JobState.COMPLETED:
            raise BadRequestError(f"download {job_id} is complete; remove the model instead", param="id")
        if job.state is JobState.CANCELLED:
            return job  # cancelled already: nothing is left to delete
        task = self._tasks.get(job_id)
        job.bytes_done = 0  # what the event reports: the partial bytes are deleted next
        self._stop(job, JobState.CANCELLED)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        repo_dir = cache_layout.repo_folder(self.config().cache_dir, job.repo)
        for f in job.files:
            await asyncio.to_thread(remove_partial, repo_dir, f)
        job.bytes_done = 0
        self._forget(job)
        return job

    async def wait(self, job_id: str) -> Job:
        """Until the job is completed, failed, cancelled or paused."""
        job = self.get(job_id)
        while job.state in ACTIVE:
            task = self._tasks.get(job_id)
            if task is None:
                break
            await asyncio.gather(asyncio.shield(task), return_exceptions=True)
        return job

    # --- internals --------------------------------------------------------------------------------

    def _save(self, job: Job) -> None:
        """Write the job's state durably, under the jobs' lock (another process may share state_dir)."""
        ours = job.id in self._persisted

        def change(on_disk: str | None) -> Any:
            # a file we read or wrote that is gone now: another process finished or cancelled the job,
            # and a stale copy of it must not come back
            return statefile.KEEP if on_disk is None and ours else job.persisted()

        statefile.update(self._job_file(job), change, parse=str, dump=json.dumps, lock_of=self._jobs_lock())
        self._persisted.add(job.id)

    def _forget(self, job: Job) -> None:
        with statefile.locked(self._jobs_lock()):
            statefile.remove(self._job_file(job))

    def _job_file(self, job: Job) -> Path:
        return self.state_dir / f"{job.id}.json"

    def _jobs_lock(self) -> Path:
        return self.state_dir / "jobs"  # one lock for the folder: no lock file left behind per job

    def _set(self, job: Job, state: JobState, *, error: str | None = None, code: str | None = None) -> None:
        """The one writer of a job's state: a move JOB_TRANSITIONS allows, saved, then published as its
        MOVE_EVENTS event. The error fields are set (None: cleared) with every move but a cancel, which
        keeps the reason a failed job had. Any other move is a bug: RuntimeError, nothing changed."""
        if state not in JOB_TRANSITIONS[job.state]:
            raise RuntimeError(f"download {job.id} cannot go {job.state} -> {state}")
        job.state = state
        if state is not JobState.CANCELLED:
            job.error, job.error_code = error, code
        self._save(job)  # a job forgotten already (completed) is not written back: see _save
        self._emit(job, MOVE_EVENTS[state])

    def _stop(self, job: Job, state: JobState) -> None:
        self._set(job, state)
        task = self._tasks.pop(job.id, None)
        if task is not None:
            task.cancel()
            self._stopping[job.id] = task
            task.add_done_callback(functools.partial(self._stopped, job.id))

    def _stopped(self, key: str, task: asyncio.Task[None]) -> None:
        if self._stopping.get(key) is task:
            del self._stopping[key]

    def _start(self, job: Job) -> None:
        self._tasks[job.id] = asyncio.create_task(self._run(job), name=f"download-{job.id}")

    def _have(self, job: Job) -> int:
        try:
            repo_dir = cache_layout.repo_folder(self.config().cache_dir, job.repo)
        except SwitchyardError:
            return 0  # an unsafe id (a tampered job file): the job fails with the reason when it runs
        for f in job.files:
            try:
                blob = cache_layout.blob_path(repo_dir, f.key)
            except SwitchyardError:
                job.per_file[f.path] = 0
                continue
            job.per_file[f.path] = f.size if blob.exists() else partial_bytes(repo_dir, f)
        return sum(job.per_file.values())

    def _emit(self, job: Job, kind: EventKind, *, delta: int = 0) -> None:
        self.bus.publish(kind, **{**job.data(), "delta": delta})

    def _on_bytes(self, job: Job, path: str, n: int) -> None:
        job.bytes_done += n
        job.per_file[path] = job.per_file.get(path, 0) + n
        job.file = path
        if n > 0:
            job.received += n
            job._samples.append((time.monotonic(), job.received))
        now = time.monotonic()
        if now - job._last_emit >= self.progress_interval_s:
            self._progress(job, now)

    def _progress(self, job: Job, now: float) -> None:
        job._last_emit = now
        delta, job._sent = job.received - job._sent, job.received
        self._emit(job, EventKind.DOWNLOAD_PROGRESS, delta=delta)

    def _check_space(self, job: Job, config: HubConfig) -> None:
        repo_dir = cache_layout.repo_folder(config.cache_dir, job.repo)
        need = job.bytes_total - self._have(job)
        probe = config.cache_dir
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free = shutil.disk_usage(probe).free
        if need > 0 and free < need + self.margin(need):
            raise DiskFullError(
                f"not enough free space for {job.repo}: {_size(need)} still to download plus a "
                f"{_size(self.margin(need))} margin, but only {_size(free)} free on the disk holding "
                f"{config.cache_dir}. Free some space (or set hf_cache_dir to a larger disk) and pull again"
            )
        repo_dir.mkdir(parents=True, exist_ok=True)

    async def _run(self, job: Job) -> None:
        if (previous := self._stopping.get(job.id)) is not None:  # resumed right after a pause
            # to its end even if this run is paused meanwhile: the next run waits only for this one, so
            # this one must not end before the transfer it waits on has let go of the partial's lock
            # (two quick Pause/Resume pairs: the third run found the first still holding it)
            await background.until_done(previous)
        try:
            config = self.config()
            if config.offline:
                raise offline_error(config, f"{job.repo} (download {job.id})")
            job.bytes_done = await asyncio.to_thread(self._have, job)
            await asyncio.to_thread(self._check_space, job, config)
            await self._fetch_resumed(job, config)
            await asyncio.to_thread(self._land, job, config)
        except asyncio.CancelledError:
            raise
        except SwitchyardError as exc:
            self._fail(job, exc.message, exc.code)
            return
        except Exception as exc:  # a bug must still end the job visibly, not leave it "running"
            self._fail(job, f"{type(exc).__name__}: {exc}", "download_failed")
            return
        self._tasks.pop(job.id, None)
        self._progress(job, time.monotonic())
        self._forget(job)
        if self.on_complete is not None:  # the catalog knows the model before anyone hears it is complete
            self.on_complete(job.repo)
        self._set(job, JobState.COMPLETED)

    async def _fetch_resumed(self, job: Job, config: HubConfig) -> None:
        """`_fetch_files`; for a job resumed at start, a partial another process still holds is waited for
        (RESUME_LOCK_WAIT_S): that process is the one this start replaces, shutting down."""
        waited_until = time.monotonic() + RESUME_LOCK_WAIT_S
        while True:
            try:
                await self._fetch_files(job, config)
            except DownloadBusyError:
                if job.id in self._resumed and time.monotonic() < waited_until:
                    if job.state is JobState.RUNNING:
                        self._set(job, JobState.QUEUED)  # waiting again: it runs once it has the lock
                    await asyncio.sleep(0.5)
                    continue
                self._resumed.discard(job.id)
                raise
            self._resumed.discard(job.id)
            return

    def _fail(self, job: Job, message: str, code: str) -> None:
        self._tasks.pop(job.id, None)
        self._set(job, JobState.FAILED, error=message, code=code)

    async def _fetch_files(self, job: Job, config: HubConfig) -> None:
        started = False
        headers = {"User-Agent": "switchyard"}
        if config.token is not None:
            headers["Authorization"] = f"Bearer {config.token.reveal()}"
        repo_dir = cache_layout.repo_folder(config.cache_dir, job.repo)
        assert self._session is not None, "DownloadManager used outside `async with`"

        def begin() -> None:
            nonlocal started
            if not started and job.state is JobState.QUEUED:  # a paused or cancelled job stays so
                started = True
                self._set(job, JobState.RUNNING)

        async def one(f: FileSpec) -> None:
            async with self._slots:
                url = f"{config.endpoint}/{job.repo}/resolve/{job.commit}/{quote(f.path)}"
                blob = cache_layout.blob_path(repo_dir, f.key)
                if blob.exists() and blob.stat().st_size == f.size:
                    begin()
                    return  # already in the cache: counted in bytes_done from the start
                t = Transfer(
                    self._session,  # type: ignore[arg-type]
                    url,
                    f,
                    repo_dir,
                    headers=headers,
                    proxy=explicit_proxy(config),
                    options=self.options,
                    on_bytes=lambda n: self._on_bytes(job, f.path, n),
                    # the job's state file is written once the first answer is in, not before the request
                    on_started=begin,
                    describe=f"{job.repo}/{f.path}",
                )
                try:
                    await t.run()
                except Exception:
                    begin()  # it failed before any answer (another process holds the partial)
                    raise

        tasks = [asyncio.create_task(one(f)) for f in job.files]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if not started:  # no file at all: nothing to wait for
            self._set(job, JobState.RUNNING)

    def _land(self, job: Job, config: HubConfig) -> None:
        """Snapshot links for every file, then the ref: a model becomes visible only when whole."""
        repo_dir = cache_layout.repo_folder(config.cache_dir, job.repo)
        for f in job.files:
            if not cache_layout.blob_path(repo_dir, f.key).exists():
                raise DownloadError(
                    f"{job.repo}/{f.path} is missing from the cache after its download; pull again"
                )
            cache_layout.link_snapshot(repo_dir, job.commit, f.path, f.key)
        if cache_layout.is_commit(job.revision):
            return
        if job.kind == "candidate":  # a gated update: main moves in promote(), if the eval passes
            cache_layout.write_ref(repo_dir, cache_layout.CANDIDATE_REF, job.commit)
            return
        if job.kind == "update" and job.previous and job.previous != job.commit:
            cache_layout.write_ref(repo_dir, cache_layout.PREVIOUS_REF, job.previous)
        cache_layout.write_ref(repo_dir, job.revision, job.commit)

    # --- update and rollback ----------------------------------------------------------------------

    async def update(self, repo: str, *, revision: str = "main", candidate: bool = False) -> Job | None:
        """Queue the files of the snapshot `refs/<revision>` points at, at the hub's newer commit (None:
        already current). Blobs that did not change are linked, not fetched; refs move at the end. A
        `candidate` (a gated update) lands under refs/switchyard-candidate and moves nothing."""
        config = self.config()
        repo_dir = cache_layout.repo_folder(config.cache_dir, repo)
        old = cache_layout.read_ref(repo_dir, safe_names.check_revision(revision))
        if old is None:
            raise HubFileNotFoundError(
                f"{repo} has not been pulled into {config.cache_dir} (no refs/{revision}); "
                f"`switchyard pull {repo}` first",
                param="repo",
            )
        rc = await asyncio.to_thread(fetch_commit, config, repo, revision)
        if rc.commit == old:
            return None
        have = cache_layout.snapshot_files(repo_dir, old)
        files = [rc.files[p] for p in have if p in rc.files]
        if not files:
            raise HubFileNotFoundError(
                f"none of the files of {repo}'s snapshot {old[:12]} exist at the hub's {rc.commit[:12]}; "
                "pull a quantization of the new commit instead"
            )
        kind = "candidate" if candidate else "update"
        return self._queue(rc, revision, files, selector=None, kind=kind, previous=old)

    def promote(self, repo: str, *, revision: str = "main") -> dict[str, Any]:
        """A candidate that passed its gate becomes current: refs/<revision> moves to it, the commit it
        leaves is kept for `--rollback`."""
        repo_dir = cache_layout.repo_folder(self.config().cache_dir, repo)
        candidate = cache_layout.read_ref(repo_dir, cache_layout.CANDIDATE_REF)
        current = cache_layout.read_ref(repo_dir, revision)
        if candidate is None:
            raise BadRequestError(f"{repo} has no update waiting on its gate", param="repo")
        if current and current != candidate:
            cache_layout.write_ref(repo_dir, cache_layout.PREVIOUS_REF, current)
        cache_layout.write_ref(repo_dir, revision, candidate)
        cache_layout.delete_ref(repo_dir, cache_layout.CANDIDATE_REF)
        return {"repo": repo, "revision": revision, "commit": candidate, "previous": current}

    def discard(self, repo: str, *, revision: str = "main") -> dict[str, Any]:
        """A candidate that failed its gate goes: its ref, its snapshot, and the blobs only it used."""
        repo_dir = cache_layout.repo_folder(self.config().cache_dir, repo)
        candidate = cache_layout.read_ref(repo_dir, cache_layout.CANDIDATE_REF)
        cache_layout.delete_ref(repo_dir, cache_layout.CANDIDATE_REF)
        keep = {
            cache_layout.read_ref(repo_dir, revision),
            cache_layout.read_ref(repo_dir, cache_layout.PREVIOUS_REF),
            cache_layout.read_ref(repo_dir, cache_layout.ROLLED_BACK_REF),
        }
        freed = (
            cache_layout.discard_snapshot(repo_dir, candidate) if candidate and candidate not in keep else 0
        )
        return {"repo": repo, "commit": candidate, "freed": freed}

    def rollback(self, repo: str, *, revision: str = "main") -> dict[str, Any]:
        """Point refs/<revision> back at the commit before the last update (and remember the one left)."""
        repo_dir = cache_layout.repo_folder(self.config().cache_dir, repo)
        current = cache_layout.read_ref(repo_dir, revision)
        previous = cache_layout.read_ref(repo_dir, cache_layout.PREVIOUS_REF)
        if previous is None or current is None:
            left = cache_layout.read_ref(repo_dir, cache_layout.ROLLED_BACK_REF)
            if left is not None and current is not None:  # a second --rollback: never forward again
                raise BadRequestError(
                    f"{repo} is already rolled back to {current[:12]} (from {left[:12]}); nothing earlier is "
                    "kept. `switchyard update` fetches the newest commit again",
                    param="repo",
                )
            raise BadRequestError(
                f"{repo} has no earlier commit to roll back to (no `switchyard update` has changed it)",
                param="repo",
            )
        if not (repo_dir / "snapshots" / previous).is_dir():
            raise HubFileNotFoundError(
                f"the snapshot of {repo} at {previous[:12]} was deleted; cannot roll back"
            )
        # the commit left is remembered apart from `previous`: a second rollback must not move forward
        cache_layout.write_ref(repo_dir, cache_layout.ROLLED_BACK_REF, current)
        cache_layout.delete_ref(repo_dir, cache_layout.PREVIOUS_REF)
        cache_layout.write_ref(repo_dir, revision, previous)
        return {"repo": repo, "revision": revision, "commit": previous, "previous": current}
