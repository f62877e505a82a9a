"""Discover: search the hub, a model's page (card, license, files by quantization with the fit verdict
for this machine and its Why), Download buttons and the downloads panel fed by `download.*` events."""

from __future__ import annotations

import asyncio
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTableWidgetItem,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.hub.api import FORMAT_FILTERS, SORTS, SearchQuery
from app.ui import fmt
from app.ui.explain_view import ExplainDialog
from app.ui.pages import Page, table

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


class DiscoverPage(Page):
    title = "Discover"
    hint = "Find a model on Hugging Face, see whether it fits this machine, and download it."

    def __init__(self, desk: Any) -> None:
        super().__init__(desk)
        bar = QHBoxLayout()
        self.query = QLineEdit()
        self.query.setPlaceholderText("Search models, e.g. qwen gguf")
        self.query.returnPressed.connect(self.search)
        self.format = QComboBox()
        self.format.addItem("any format", None)
        for f in FORMAT_FILTERS:
            self.format.addItem(f, f)
        self.sort = QComboBox()
        for s in SORTS:
            self.sort.addItem(
                f"most {s}" if s in ("downloads", "likes") else f"recently {s}" if s != "trending" else s, s
            )
        self.search_btn = QPushButton("Search")
        self.search_btn.clicked.connect(self.search)
        bar.addWidget(self.query, 1)
        bar.addWidget(self.format)
        bar.addWidget(self.sort)
        bar.addWidget(self.search_btn)
        self.root.addLayout(bar)
        self.root.addWidget(self.status)

        split = QSplitter(Qt.Orientation.Horizontal)
        self.results = table(["Model", "Downloads", "Likes", "Updated"])
        self.results.itemSelectionChanged.connect(self._picked)
        self.results_empty = QLabel("Type a few words and press Search. Results show here.")
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.addWidget(self.results)
        ll.addWidget(self.results_empty)
        split.addWidget(left)

        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(8, 0, 0, 0)
        self.model_title = QLabel("<i>Pick a model on the left to see its files and whether it fits.</i>")
        self.model_title.setWordWrap(True)
        self.model_meta = QLabel("")
        self.model_meta.setWordWrap(True)
        self.quants = table(["Quantization", "Size", "Fit on this machine", "Max ctx", "", ""], stretch=2)
        self.card = QTextBrowser()
        self.card.setOpenExternalLinks(True)
        rl.addWidget(self.model_title)
        rl.addWidget(self.model_meta)
        rl.addWidget(self.quants, 2)
        rl.addWidget(self.card, 3)
        split.addWidget(right)
        self.split = split
        self._sized = False
        self.root.addWidget(split, 3)

        self.root.addWidget(QLabel("<b>Downloads</b>"))
        self.downloads = table(["Model", "Progress", "Rate", "ETA", "State", "", ""])
        self.downloads.setMaximumHeight(170)
        self.downloads.horizontalHeader().setMinimumSectionSize(70)
        self.root.addWidget(self.downloads, 1)
        self._rows: dict[str, int] = {}
        self._jobs: dict[str, dict[str, Any]] = {}
        self._widgets: dict[str, tuple[QProgressBar, QPushButton, QPushButton]] = {}
        self.detail: dict[str, Any] | None = None
        self._opening: str | None = None
        self.dialogs: list[ExplainDialog] = []
        self.hits: list[dict[str, Any]] = []
        for job in desk.runtime.downloads.all_jobs():
            self._job_update(job.public())
        desk.bridge.received.connect(self._on_event)

    def showEvent(self, event: Any) -> None:
        super().showEvent(event)
        if not self._sized:  # the model's page needs the room; a splitter only knows its size when shown
            self._sized = True
            width = max(self.split.width(), 800)
            self.split.setSizes([int(width * 0.4), int(width * 0.6)])

    def focus_search(self) -> None:
        self.query.setFocus()
        self.query.selectAll()

    # ---- search -----------------------------------------------------------------------------------
    def search(self) -> None:
        q = SearchQuery(
            text=self.query.text().strip() or None,
            format=self.format.currentData(),
            sort=self.sort.currentData(),
            size=50,
        )
        self.desk.spawn(self._search(q), disable=[self.search_btn], report=self.report)

    async def _search(self, q: SearchQuery) -> None:
        self.clear_report()
        page = await asyncio.to_thread(lambda: self.desk.hub.client().search(q))
        self.hits = [h.public() for h in page.hits]
        self.results.setRowCount(len(self.hits))
        for i, h in enumerate(self.hits):
            cells = [
                h["id"] + ("  (gated)" if h["gated"] else ""),
                fmt.count(h["downloads"]),
                fmt.count(h["likes"]),
                (h["last_modified"] or "-")[:10],
            ]
            for j, c in enumerate(cells):
                item = QTableWidgetItem(c)
                item.setToolTip(f"{h['id']}: {', '.join(h['formats']) or 'format unknown'}")
                if j in (1, 2):
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.results.setItem(i, j, item)
        self.results_empty.setText(
            "No models match; try fewer words or another format." if not self.hits else ""
        )
        self.results_empty.setVisible(not self.hits)

    def _picked(self) -> None:
        rows = self.results.selectionModel().selectedRows()
        if rows:
            self.open_model(self.hits[rows[0].row()]["id"])

    # ---- one model --------------------------------------------------------------------------------
    def open_model(self, repo: str) -> asyncio.Task[Any]:
        return self.desk.spawn(self._open(repo), report=self.report)

    async def _open(self, repo: str) -> None:
        self._opening = repo  # the newest pick wins; an older one still loading is dropped
        self.clear_report()
        self.model_title.setText(f"<h3 style='margin:0'>{repo}</h3><i>reading the repository…</i>")
        self.quants.setRowCount(0)
        rt = self.desk.runtime
        client = self.desk.hub.client()
        detail = await asyncio.to_thread(client.detail, repo)
        if self._opening != repo:
            return
        self._show_detail(detail.public(), checking=True)
        await rt.fit_hub_model(detail, reader=client.reader)
        if self._opening == repo:
            self._show_detail(detail.public(), checking=False)

    def _show_detail(self, doc: dict[str, Any], *, checking: bool) -> None:
        self.detail = doc
        gated = {
            False: "not gated",
            None: "not gated",
            "auto": "gated (automatic approval)",
            "manual": "gated (manual approval)",
        }.get(doc["gated"], "gated")
        self.model_title.setText(f"<h3 style='margin:0'>{doc['id']}</h3>")
        self.model_meta.setText(
            f"License: {doc['license'] or 'not stated'} · {gated} · "
            f"{fmt.count(doc['downloads'])} downloads · "
            f"{fmt.count(doc['likes'])} likes · updated {(doc['last_modified'] or '-')[:10]}"
        )
        self.card.setMarkdown(doc["card"] or f"*No model card: {doc.get('card_problem') or 'none'}*")
        fit = (doc.get("fit") or {}).get("quantizations") or {}
        quants = doc["quantizations"]
        self.quants.setRowCount(len(quants))
        for i, q in enumerate(quants):
            v = fit.get(q["name"])
            verdict = "checking…" if checking else fmt.verdict(v)
            cells = [q["name"], fmt.size(q["size"]), verdict, str((v or {}).get("max_ctx") or "-")]
            for j, c in enumerate(cells):
                item = QTableWidgetItem(c)
                if v and v.get("summary"):
                    item.setToolTip(v["summary"])
                self.quants.setItem(i, j, item)
            why = QPushButton("Why?")
            why.setEnabled(v is not None)
            why.clicked.connect(lambda _=False, n=q["name"]: self.why(n))
            dl = QPushButton("Download")
            dl.clicked.connect(lambda _=False, n=q["name"], b=dl: self.download(n, b))
            self.quants.setCellWidget(i, 4, why)
            self.quants.setCellWidget(i, 5, dl)
        if not quants:
            self.quants.setRowCount(1)
            self.quants.setItem(0, 0, QTableWidgetItem("no GGUF files in this repository"))

    def why(self, quant: str) -> ExplainDialog | None:
        if not self.detail:
            return None
        fit = self.detail.get("fit") or {}
        v = (fit.get("quantizations") or {}).get(quant)
        if v is None:
            return None
        doc = {**v, "title": f"{self.detail['id']}:{quant}", "hardware": fit.get("hardware")}
        dlg = ExplainDialog(doc["title"], doc, self)
        self.dialogs.append(dlg)
        dlg.show()
        return dlg

    def download(self, quant: str, button: QPushButton | None = None) -> asyncio.Task[Any]:
        assert self.detail is not None
        repo = self.detail["id"]
        return self.desk.spawn(
            self.desk.runtime.downloads.submit(repo, quant=quant),
            disable=[button] if button else [],
            report=self.report,
        )

    # ---- downloads panel --------------------------------------------------------------------------
    def _on_event(self, kind: str, data: dict[str, Any]) -> None:
        if not kind.startswith("download."):
            return
        state = STATE_OF.get(kind)
        self._job_update({**data, **({"state": state} if state else {})})
        if kind == "download.completed":
            self.desk.notify("Download finished", f"{data['repo']} is in the Library")
        elif kind == "download.failed":
            self.desk.notify("Download failed", f"{data['repo']}: {data.get('error')}", warn=True)

    def _job_update(self, job: dict[str, Any]) -> None:
        jid = job["id"]
        merged = {**self._jobs.get(jid, {}), **job}
        if "selector" not in merged:  # events carry progress; the job itself knows what was asked for
            try:
                merged["selector"] = self.desk.runtime.downloads.get(jid).selector
            except Exception:  # forgotten meanwhile (cancelled): show it without
                merged["selector"] = None
        self._jobs[jid] = merged
        if jid not in self._rows:
            row = self.downloads.rowCount()
            self.downloads.insertRow(row)
            self._rows[jid] = row
            bar = QProgressBar()
            bar.setRange(0, 1000)
            bar.setMinimumWidth(200)
            self.downloads.setCellWidget(row, 1, bar)
            pause = QPushButton("Pause")
            pause.clicked.connect(lambda _=False, j=jid: self.pause_resume(j))
            cancel = QPushButton("Cancel")
            cancel.clicked.connect(lambda _=False, j=jid: self.cancel(j))
            self.downloads.setCellWidget(row, 5, pause)
            self.downloads.setCellWidget(row, 6, cancel)
            self._widgets[jid] = (bar, pause, cancel)
        row = self._rows[jid]
        total, done = merged.get("bytes_total") or 0, merged.get("bytes_done") or 0
        bar, pause, cancel = self._widgets[jid]
        bar.setValue(int(1000 * done / total) if total else 0)
        bar.setFormat(f"{fmt.size(done)} of {fmt.size(total)}")
        state = merged.get("state", "queued")
        active = state in ("queued", "running")
        rate = merged.get("rate_bps") or 0
        label = f"{merged['repo']}" + (f":{merged['selector']}" if merged.get("selector") else "")
        text_state = state if not merged.get("error") else f"{state}: {merged['error']}"
        for j, c in (
            (0, label),
            (2, f"{fmt.size(rate)}/s" if active and rate else "-"),
            (3, fmt.duration(merged.get("eta_s")) if active else "-"),
            (4, text_state),
        ):
            item = QTableWidgetItem(c)
            item.setToolTip(c)
            self.downloads.setItem(row, j, item)
        pause.setText("Pause" if active else "Resume")
        pause.setEnabled(state in ("queued", "running", "paused", "failed"))
        cancel.setEnabled(state not in ("completed", "cancelled"))

    def job_state(self, job_id: str) -> str:
        return str(self._jobs.get(job_id, {}).get("state"))

    def pause_resume(self, job_id: str) -> None:
        dm = self.desk.runtime.downloads
        try:
            job = dm.get(job_id)
            dm.pause(job_id) if job.state in ("queued", "running") else dm.resume(job_id)
        except Exception as exc:  # a job that vanished meanwhile: say so
            self.report(getattr(exc, "message", str(exc)))

    def cancel(self, job_id: str) -> None:
        self.desk.spawn(self.desk.runtime.downloads.cancel(job_id), report=self.report)
