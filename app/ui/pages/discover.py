"""Discover: search the hub, a model's page (card, license, files by quantization with the fit verdict
for this machine and its Why), Download buttons and the downloads panel fed by `download.*` events; and
the Recommended view (app/ui/recommend_view.py), which it opens on when the library is empty."""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSplitter,
    QStackedWidget,
    QTableWidgetItem,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.hub.api import FORMAT_FILTERS, SORTS, SearchQuery
from app.hub.quant import RepoFile
from app.hub.selection import pulled_projector
from app.ui import fmt
from app.ui.downloads_view import DownloadsPanel
from app.ui.explain_view import ExplainDialog
from app.ui.pages import Page, table
from app.ui.recommend_view import RecommendView
from app.ui.theme import tone

if TYPE_CHECKING:
    from app.ui.context import Desk

# said where no file of a repository fits here: the way out is a model with fewer parameters
NONE_FITS = (
    "No file of this repository fits this machine: choose a model with fewer parameters "
    "(the Recommended button lists small ones that fit)."
)
# hub tags that say a repository reads images (search hits carry no file list to find a projector in)
VISION_TAGS = frozenset({"image-text-to-text", "vision", "multimodal", "llava"})


def is_vision(hit: dict[str, Any]) -> bool:
    """A search hit or model page for a model that reads images: it has an mmproj projector, or its tags
    say so."""
    if hit.get("projectors"):
        return True
    return hit.get("pipeline_tag") == "image-text-to-text" or bool(VISION_TAGS & set(hit.get("tags") or ()))


