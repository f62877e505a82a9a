"""The jobs panel, under the downloads on Discover: every queued or running job of the server (pulls,
updates, eval runs, engine installs; app/core/jobs.py) with its step, progress and a Cancel.

It reads the server's job registry in this process (routes_jobs.registry) when it is built, then follows
the `job.*` events: a job that ends leaves the list (the tray says how it ended). Cancel asks the registry,
as `switchyard jobs cancel` does; a job that cannot stop half-way (an engine install) has it disabled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QStackedWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.core.jobs import JobRegistry
from app.server.admin.jobs import registry
from app.ui import fmt
from app.ui.context import Desk
from app.ui.pages import table
from app.ui.theme import ToneLabel

ENDED = ("job.completed", "job.failed", "job.cancelled")
KIND_NAMES = {"download": "pull", "update": "update", "eval": "eval", "engine_install": "engine install"}


class JobsPanel(QWidget):
    def __init__(self, desk: Desk, *, report: Callable[[str], None]) -> None:
        super().__init__()
        self.desk = desk
        self.report = report
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        head = QHBoxLayout()
        self.title = QLabel("<b>Jobs</b>")
        head.addWidget(self.title, 1)
        lay.addLayout(head)
        self.table = table(["Job", "Kind", "Step", "Progress", ""], stretch=0, wrap=True)  # names whole
        self.empty = ToneLabel("No jobs running", "muted")
        self.empty.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        # the table and "No jobs running" take turns in one place of one height (a header and two rows,
        # the rest scrolls): the page above no longer jumps each time a job starts or ends
        self.stack = QStackedWidget()
        self.stack.addWidget(self.table)
        self.stack.addWidget(self.empty)
        rows = 2 * self.table.verticalHeader().defaultSectionSize()
        self.stack.setFixedHeight(self.table.horizontalHeader().sizeHint().height() + rows + 4)
        lay.addWidget(self.stack)
        self.rows: dict[str, int] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.widgets: dict[str, tuple[QProgressBar, QPushButton]] = {}
        jobs = self.registry()
        if jobs is not None:
            for job in reversed(jobs.active()):  # oldest first, as events would have added them
                self.update_job(job.public())
        self._empty()
        desk.bridge.received.connect(self.on_event)

    def registry(self) -> JobRegistry | None:
        return registry(self.desk.server.app)

    # ---- events -----------------------------------------------------------------------------------
    def on_event(self, kind: str, data: Any) -> None:
        if not kind.startswith("job.") or not isinstance(data, dict) or not isinstance(data.get("id"), str):
            return
        job = {**data, "kind": data.get("job_kind", data.get("kind"))}
        if kind in ENDED:
            self._drop(job["id"])
            return
        self.update_job(job)

    def update_job(self, job: dict[str, Any]) -> None:
        jid = job["id"]
        if jid not in self.rows:
            self._add_row(jid)
        self.jobs[jid] = {**self.jobs.get(jid, {}), **job}
        self._paint(jid)
        self._empty()

    # ---- rows -------------------------------------------------------------------------------------
    def _add_row(self, jid: str) -> None:
        row = self.table.rowCount()
        self.table.insertRow(row)
        self.rows[jid] = row
        bar = QProgressBar()
        bar.setMinimumWidth(120)
        self.table.setCellWidget(row, 3, bar)
        cancel = QPushButton("Cancel")
        cancel.clicked.connect(lambda _=False, j=jid: self.cancel(j))
        self.table.setCellWidget(row, 4, cancel)
        self.widgets[jid] = (bar, cancel)

    def _drop(self, jid: str) -> None:
        row = self.rows.pop(jid, None)
        if row is None:
            return
        self.table.removeRow(row)
        self.jobs.pop(jid, None)
        self.widgets.pop(jid, None)
        for other, r in self.rows.items():
            if r > row:
                self.rows[other] = r - 1
        self._empty()

    def _paint(self, jid: str) -> None:
        job, row = self.jobs[jid], self.rows[jid]
        steps = job.get("steps") or []
        step = steps[-1] if steps else None
        state = str(job.get("state") or "queued")
        if step is None:
            step_text = state
        elif step.get("total") and step["name"] == "download":  # bytes: in the units the downloads show
            step_text = f"download {fmt.size(step.get('done') or 0)} of {fmt.size(step['total'])}"
        elif step.get("total"):
            step_text = f"{step['name']} {step.get('done', 0)}/{step['total']}"
        else:
            step_text = str(step["name"])
        if step is not None and state != "running":  # paused or queued again: said, as the downloads say it
            step_text = f"{state}: {step_text}"
        kind = str(job.get("kind") or "")
        for col, text in ((0, str(job.get("title") or jid)), (1, KIND_NAMES.get(kind, kind)), (2, step_text)):
            item = QTableWidgetItem(text)
            item.setToolTip(f"{text} ({jid}, {state})" if col == 0 else text)
            self.table.setItem(row, col, item)
        bar, cancel = self.widgets[jid]
        progress = job.get("progress")
        if isinstance(progress, int | float):
            bar.setRange(0, 1000)
            bar.setValue(int(1000 * progress))
            bar.setFormat(f"{progress:.0%}" + (f" ({state})" if state != "running" else ""))
        elif state != "running":  # waiting, nothing moves: an empty bar, not a busy one
            bar.setRange(0, 1000)
            bar.setValue(0)
            bar.setFormat(state)
        else:  # no total known (yet): a busy bar
            bar.setRange(0, 0)
        jobs = self.registry()
        can = jobs is not None and jobs.cancellable(jid)
        cancel.setEnabled(can)
        cancel.setAccessibleName(f"Cancel {job.get('title') or jid}")
        cancel.setToolTip(
            f"Cancel {job.get('title') or jid}"
            if can
            else "This job cannot be stopped half-way (an engine install runs to its end)"
        )

    def _empty(self) -> None:
        self.stack.setCurrentWidget(self.table if self.rows else self.empty)
        self.title.setText(f"<b>Jobs</b> ({len(self.rows)} running)" if self.rows else "<b>Jobs</b>")

    # ---- actions ----------------------------------------------------------------------------------
    def job_state(self, job_id: str) -> str | None:
        """The state the panel shows for a job, or None once it has left the list (it ended)."""
        job = self.jobs.get(job_id)
        return None if job is None else str(job.get("state"))

    def cancel(self, job_id: str) -> None:
        jobs = self.registry()
        if jobs is None:
            self.report("the server is not running, so it has no jobs to cancel")
            return
        self.desk.spawn(jobs.cancel(job_id), disable=[self.widgets[job_id][1]], report=self.report)
