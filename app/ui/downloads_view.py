"""The downloads panel under Discover: one row per job (a repeated download replaces its finished row),
fed by `download.*` events; Pause/Resume, Cancel, Clear finished; a failure's text below the table. Beside
it, the jobs panel (app/ui/jobs_view.py): every running job of the server (pulls, updates, eval runs,
engine installs) with its progress and a Cancel, so running work is shown in this one place.

Finished downloads are kept in ui.json (the download manager forgets them once done), so after a restart
the panel shows them beside the failed and paused jobs it brings back, until Clear finished.
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
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.ui import fmt
from app.ui.context import Desk
from app.ui.jobs_view import JobsPanel
from app.ui.pages import table
from app.ui.theme import ToneLabel
from app.ui.wording import for_window

STATE_OF = {
    "download.queued": "queued",
    "download.started": "running",
    "download.progress": "running",
    "download.resumed": "queued",
    "download.paused": "paused",
    "download.cancelled": "cancelled",
    "download.completed": "completed",
    "download.failed": "failed",
}
FINISHED = ("completed", "cancelled")
KEPT = 20  # finished downloads remembered in ui.json


class DownloadsPanel(QWidget):
    def __init__(self, desk: Desk, *, report: Callable[[str], None]) -> None:
        super().__init__()
        self.desk = desk
        self.report = report
        # the jobs panel goes under the downloads: beside them it squeezed the Downloads table's
        # buttons out of view at 1024 px
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        lay = QVBoxLayout()
        outer.addLayout(lay, 3)
        self.jobs_panel = JobsPanel(desk, report=report)
        outer.addWidget(self.jobs_panel, 2)
        head = QHBoxLayout()
        head.addWidget(QLabel("<b>Downloads</b>"), 1)
        self.clear_btn = QPushButton("Clear finished")
        self.clear_btn.setToolTip("Remove completed and cancelled downloads from this list")
        self.clear_btn.clicked.connect(self.clear_finished)
        head.addWidget(self.clear_btn)
        lay.addLayout(head)
        # long names wrap onto a second line: cut at the end, two quantizations of one repository looked alike
        self.table = table(["Model", "Progress", "Rate", "ETA", "State", "", ""], wrap=True)
        self.table.setMaximumHeight(170)
        lay.addWidget(self.table, 1)
        # a failure's words go here, wrapped, so the State column stays narrow and the buttons in view
        self.problem = ToneLabel("", "error")
        self.problem.setWordWrap(True)
        keep = self.problem.sizePolicy()  # its line stays while empty: a failure does not push the page
        keep.setRetainSizeWhenHidden(True)
        self.problem.setSizePolicy(keep)
        self.problem.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.problem)
        self.rows: dict[str, int] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.widgets: dict[str, tuple[QProgressBar, QPushButton, QPushButton]] = {}
        for done in desk.state.get("downloads_done") or []:
            if isinstance(done, dict) and isinstance(done.get("id"), str) and done.get("repo"):
                self.update_job({**done, "state": "completed"})
        for job in desk.runtime.downloads.all_jobs():
            self.update_job(job.public())
        self._buttons()

    # ---- events -----------------------------------------------------------------------------------
    def on_event(self, kind: str, data: dict[str, Any]) -> None:
        state = STATE_OF.get(kind)
        self.update_job({**data, **({"state": state} if state else {})})
        if kind == "download.completed":
            self._remember(self.jobs[data["id"]])

    def update_job(self, job: dict[str, Any]) -> None:
        jid = job["id"]
        merged = {**self.jobs.get(jid, {}), **job}
        if "selector" not in merged:  # events carry progress; the job itself knows what was asked for
            try:
                merged["selector"] = self.desk.runtime.downloads.get(jid).selector
            except Exception:  # forgotten meanwhile (cancelled): show it without
                merged["selector"] = None
        if jid not in self.rows:
            self._replace_finished(merged)
            self._add_row(jid)
        self.jobs[jid] = merged
        self._paint(jid, merged)
        self._buttons()

    # ---- rows -------------------------------------------------------------------------------------
    @staticmethod
    def label(job: dict[str, Any]) -> str:
        return f"{job['repo']}" + (f":{job['selector']}" if job.get("selector") else "")

    def _replace_finished(self, job: dict[str, Any]) -> None:
        """The same model asked again: its finished (or failed) row gives way to the new one."""
        for old, seen in list(self.jobs.items()):
            done = seen.get("state") in (*FINISHED, "failed")
            if done and self.label(seen) == self.label(job):
                self._drop(old)

    def _add_row(self, jid: str) -> None:
        # a new download goes on top: at 1024x640 the panel shows three rows, and finished ones above it
        # pushed the active one out of view
        row = 0
        self.table.insertRow(row)
        for other, r in self.rows.items():
            self.rows[other] = r + 1
        self.rows[jid] = row
        self.table.scrollToTop()
        bar = QProgressBar()
        bar.setRange(0, 1000)
        bar.setMinimumWidth(160)
        self.table.setCellWidget(row, 1, bar)
        pause = QPushButton("Pause")
        pause.clicked.connect(lambda _=False, j=jid: self.pause_resume(j))
        cancel = QPushButton("Cancel")
        cancel.clicked.connect(lambda _=False, j=jid: self.cancel(j))
        self.table.setCellWidget(row, 5, pause)
        self.table.setCellWidget(row, 6, cancel)
        self.widgets[jid] = (bar, pause, cancel)

    def _drop(self, jid: str) -> None:
        row = self.rows.pop(jid)
        self.table.removeRow(row)
        self.jobs.pop(jid, None)
        self.widgets.pop(jid, None)
        for other, r in self.rows.items():
            if r > row:
                self.rows[other] = r - 1
        done = [d for d in self.desk.state.get("downloads_done") or [] if isinstance(d, dict)]
        if any(d.get("id") == jid for d in done):
            self.desk.state.set("downloads_done", [d for d in done if d.get("id") != jid])

    def _paint(self, jid: str, job: dict[str, Any]) -> None:
        row = self.rows[jid]
        total, done = job.get("bytes_total") or 0, job.get("bytes_done") or 0
        state = job.get("state", "queued")
        if state == "completed" and total:
            done = total
        bar, pause, cancel = self.widgets[jid]
        bar.setValue(int(1000 * done / total) if total else 0)
        bar.setFormat(f"{fmt.size(done)} of {fmt.size(total)}")
        active = state in ("queued", "running")
        rate = job.get("rate_bps") or 0
        error = job.get("error") if state == "failed" else None
        for j, c in (
            (0, self.label(job)),
            (2, f"{fmt.size(rate)}/s" if active and rate else "-"),
            (3, fmt.duration(job.get("eta_s")) if active else "-"),
            (4, state),
        ):
            item = QTableWidgetItem(c)
            item.setToolTip(f"{state}: {error}" if j == 4 and error else c)
            self.table.setItem(row, j, item)
        # Resume only where there is something to resume: a finished download's button is a greyed Pause
        pause.setText("Resume" if state in ("paused", "failed") else "Pause")
        pause.setEnabled(state in ("queued", "running", "paused", "failed") and self._live(jid))
        cancel.setEnabled(state not in FINISHED and self._live(jid))
        pause.setToolTip(f"{pause.text()} {self.label(job)}")
        cancel.setToolTip(f"Cancel {self.label(job)} and delete what was fetched")
        pause.setAccessibleName(f"{pause.text()} {self.label(job)}")
        cancel.setAccessibleName(f"Cancel {self.label(job)}")
        self._problem()

    def _live(self, jid: str) -> bool:
        """Whether the download manager still knows the job (a remembered finished one it does not)."""
        try:
            self.desk.runtime.downloads.get(jid)
        except Exception:
            return False
        return True

    def _problem(self) -> None:
        failed = [j for j in self.jobs.values() if j.get("state") == "failed" and j.get("error")]
        last = failed[-1] if failed else None
        self.problem.setText(f"{self.label(last)} failed: {for_window(last['error'])}" if last else "")
        self.problem.setVisible(last is not None)

    def _buttons(self) -> None:
        self.clear_btn.setEnabled(any(j.get("state") in FINISHED for j in self.jobs.values()))

    # ---- actions ----------------------------------------------------------------------------------
    def clear_finished(self) -> int:
        gone = [jid for jid, j in self.jobs.items() if j.get("state") in FINISHED]
        for jid in gone:
            self._drop(jid)
        self.desk.state.set("downloads_done", [])
        self._buttons()
        return len(gone)

    def _remember(self, job: dict[str, Any]) -> None:
        keep = {k: job.get(k) for k in ("id", "repo", "selector", "bytes_total")}
        done = [d for d in self.desk.state.get("downloads_done") or [] if isinstance(d, dict)]
        done = [d for d in done if d.get("id") != job["id"] and self.label(d) != self.label(job)]
        self.desk.state.set("downloads_done", [*done, keep][-KEPT:])

    def job_state(self, job_id: str) -> str:
        return str(self.jobs.get(job_id, {}).get("state"))

    def pause_resume(self, job_id: str) -> None:
        dm = self.desk.runtime.downloads
        try:
            job = dm.get(job_id)
            dm.pause(job_id) if job.state in ("queued", "running") else dm.resume(job_id)
        except Exception as exc:  # a job that vanished meanwhile: say so
            self.report(getattr(exc, "message", str(exc)))

    def cancel(self, job_id: str) -> None:
        self.desk.spawn(self.desk.runtime.downloads.cancel(job_id), report=self.report)
