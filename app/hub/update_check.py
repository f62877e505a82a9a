"""Update checks: has a pulled model's repository moved past the commit its files were fetched at?

Every `update_check_h` hours (0: never) the checker asks the hub for the head of each pulled repository
and compares the files each model uses, by sha256 (the hub's LFS oids), with what is on disk: an update is
available when one of them changed or is gone. A new commit that leaves a model's files as they were is
no update. Results are kept in `<home>/updates.json`; `model.update_available` is published once per model
and new head commit (the tray and the Library page react to it; so do webhooks).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from app.core import statefile
from app.core.background import cancelled
from app.core.errors import SwitchyardError
from app.core.events import EventBus, EventKind
from app.hub.config import HubConfig
from app.hub.selection import RepoCommit, fetch_commit

log = logging.getLogger(__name__)
HOUR_S = 3600.0


@dataclass(frozen=True)
class Pulled:
    """One pulled model: its repository, ref and commit, and its files (repo path -> sha256 if known)."""

    model: str
    repo: str
    revision: str
    commit: str
    files: dict[str, str | None]


@dataclass(frozen=True)
class UpdateInfo:
    model: str
    repo: str
    revision: str
    current: str
    head: str
    changed: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    checked: float = field(default_factory=time.time)

    @property
    def available(self) -> bool:
        return bool(self.changed or self.missing)

    def public(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "repo": self.repo,
            "revision": self.revision,
            "current": self.current,
            "head": self.head,
            "available": self.available,
            "changed": list(self.changed),
            "missing": list(self.missing),
            "checked": self.checked,
        }


def compare(model: Pulled, head: RepoCommit) -> UpdateInfo:
    """What moved between the files `model` uses and the same paths at `head` (files whose sha256 we do
    not know, small non-LFS ones, count as changed only when gone)."""
    changed, missing = [], []
    for path, sha in sorted(model.files.items()):
        spec = head.files.get(path)
        if spec is None:
            missing.append(path)
        elif sha is not None and spec.sha256 is not None and spec.sha256 != sha:
            changed.append(path)
    return UpdateInfo(
        model.model, model.repo, model.revision, model.commit, head.commit, tuple(changed), tuple(missing)
    )


def check(config: HubConfig, models: list[Pulled]) -> tuple[list[UpdateInfo], dict[str, str]]:
    """Blocking (run it in a thread): one hub call per repository; errors per repository, in words."""
    heads: dict[tuple[str, str], RepoCommit | str] = {}
    infos: list[UpdateInfo] = []
    for m in models:
        key = (m.repo, m.revision)
        if key not in heads:
            try:
                heads[key] = fetch_commit(config, m.repo, m.revision)
            except SwitchyardError as exc:
                heads[key] = exc.message
        head = heads[key]
        if isinstance(head, RepoCommit):
            infos.append(compare(m, head))
    errors = {repo: h for (repo, _rev), h in heads.items() if isinstance(h, str)}
    return infos, errors


class UpdateChecker:
    """Owned by the server: the periodic check, its last results and the announcements made."""

    def __init__(
        self,
        *,
        bus: EventBus,
        state_file: Path,
        config: Callable[[], HubConfig],
        pulled: Callable[[], list[Pulled]],
        interval_h: Callable[[], float],
    ) -> None:
        self.bus, self.state_file = bus, state_file
        self._config, self._pulled, self._interval_h = config, pulled, interval_h
        self.results: dict[str, UpdateInfo] = {}
        self.errors: dict[str, str] = {}
        self.checked_at: float | None = None
        self._announced: set[str] = set()  # "model@head" already published
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> UpdateChecker:
        await asyncio.to_thread(self._load)
        self._task = asyncio.create_task(self._every(), name="update check")
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await cancelled(self._task)

    async def _every(self) -> None:
        # the first check waits one interval after the last recorded one (a restart does not re-ask)
        while True:
            hours = self._interval_h()
            if hours <= 0:
                await asyncio.sleep(60)  # off: look again later, a settings change may turn it on
                continue
            due = (self.checked_at or 0) + hours * HOUR_S - time.time()
            if due > 0:
                await asyncio.sleep(min(due, 60))
                continue
            try:
                await self.check_now()
            except Exception:  # a check that fails is logged and tried at the next interval
                log.exception("update check failed")
                self.checked_at = time.time()

    async def check_now(self) -> dict[str, Any]:
        """Check every pulled model now; publish each new update once; keep and return the results."""
        async with self._lock:
            infos, errors = await asyncio.to_thread(check, self._config(), self._pulled())
            self.results = {i.model: i for i in infos}
            self.errors, self.checked_at = errors, time.time()
            for info in infos:
                key = f"{info.model}@{info.head}"
                if info.available and key not in self._announced:
                    self._announced.add(key)
                    self.bus.publish(EventKind.MODEL_UPDATE_AVAILABLE, **info.public())
            await asyncio.to_thread(self._write, self.public())
            return self.public()

    def public(self) -> dict[str, Any]:
        return {
            "checked_at": self.checked_at,
            "updates": [i.public() for i in sorted(self.results.values(), key=lambda i: i.model)],
            "errors": self.errors,
        }

    def _write(self, doc: dict[str, Any]) -> None:
        try:
            statefile.update(self.state_file, lambda _old: {**doc, "announced": sorted(self._announced)})
        except OSError as exc:
            log.warning("could not save %s: %s", self.state_file, exc)

    def _load(self) -> None:
        doc = read_updates(self.state_file)
        self.checked_at = doc.get("checked_at")
        self._announced = set(doc.get("announced") or [])
        for u in doc.get("updates") or []:
            with contextlib.suppress(KeyError, TypeError):
                info = UpdateInfo(
                    u["model"], u["repo"], u["revision"], u["current"], u["head"],
                    tuple(u.get("changed") or ()), tuple(u.get("missing") or ()), float(u["checked"]),
                )  # fmt: skip
                self.results[info.model] = info


def read_updates(state_file: Path) -> dict[str, Any]:
    """What the last check found (for `switchyard updates` with no server running)."""
    text = statefile.read_text(state_file)
    try:
        doc = json.loads(text) if text else {}
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
