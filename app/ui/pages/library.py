"""Library: the local models with format (and vision), quant, size (the vision projector included), fit,
last eval score, smoke test, loaded state, last use and origin; a detail line for the selected model (its
files, the projector it loads with, the context per request, its last eval); Load/Unload, Chat, Explain,
Delete (confirmed; refused while loaded) and Import (button or drag and drop)."""

from __future__ import annotations

import asyncio
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QEvent, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QDragEnterEvent, QDropEvent, QGuiApplication
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.core.errors import ModelInUseError
from app.hub.update_check import read_updates
from app.library.app_stores.locations import APP_NAMES
from app.library.importer import import_model
from app.library.listing import ADAPTER_STATUS, listing
from app.library.model import ModelEntry
from app.library.remove import remove_model
from app.quality.store import EvalStore
from app.routing.engines import title
from app.ui import fmt
from app.ui.chat_models import why_not_chat
from app.ui.explain_view import ExplainDialog
from app.ui.pages import Page, table
from app.ui.pages.tune import TunePanel

if TYPE_CHECKING:
    from app.ui.context import Desk

COLUMNS = ["Name", "Format", "Quant", "Size", "Lane", "Fit", "Eval", "Smoke", "Loaded", "Last used", "Origin"]
LOADED = ("ready", "starting")
NAME_WIDTH = 220  # px: about 30 characters a line; longer names wrap