class DiscoverPage(Page):
    title = "Discover"
    hint = "Find a model on Hugging Face, see whether it fits this machine, and download it."

    def __init__(self, desk: Desk) -> None:
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
        self.recommended_btn = QPushButton("Recommended")
        self.recommended_btn.setToolTip("Small models for chat, coding, embeddings and speech that fit here")
        self.recommended_btn.clicked.connect(self.show_recommendations)
        bar.addWidget(self.query, 1)
        bar.addWidget(self.format)
        bar.addWidget(self.sort)
        bar.addWidget(self.search_btn)
        bar.addWidget(self.recommended_btn)
        self.root.addLayout(bar)
        self.root.addWidget(self.status)

        split = QSplitter(Qt.Orientation.Horizontal)
        self.results = table(["Model", "Downloads", "Likes", "Updated"], wrap=True)
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
        self.quants = table(["Quantization", "Size", "Fit on this machine", "Context", "", ""])
        ctx_head = self.quants.horizontalHeaderItem(3)
        assert ctx_head is not None  # set by table() from the headers
        ctx_head.setToolTip(
            "Tokens per request (prompt and reply); the engine's total is in each cell's tooltip"
        )
        self.quants.setMinimumHeight(120)  # header and three files, even beside a warning line
        self.card = QTextBrowser()
        self.card.setOpenExternalLinks(True)
        rl.addWidget(self.model_title)
        rl.addWidget(self.model_meta)
        rl.addWidget(self.quants, 2)
        rl.addWidget(self.card, 3)
        split.addWidget(right)
        self.split = split
        self._sized = False
        self.recommend = RecommendView(desk, report=self.report, back=self.show_search)
        self.views = QStackedWidget()
        self.views.addWidget(split)
        self.views.addWidget(self.recommend)
        self.root.addWidget(self.views, 3)
        self._first_run_checked = False

        self.panel = DownloadsPanel(desk, report=self.report)
        self.root.addWidget(self.panel, 1)
        self.downloads = self.panel.table
        # the panel's own dicts (changed in place), under the names the tests and screenshots use
        self._rows, self._jobs, self._widgets = self.panel.rows, self.panel.jobs, self.panel.widgets
        self.detail: dict[str, Any] | None = None
        self._opening: str | None = None
        self.dialogs: list[ExplainDialog] = []
        self.hits: list[dict[str, Any]] = []
        self._warned: set[str] = set()  # quantizations that do not fit, warned about once
        desk.bridge.received.connect(self._on_event)

    def showEvent(self, event: Any) -> None:
        super().showEvent(event)
        if not self._sized:  # the model's page needs the room; a splitter only knows its size when shown
            self._sized = True
            width = max(self.split.width(), 800)
            self.split.setSizes([int(width * 0.36), int(width * 0.64)])
        # a first run (nothing in the library) opens on recommendations; SWITCHYARD_NO_FIRST_RUN=1 skips
        # that (the test suite sets it: working the list out measures memory bandwidth and asks the hub)
        if not self._first_run_checked:
            self._first_run_checked = True
            # the starter model alone is still a first run: the view offers it beside the recommendations
            own = [e for e in self.desk.runtime.catalog.entries() if e.starter is None]
            if not own and not os.environ.get("SWITCHYARD_NO_FIRST_RUN"):
                self.show_recommendations()

    # ---- the two views: search, recommendations ----------------------------------------------------
    def show_recommendations(self) -> asyncio.Task[Any] | None:
        """Switch to the Recommended view; the list is worked out on its first showing (Check again
        redoes it)."""
        self.views.setCurrentWidget(self.recommend)
        self.recommend.table.setFocus()
        return self.recommend.refresh() if self.recommend.doc is None else None

    def show_search(self) -> None:
        self.views.setCurrentWidget(self.split)
        self.focus_search()

    def focus_search(self) -> None:
        self.query.setFocus()
        self.query.selectAll()

    # ---- search -----------------------------------------------------------------------------------
    def search_for(self, text: str) -> None:
        """Search for `text` as if typed (the voice bar sends a person here for a speech model)."""
        self.query.setText(text)
        self.search_btn.click()

    def search(self) -> None:
        self.views.setCurrentWidget(self.split)
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
        self._forget_model()
        for i, h in enumerate(self.hits):
            cells = [
                h["id"] + ("  (gated)" if h["gated"] else "") + ("  (vision)" if is_vision(h) else ""),
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
        # a refill keeps row 0 selected, and a selected row sends no signal when clicked: start from no
        # selection and no model, so the first click opens the new row and Download cannot fetch the old
        self.results.clearSelection()
        self.results.setCurrentCell(-1, -1)

    def _forget_model(self) -> None:
        self._opening = None
        self.detail = None
        self.quants.setRowCount(0)
        self.card.clear()
        self.model_meta.setText("")
        self.model_title.setText("<i>Pick a model on the left to see its files and whether it fits.</i>")

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

    def theme_changed(self) -> None:
        if self.detail is not None:  # the [vision] tag in the new theme's colour
            self.model_title.setText(_title_html(self.detail))

    def _show_detail(self, doc: dict[str, Any], *, checking: bool) -> None:
        self.detail = doc
        gated = {
            False: "not gated",
            None: "not gated",
            "auto": "gated (automatic approval)",
            "manual": "gated (manual approval)",
        }.get(doc["gated"], "gated")
        self.model_title.setText(_title_html(doc))
        self.model_meta.setText(
            f"License: {doc['license'] or 'not stated'} · {gated} · "
            f"{fmt.count(doc['downloads'])} downloads · "
            f"{fmt.count(doc['likes'])} likes · updated {(doc['last_modified'] or '-')[:10]}"
        )
        self.card.setMarkdown(doc["card"] or f"*No model card: {doc.get('card_problem') or 'none'}*")
        fit = (doc.get("fit") or {}).get("quantizations") or {}
        quants = doc["quantizations"]
        proj = pulled_projector([RepoFile(p["path"], p.get("size")) for p in doc["projectors"]], doc["id"])
        have = self._downloaded(doc["id"])
        self._warned.clear()
        self.quants.setRowCount(len(quants))
        for i, q in enumerate(quants):
            v = fit.get(q["name"])
            verdict = "checking…" if checking else fmt.verdict(v)
            per, detail = fmt.context((v or {}).get("max_ctx"), parallel=fmt.parallel_of(v))
            size, size_tip = self._pulled_size(q, proj)
            cells = [q["name"], size, verdict, per if v else "-"]
            for j, c in enumerate(cells):
                item = QTableWidgetItem(c)
                tip = (v or {}).get("summary") or ""
                item.setToolTip(f"{tip}\nContext: {detail}" if j == 3 and v else size_tip if j == 1 else tip)
                self.quants.setItem(i, j, item)
            why = QPushButton("Why?")
            why.setEnabled(v is not None)
            why.setToolTip(f"Why {q['name']} fits or not, device by device")
            why.setAccessibleName(f"Why {q['name']} fits or not")  # a screen reader names the row too
            why.clicked.connect(lambda _=False, n=q["name"]: self.why(n))
            dl = QPushButton("Download")
            dl.setAccessibleName(f"Download {q['name']}")
            dl.clicked.connect(lambda _=False, n=q["name"], b=dl: self.download(n, b))
            if q["name"].upper() in have:  # already here: a second copy would only repeat the files
                dl.setText("In Library")
                dl.setEnabled(False)
                dl.setToolTip("Already downloaded: open it on the Library page")
            elif (v or {}).get("verdict") == "too_large":
                dl.setText("Download anyway")
                dl.setToolTip("It does not fit this machine: see Why?")
            self.quants.setCellWidget(i, 4, why)
            self.quants.setCellWidget(i, 5, dl)
        known = [v for v in fit.values() if v and v.get("verdict") is not None]
        if not checking and quants and known and not any(v.get("fits") for v in known):
            self.model_meta.setText(f"{self.model_meta.text()}<br><b>{NONE_FITS}</b>")
        elif not checking and quants and fit and not known:  # a gated repository's headers, say: unread
            self.model_meta.setText(f"{self.model_meta.text()}<br><b>{unknown_fit(doc, fit)}</b>")
        if not quants:
            self.quants.setRowCount(1)
            self.quants.setItem(0, 0, QTableWidgetItem("no GGUF files in this repository"))

    @staticmethod
    def _pulled_size(q: dict[str, Any], proj: RepoFile | None) -> tuple[str, str]:
        """What a pull of `q` fetches (its files and the projector beside them), and how that adds up."""
        if proj is None or q["size"] is None:
            return fmt.size(q["size"]), ""
        total = int(q["size"]) + int(proj.size or 0)
        tip = f"{fmt.size(q['size'])} of weights + {fmt.size(proj.size)} for the vision projector {proj.path}"
        return fmt.size(total), tip

    def why(self, quant: str) -> ExplainDialog | None:
        if not self.detail:
            return None
        fit = self.detail.get("fit") or {}
        v = (fit.get("quantizations") or {}).get(quant)
        if v is None:
            return None
        doc = {**v, "title": f"{self.detail['id']}:{quant}", "hardware": fit.get("hardware")}
        if not v.get("fits"):
            doc["alternatives"] = self.smaller_that_fit(quant)
        dlg = ExplainDialog(doc["title"], doc, self)
        self.dialogs.append(dlg)
        dlg.show()
        return dlg

    def _downloaded(self, repo: str) -> set[str]:
        """The quantizations of `repo` already in the library (from the hub cache)."""
        return {
            (e.quant or "").upper()
            for e in self.desk.runtime.catalog.entries()
            if e.origin is not None and e.origin.repo == repo
        }

    def smaller_that_fit(self, quant: str) -> list[str]:
        """The other quantizations of the open model that fit here, smallest files first."""
        doc = self.detail or {}
        fit = (doc.get("fit") or {}).get("quantizations") or {}
        size = {q["name"]: int(q["size"] or 0) for q in doc.get("quantizations") or []}
        ok = [n for n, v in fit.items() if n != quant and (v or {}).get("fits")]
        return sorted(ok, key=lambda n: size.get(n, 0))

    def download(self, quant: str, button: QPushButton | None = None) -> asyncio.Task[Any] | None:
        """Queue `quant`. One that does not fit asks first: the first press warns on the page (naming
        a quantization that fits, where one does), a second press downloads it anyway."""
        assert self.detail is not None
        repo = self.detail["id"]
        v = ((self.detail.get("fit") or {}).get("quantizations") or {}).get(quant) or {}
        if v.get("verdict") == "too_large" and quant not in self._warned:
            self._warned.add(quant)
            better = self.smaller_that_fit(quant)
            hint = f" {better[0]} fits: download that instead." if better else f" {NONE_FITS}"
            self.report(
                f"{repo}:{quant} does not fit this machine (see Why?).{hint} "
                "Press Download anyway again to fetch it regardless."
            )
            return None
        return self.desk.spawn(
            self.desk.runtime.downloads.submit(repo, quant=quant),
            disable=[button] if button else [],
            report=self.report,
        )

    # ---- downloads panel --------------------------------------------------------------------------
    def _on_event(self, kind: str, data: dict[str, Any]) -> None:
        if not kind.startswith("download."):
            return
        self.panel.on_event(kind, data)
        if kind == "download.completed":
            self.desk.notify("Download finished", f"{data['repo']} is in the Library")
            if self.detail is not None and self.detail["id"] == data.get("repo"):
                self.desk.spawn(self._mark_downloaded(data["repo"]), report=self.report)
        elif kind == "download.failed":
            self.desk.notify("Download failed", f"{data['repo']}: {data.get('error')}", warn=True)

    async def _mark_downloaded(self, repo: str) -> None:
        await asyncio.to_thread(self.desk.runtime.catalog.scan)  # the new files, for "In Library"
        if self.detail is not None and self.detail["id"] == repo:
            self._show_detail(self.detail, checking=False)

    def job_state(self, job_id: str) -> str:
        return self.panel.job_state(job_id)


def unknown_fit(doc: dict[str, Any], fit: dict[str, Any]) -> str:
    """Why no verdict could be reached for any file (not "no file fits": nothing was measured)."""
    why = next((str(v.get("summary")) for v in fit.values() if v and v.get("summary")), "")
    if doc.get("gated") not in (False, None):
        return (
            "Whether a file fits is unknown: this repository is gated, so its files cannot be read until "
            "access is granted (request it on its Hugging Face page, then add your token in Settings)."
        )
    return f"Whether a file fits is unknown{': ' + why if why else ''}."


def _title_html(doc: dict[str, Any]) -> str:
    vision = f" <span style='color:{tone('accent')}'>[vision]</span>" if is_vision(doc) else ""
    return f"<h3 style='margin:0'>{doc['id']}{vision}</h3>"