class LibraryPage(Page):
    title = "Library"
    hint = "Models on this machine. Drop a model file or folder here to import it."

    def __init__(self, desk: Desk) -> None:
        super().__init__(desk)
        self.setAcceptDrops(True)
        bar = QHBoxLayout()
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("Filter by name")
        self.filter.textChanged.connect(self._apply_filter)
        self.buttons: dict[str, QPushButton] = {}
        bar.addWidget(self.filter, 1)
        for name, slot in (
            ("Load", self.load),
            ("Unload", self.unload),
            ("Chat", self.chat),
            ("Explain", self.explain),
            ("Show in folder", self.show_in_folder),
            ("Check for update", self.check_update),
            ("Delete", self.delete),
            ("Import…", self.import_dialog),
        ):
            b = QPushButton(name)
            b.clicked.connect(lambda _=False, s=slot: s())
            bar.addWidget(b)
            self.buttons[name] = b
        self.root.addLayout(bar)
        self.root.addWidget(self.status)
        # long names wrap onto a second line instead of being cut ("…-70B-…" and "…-8B-…" stay apart at
        # 1024 px); the whole name is also in each row's tooltip
        self.table = table(COLUMNS, wrap=True)
        # the name keeps a set width and wraps, so Fit and the columns after it stay in view at 1024 px;
        # the last column takes what room is left on a wider window
        head = self.table.horizontalHeader()
        head.setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)
        self.table.setColumnWidth(0, NAME_WIDTH)
        head.setStretchLastSection(True)
        # a to z by name on first show (Qt's own first indicator is descending: z to a)
        head.setSortIndicator(0, Qt.SortOrder.AscendingOrder)
        self.table.setSortingEnabled(True)
        self.table.doubleClicked.connect(lambda _: self.chat())
        self.detail = QLabel("")  # the selected model: files, projector, context per request, last eval
        self.detail.setWordWrap(True)
        self.detail.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.tune = TunePanel(desk)
        # the table and the selected model's pane share the height by a splitter a person can drag; the
        # pane scrolls (both ways) inside its share: at its own full height it left the table three rows
        # at 1024x640
        self.split = QSplitter(Qt.Orientation.Vertical)
        self.split.setChildrenCollapsible(False)
        self.split.addWidget(self.table)
        self.pane_body = _PaneBody()
        self.split.addWidget(_pane(self.pane_body, self.detail, self.tune))
        self.pane_body.relaid.connect(self._fit_soon)  # its content grew or shrank: the share follows
        self.split.setStretchFactor(0, 3)
        self.split.setStretchFactor(1, 2)
        self._split_user = False  # the splitter was dragged: its place is the person's from then on
        self.split.splitterMoved.connect(lambda *_: setattr(self, "_split_user", True))
        self.root.addWidget(self.split, 1)
        self.table.itemSelectionChanged.connect(self._selection_changed)
        self._enable(False)
        self.empty = QLabel(
            "No models yet. Find one on the Discover page, drop a .gguf file here, or press Import…"
        )
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.root.addWidget(self.empty)
        self.rows: list[dict[str, Any]] = []
        self._filling = False
        self.dialogs: list[ExplainDialog] = []
        # models the server's update check found a newer revision for (docs/jobs.md#update-checks)
        found = read_updates(desk.runtime.paths.home / "updates.json").get("updates") or []
        self.updates: set[str] = {u["model"] for u in found if u.get("available")}
        self._answered = False  # a request was answered (and its speed measured) since the last refresh
        desk.bridge.received.connect(self._on_event)
        self.refresh()

    def theme_changed(self) -> None:
        self.tune.recompute()  # its verdict's words in the new theme's colours

    def showEvent(self, event: Any) -> None:
        super().showEvent(event)
        self._fit_soon()
        if self._answered:  # answers were measured while away: the Fit cells' speeds are read again
            self._answered = False
            self.refresh()

    def _fit_soon(self) -> None:
        QTimer.singleShot(0, self, self._fit_split)  # once laid out: the next turn of the loop

    def _fit_split(self) -> None:
        """Share the height between the table and the pane (on show and as the pane's content changes),
        until the person drags the splitter."""
        total = sum(self.split.sizes())
        if self._split_user or total <= 0 or not self.isVisible():
            return
        # the table keeps TABLE_ROWS rows (two lines each: long names wrap); the pane gets the rest, up to
        # its whole height (a large window shows it all, a small one scrolls it)
        row = 2 * self.table.fontMetrics().lineSpacing() + 6
        table_min = self.table.horizontalHeader().sizeHint().height() + TABLE_ROWS * row
        whole = self.pane_body.sizeHint().height()  # the scroll area's own hint is capped at 24 lines
        pane = min(whole, max(total - table_min, PANE_MIN_HEIGHT))
        self.split.setSizes([total - pane, pane])

    def _on_event(self, kind: str, _data: Any) -> None:
        # not a refresh per answer (an editor may send many): the page reads them when it is next shown
        self._answered = self._answered or kind == "request.done"
        if kind == "model.update_available":
            self.updates.add(str(_data.get("model")))
        if kind in ("download.completed", "lane.state", "library.changed", "model.update_available"):
            self.refresh()

    # ---- listing ----------------------------------------------------------------------------------
    def refresh(self) -> asyncio.Task[Any]:
        return self.desk.spawn(self._refresh(), report=self.report)

    async def _refresh(self) -> None:
        rt = self.desk.runtime

        def read() -> list[dict[str, Any]]:
            docs = listing(rt.library, rt.catalog, rt.settings)
            scores = _last_scores(rt.paths.evals_db)
            for d in docs:
                d["fit_text"] = "-"
                d["lane_text"] = "-"
                d["context_text"] = None
                d["eval"] = scores.get(d["id"])
                entry = rt.catalog.find(d["id"])
                d.update(_vision(entry, rt.settings) if entry is not None else {"vision": False})
                if d.get("status") == ADAPTER_STATUS:  # loads with its base: no fit or lane of its own
                    d["fit_text"] = adapter_text(d)
                    continue
                if rt.hardware is None or d.get("problem"):
                    d["fit_text"] = "broken" if d.get("problem") else "-"
                    continue
                try:
                    found = rt.explain_brief(d["id"])
                    if found is None:  # not probed (plan_memory off)
                        continue
                    doc = found.public()
                    # the lane this model would start on (its pin wins), as `switchyard explain` says
                    chosen = (doc.get("decision") or {}).get("lane")
                    d["lane_text"] = title(chosen) if chosen else "none"
                    fit = doc.get("fit") or {}
                    chosen_fit = fit.get("chosen") or {}
                    if chosen_fit.get("ctx_size"):  # what one request may hold, as Discover and Chat say
                        d["context_text"] = fmt.context(
                            int(chosen_fit["ctx_size"]), parallel=int(chosen_fit.get("parallel") or 1)
                        )[1]
                    v = {  # predicted (calibrated, else a range) beside measured, as explain shows them
                        "verdict": fit.get("verdict"),
                        "tokens_per_s": doc.get("tokens_per_s"),
                        "tokens_per_s_range": doc.get("tokens_per_s_range"),
                        "measured_tokens_per_s": doc.get("measured_tokens_per_s"),
                    }
                    d["fit_text"] = fmt.verdict(v) if fit else (doc.get("fit_problem") or "-")
                except Exception as exc:  # one unreadable model must not hide the others
                    d["fit_text"] = f"unknown ({exc})"
            return docs

        self.rows = await asyncio.to_thread(read)
        # the selection is the model, not the row number: refilling (and re-sorting) the rows would leave
        # the highlight on whatever model now sits at that index while the pane kept the old one
        keep = self.current_id()
        self._filling = True
        self.table.clearSelection()
        self.table.setSortingEnabled(False)
        self.table.setRowCount(len(self.rows))
        for i, d in enumerate(self.rows):
            lane = rt.lane_of(d["id"])
            origin = d.get("origin") or {}
            weights = int(d.get("size") or sum(int(f.get("size") or 0) for f in d.get("files") or []))
            size = weights + int(d.get("projector_size") or 0)  # what the model takes on disk, all of it
            cells = [
                d["id"],
                (d.get("format") or "-") + (" + vision" if d.get("vision") else ""),
                d.get("quant") or _quant(d) or "-",
                fmt.size(size),
                title(lane.plan.engine) if lane and lane.plan else d["lane_text"],  # running: where it runs
                d["fit_text"],
                _eval_text(d.get("eval")),
                _smoke_text(d.get("smoke")),
                str(lane.state) if lane and str(lane.state) != "stopped" else "no",
                fmt.ago(d.get("last_used_at")),
                (origin.get("repo") or owner_text(d.get("owner")) or d.get("source") or "-")
                + (" (update available)" if d["id"] in self.updates else ""),
            ]
            tips = {
                "Name": d["id"],
                "Format": _vision_tip(d),
                "Size": f"weights {fmt.size(weights)} + vision projector {fmt.size(d['projector_size'])}"
                if d.get("projector_size")
                else "",
                "Fit": d["problem"] if d.get("status") == ADAPTER_STATUS else "",
                "Eval": _eval_tip(d.get("eval")),
                "Smoke": _smoke_tip(d.get("smoke")),
            }
            for j, c in enumerate(cells):
                item = QTableWidgetItem(c)
                item.setData(Qt.ItemDataRole.UserRole, d["id"])
                if j == COLUMNS.index("Size"):
                    item.setData(Qt.ItemDataRole.UserRole + 1, size)
                item.setToolTip(tips.get(COLUMNS[j]) or c)
                self.table.setItem(i, j, item)
        self.table.setSortingEnabled(True)
        self._filling = False
        if keep is not None and not self.select(keep):  # gone (deleted): nothing selected, the pane empty
            self._selection_changed()
        self.empty.setVisible(not self.rows)
        self._apply_filter()
        self.desk.bridge.emit_local("library.refreshed")  # Chat's model list follows

    def _apply_filter(self) -> None:
        text = self.filter.text().lower()
        for i in range(self.table.rowCount()):
            item = self.table.item(i, 0)
            self.table.setRowHidden(i, bool(text) and text not in (item.text().lower() if item else ""))

    def current_id(self) -> str | None:
        """The model the highlighted row shows, or None (no report: `selected` is the one that asks)."""
        rows = self.table.selectionModel().selectedRows()
        item = self.table.item(rows[0].row(), 0) if rows else None
        return str(item.data(Qt.ItemDataRole.UserRole)) if item else None

    def _selection_changed(self) -> None:
        if self._filling:  # rows are being replaced: the model is selected again once they are all in
            return
        mid = self.current_id()
        if mid == self.tune.model and self.tune.isEnabled() and mid is not None:
            self._enable(True)  # the same model again after a refresh: its unsaved edits stay
            row = next((d for d in self.rows if d["id"] == mid), None)
            self.detail.setText(detail_text(row) if row else "")
            # and its verdict is read again with them, as the row's Fit cell was: a speed measured since
            # (or a model loaded beside it) shows in both, not in the row alone
            self.tune.recompute()
            return
        self.tune.show_model(mid)
        self._enable(mid is not None)
        row = next((d for d in self.rows if d["id"] == mid), None)
        self.detail.setText(detail_text(row) if row else "")

    def _enable(self, picked: bool) -> None:
        """The buttons that act on the selected model: off while none is selected, and off, saying why in
        the tooltip, where the model cannot take the action (Unload of a model not loaded, Check for
        update of a file that did not come from the hub, Chat with a speech model, Delete of a loaded
        one); on, naming the model they act on, otherwise."""
        mid = self.current_id() if picked else None
        why = self._why_not(mid) if mid is not None else {}
        for name, b in self.buttons.items():
            if name == "Import…":
                continue
            b.setEnabled(mid is not None and name not in why)
            b.setToolTip(why.get(name) or (f"{name} {mid}" if mid else f"{name}: select a model first"))

    def _why_not(self, mid: str) -> dict[str, str]:
        """Per button, why it cannot act on `mid` now (a button not named can)."""
        rt = self.desk.runtime
        lane = rt.lane_of(mid)
        state = str(lane.state) if lane is not None else "stopped"
        entry = rt.catalog.find(mid)
        why: dict[str, str] = {}
        if state in LOADED:
            why["Load"] = f"{mid} is loaded already ({state})"
            why["Delete"] = f"{mid} is loaded: unload it first, then delete it"
        else:
            why["Unload"] = f"{mid} is not loaded"
        if entry is not None and entry.origin is None:
            why["Check for update"] = (
                f"{mid} did not come from Hugging Face: there is nothing to check it against"
            )
        if entry is not None and (no_chat := why_not_chat(rt.catalog, mid)) is not None:
            why["Chat"] = no_chat.split(". ")[0]
        row = next((d for d in self.rows if d["id"] == mid), None)
        if row is not None and row.get("status") == ADAPTER_STATUS:
            why["Load"] = why["Chat"] = f"{mid} is a LoRA adapter: it loads with its base model"
        return why

    def _after(self, task: asyncio.Task[Any]) -> asyncio.Task[Any]:
        """The buttons read again once `task` is over (its own finally turned its button back on)."""
        task.add_done_callback(lambda _t: self._enable(self.current_id() is not None))
        return task

    def selected(self) -> str | None:
        rows = self.table.selectionModel().selectedRows()
        if not rows:
            self.report("Select a model in the table first.")
            return None
        item = self.table.item(rows[0].row(), 0)
        return str(item.data(Qt.ItemDataRole.UserRole)) if item else None

    def select(self, model_id: str) -> bool:
        for i in range(self.table.rowCount()):
            item = self.table.item(i, 0)
            if item and item.data(Qt.ItemDataRole.UserRole) == model_id:
                self.table.selectRow(i)
                return True
        return False

    # ---- actions ----------------------------------------------------------------------------------
    def load(self, model_id: str | None = None) -> asyncio.Task[Any] | None:
        mid = model_id or self.selected()
        if mid is None:
            return None
        self.clear_report()
        return self._after(
            self.desk.spawn(self.desk.runtime.load(mid), disable=[self.buttons["Load"]], report=self.report)
        )

    def unload(self, model_id: str | None = None) -> asyncio.Task[Any] | None:
        mid = model_id or self.selected()
        if mid is None:
            return None
        return self._after(
            self.desk.spawn(
                self.desk.runtime.unload(mid), disable=[self.buttons["Unload"]], report=self.report
            )
        )

    def chat(self) -> None:
        mid = self.selected()
        if mid is not None:
            page = self.desk.window.show_page("Chat")
            page.new_conversation(model=mid)  # type: ignore[attr-defined]

    def explain(self, model_id: str | None = None) -> asyncio.Task[Any] | None:
        mid = model_id or self.selected()
        if mid is None:
            return None
        return self.desk.spawn(self._explain(mid), report=self.report)

    async def _explain(self, mid: str) -> ExplainDialog:
        found = await self.desk.runtime.explain(mid)
        dlg = ExplainDialog(mid, found.public(), self)
        self.dialogs.append(dlg)
        dlg.show()
        return dlg

    def check_update(self, model_id: str | None = None) -> asyncio.Task[Any] | None:
        """For a model from the hub: a newer commit is downloaded (see the Discover page's panel)."""
        mid = model_id or self.selected()
        if mid is None:
            return None
        return self.desk.spawn(
            self._check_update(mid), disable=[self.buttons["Check for update"]], report=self.report
        )

    async def _check_update(self, mid: str) -> Any:
        entry = self.desk.runtime.catalog.get(mid, allow_broken=True)
        if entry.origin is None:
            self.report(f"{mid} did not come from Hugging Face: there is nothing to check it against.")
            return None
        job = await self.desk.runtime.downloads.update(
            entry.origin.repo, revision=entry.origin.revision or "main"
        )
        if job is None:
            self.desk.notify("Up to date", f"{mid} is the newest commit of {entry.origin.repo}")
        else:
            self.desk.notify(
                "Update found", f"{entry.origin.repo} {job.commit[:12]} is downloading (Discover)"
            )
        return job

    def show_in_folder(self) -> Path | None:
        mid = self.selected()
        if mid is None:
            return None
        entry = self.desk.runtime.catalog.get(mid, allow_broken=True)
        folder = entry.path if entry.path.is_dir() else entry.path.parent
        if not QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder))):
            # no file manager here (a bare desktop, a server): the path, to copy, is the next best thing
            QGuiApplication.clipboard().setText(str(folder))
            self.report(f"No file manager answered; the folder is {folder} (copied to the clipboard).")
        return folder

    def delete(self, model_id: str | None = None, *, confirm: bool = True) -> asyncio.Task[Any] | None:
        mid = model_id or self.selected()
        if mid is None:
            return None
        lane = self.desk.runtime.lane_of(mid)
        if lane is not None and (str(lane.state) in LOADED or lane.in_flight > 0):
            self.report(f"{mid} is loaded ({lane.state}); unload it first, then delete it.")
            return None
        if confirm:
            # a plain slot, not a coroutine: the modal question runs before any await
            answer = QMessageBox.question(
                self, f"Delete {mid}", delete_question(self.desk.runtime.catalog, mid)
            )
            if answer != QMessageBox.StandardButton.Yes:
                return None
        return self.desk.spawn(self._delete(mid), report=self.report)

    async def _delete(self, mid: str) -> None:
        rt = self.desk.runtime
        lane = rt.lane_of(mid)
        if lane is not None and (str(lane.state) in LOADED or lane.in_flight > 0):
            raise ModelInUseError(f"{mid} is loaded ({lane.state}); unload it first, then delete it")
        entry = rt.catalog.get(mid, allow_broken=True)
        # a file in a models folder goes only when asked: the question above named it, and Yes asked
        own = entry.source == "models_dir"
        await asyncio.to_thread(
            remove_model,
            mid,
            catalog=rt.catalog,
            library=rt.library,
            imported_root=rt.paths.imported,
            delete_files=own,
        )
        await rt.forget_lane(mid)  # `ps` and the lanes view stop listing it
        self.desk.notify("Model deleted", mid)
        await self._refresh()

    def import_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Import a model", str(Path.home()), "Models (*.gguf);;All (*)"
        )
        if path:
            self.import_path(Path(path))

    def import_path(self, path: Path) -> asyncio.Task[Any]:
        return self.desk.spawn(self._import(path), report=self.report)

    async def _import(self, path: Path) -> None:
        rt = self.desk.runtime
        self.clear_report()
        entry = await asyncio.to_thread(
            import_model, path, catalog=rt.catalog, library=rt.library, imported_root=rt.paths.imported
        )
        self.desk.notify("Model imported", entry.id)
        await self._refresh()

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if event.mimeData().hasUrls():
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        for url in event.mimeData().urls():
            if url.isLocalFile():
                self.import_path(Path(url.toLocalFile()))
        event.acceptProposedAction()


def _last_scores(db: Path) -> dict[str, dict[str, Any]]:
    """Each model's latest finished eval run (app/quality), as `switchyard eval --history` keeps them; an
    unreadable store leaves the column empty rather than the page."""
    try:
        return EvalStore(db).last_scores()
    except Exception:
        return {}


def _vision(entry: ModelEntry, settings: Any) -> dict[str, Any]:
    """The vision projector the model loads with (its `mmproj` override, else the pairing: the one rule,
    ModelEntry.projector) and that file's size; a projector that is not there is said, not counted."""
    proj = entry.projector(settings)
    if proj is None:
        return {"vision": False, "projector": None, "projector_size": 0}
    try:
        size = proj.stat().st_size
    except OSError:
        return {"vision": False, "projector": str(proj), "projector_size": 0, "projector_missing": True}
    return {"vision": True, "projector": str(proj), "projector_size": size}


def _vision_tip(d: dict[str, Any]) -> str:
    if d.get("projector_missing"):
        return f"Its vision projector {d['projector']} is missing: images will be refused until it is back"
    if d.get("vision"):
        return f"Reads images: loads the vision projector {Path(d['projector']).name} beside the weights"
    return ""


def _eval_text(run: dict[str, Any] | None) -> str:
    """The last eval score, short: "0.92 pass", "0.40 fail", "0.75" (no pass mark), "-" (never run)."""
    if not run or run.get("score") is None:
        return "-"
    passed = run.get("passed")
    verdict = " pass" if passed is True else " fail" if passed is False else ""
    return f"{float(run['score']):.2f}{verdict}"


def _eval_tip(run: dict[str, Any] | None) -> str:
    if not run:
        return "Not evaluated yet: no eval suite has scored this model"
    mark = f", pass mark {run['threshold']:g}" if run.get("threshold") is not None else ""
    return (
        f"Suite {run['suite']}: score {_eval_text(run)} over {run['cases']} case(s){mark}; "
        f"run {run['id']}, {fmt.ago(run.get('finished'))}"
    )


def owner_text(owner: dict[str, Any] | None) -> str | None:
    """Where a model of another app's store lives, as the Library's From column says it."""
    if not owner:
        return None
    app = APP_NAMES.get(owner["app"], owner["app"])
    return app if owner["app"] == "folder" else f"{app} ({owner['name']})"


def delete_question(catalog: Any, mid: str) -> str:
    """The confirmation: the model by name and what leaves the disk (a linked import keeps its files)."""
    entry = catalog.find(mid)
    if entry is None:
        return f"Delete {mid} from the library?"
    if entry.source == "import_link":
        return f"Remove {mid} from the library? Its files stay where they are: {entry.path}"
    if entry.owner is not None:  # another app's store: refused, with how that app removes it
        return (
            f"{mid} belongs to {owner_text(entry.owner.public())}: Switchyard reads it where it is and never "
            "deletes it; remove it in that app. Continue to see how?"
        )
    return f"Delete {mid} and its files from this machine?\n\n{entry.path}"


def detail_text(d: dict[str, Any]) -> str:
    """The selected model in a few lines: where it is, the projector it loads with, the context one
    request may hold, its last eval."""
    lines = [f"<b>{escape(d['id'])}</b>: {escape(d.get('path') or '-')}"]
    if d.get("projector"):
        state = " (missing)" if d.get("projector_missing") else f" ({fmt.size(d.get('projector_size'))})"
        lines.append(f"Vision projector: {escape(d['projector'])}{state}")
    if d.get("status") == ADAPTER_STATUS:
        lines.append(escape(d.get("problem") or "LoRA adapter"))
    if d.get("context_text"):
        lines.append(f"Context: {escape(d['context_text'])}")
    run = d.get("eval")
    if run:
        lines.append(f"Last eval: {escape(_eval_tip(run))}")
    return "<br>".join(lines)


def adapter_text(d: dict[str, Any]) -> str:
    """The Fit cell of a LoRA adapter: the models it loads with, or that none in the library does."""
    adapter = d.get("adapter") or {}
    bases = adapter.get("bases") or []
    return f"LoRA adapter of {', '.join(bases)}" if bases else "LoRA adapter (no base model here)"


def _quant(d: dict[str, Any]) -> str | None:
    facts = d.get("facts") or {}
    return facts.get("file_type") or facts.get("quant")


class _PaneBody(QWidget):
    """The pane's content; says when its layout asks for another size (its content grew or shrank). An
    override of its own event(), not an event filter on the page: a filter is called while the page is
    being destroyed."""

    relaid = Signal()

    def event(self, e: QEvent) -> bool:
        if e.type() == QEvent.Type.LayoutRequest:
            self.relaid.emit()
        return super().event(e)


def _pane(body: QWidget, *parts: QWidget) -> QScrollArea:
    """The selected model's pane: its parts one under the other in `body`, scrolled where the splitter's
    share is smaller than they are (and sideways on a screen narrower than them), never widening the
    window."""
    lay = QVBoxLayout(body)
    lay.setContentsMargins(0, 0, 0, 0)
    for part in parts:
        lay.addWidget(part)
    lay.addStretch(1)
    area = QScrollArea()
    area.setWidget(body)
    area.setWidgetResizable(True)
    area.setFrameShape(QScrollArea.Shape.NoFrame)
    area.setMinimumHeight(PANE_MIN_HEIGHT)
    return area


PANE_MIN_HEIGHT = 120  # the verdict and the first settings row stay in view however far it is dragged
TABLE_ROWS = 8  # rows the table keeps in view on first show, when the window has the room


def _smoke_text(smoke: dict[str, Any] | None) -> str:
    """The smoke test's mark (app/lanes/smoke.py): passed, failed, or none yet on these files."""
    return "-" if not smoke else ("passed" if smoke.get("ok") else "failed")


def _smoke_tip(smoke: dict[str, Any] | None) -> str:
    if not smoke:
        return "No smoke test yet: one short request runs when the model is first loaded"
    if not smoke.get("ok"):
        return f"Smoke test failed: {smoke.get('detail')}"
    took = f"{float(smoke.get('seconds') or 0):.2f} s"
    return f"Smoke test passed in {took} on {smoke.get('lane')}: {smoke.get('detail')}"
