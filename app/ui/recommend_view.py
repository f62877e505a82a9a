"""Discover's Recommended view: the curated small models per task, ranked for this machine
(app/advice/recommend.py), each with one Download button. It opens on first run (an empty library).

The speed shown is the prediction (nothing is measured before a download): calibrated by this machine's
measured answers where there are any, else the range the memory bandwidth gives. A Download of an entry
that does not fit warns first, naming the task's entry that fits; a second press fetches it anyway."""

from __future__ import annotations

import asyncio
import html
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QTableWidgetItem, QVBoxLayout, QWidget

from app.advice.hub_fit import VERDICT_WORDS
from app.advice.recommend import predicted_words
from app.ui import fmt
from app.ui.pages import table

if TYPE_CHECKING:
    from app.ui.context import Desk

TASK_WORDS = {"chat": "Chat", "coding": "Coding", "embeddings": "Embeddings", "speech": "Speech"}


class RecommendView(QWidget):
    """The ranked list; `download` is the page's own (the same submit the quantization table uses)."""

    def __init__(self, desk: Desk, *, report: Callable[[str], None], back: Callable[[], None]) -> None:
        super().__init__()
        self.desk = desk
        self.report = report
        self.doc: dict[str, Any] | None = None
        self.rows: list[dict[str, Any]] = []
        self._warned: set[str] = set()  # entries that do not fit, warned about once
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        head = QHBoxLayout()
        self.title = QLabel("<b>Recommended for this machine</b>")
        self.back = QPushButton("Back to search")
        self.back.setToolTip("Search Hugging Face for any model instead")
        self.back.clicked.connect(back)
        self.refresh_btn = QPushButton("Check again")
        self.refresh_btn.setToolTip("Ask the hub again and re-read this machine's free memory")
        self.refresh_btn.clicked.connect(self.refresh)
        head.addWidget(self.title, 1)
        head.addWidget(self.refresh_btn)
        head.addWidget(self.back)
        lay.addLayout(head)
        self.note = QLabel("")
        self.note.setWordWrap(True)
        lay.addWidget(self.note)
        # the starter model (app/library/starter.py) answers before any download: offered first
        starter_row = QHBoxLayout()
        self.starter_note = QLabel("")
        self.starter_note.setWordWrap(True)
        self.starter_chat = QPushButton("Chat with it now")
        self.starter_chat.clicked.connect(self.chat_with_starter)
        starter_row.addWidget(self.starter_note, 1)
        starter_row.addWidget(self.starter_chat)
        lay.addLayout(starter_row)
        self.starter_id: str | None = None
        self._offer_starter()
        self.table = table(
            ["Task", "Model", "Size", "Fit here", "Speed (predicted)", ""], stretch=1, wrap=True
        )
        speed_head = self.table.horizontalHeaderItem(4)
        assert speed_head is not None  # set by table() from the headers
        speed_head.setToolTip(
            "Tokens per second this machine should reach: calibrated from the answers measured here, or a "
            "range from the memory bandwidth until a model has been measured"
        )
        lay.addWidget(self.table, 1)
        desk.bridge.received.connect(self._on_event)

    def _offer_starter(self) -> None:
        """Show the starter model's line when the library lists it (hidden when it is turned off)."""
        starter = next((e for e in self.desk.runtime.catalog.entries() if e.starter is not None), None)
        self.starter_id = starter.id if starter is not None else None
        if starter is not None and starter.starter is not None:
            st = starter.starter
            terms = f"{st.license} license" if st.license else "license unknown"
            self.starter_note.setText(
                f"Ready now, no download: <b>{starter.id}</b> ({fmt.size(starter.size)}, {terms}), a small "
                "starter model that came with Switchyard. Quick, but not clever."
            )
            self.starter_chat.setToolTip(f"Open a chat with {starter.id} (from the package {st.package})")
        for w in (self.starter_note, self.starter_chat):
            w.setVisible(starter is not None)

    def chat_with_starter(self) -> None:
        if self.starter_id is not None:
            page = self.desk.window.show_page("Chat")
            page.new_conversation(model=self.starter_id)  # type: ignore[attr-defined]

    def refresh(self) -> asyncio.Task[Any]:
        self._offer_starter()
        return self.desk.spawn(self._load(), disable=[self.refresh_btn], report=self.report)

    async def _load(self) -> None:
        from app.advice.inputs import AdviceInputs
        from app.advice.recommend import hub_asker, recommend
        from app.fit.plan import device_bandwidths

        self.note.setText("<i>checking which models fit this machine…</i>")
        rt = self.desk.runtime
        hardware = await rt.hardware_now()
        speed = await asyncio.to_thread(rt.speeds.store.calibration, bandwidth=device_bandwidths(hardware))
        inputs = AdviceInputs(settings=rt.settings, hardware=hardware, pins=rt.pins.all(), speed=speed)
        ask = hub_asker(rt.hub.client(), inputs=inputs)
        found = await asyncio.to_thread(recommend, inputs, ask=ask)
        self.show_doc(found.public())

    def show_doc(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        problem = doc.get("hub_problem")
        head = (
            f"The hub did not answer ({problem}), so these verdicts come from approximate sizes."
            if problem
            else "Best first for each task: what fits here, then what runs at a usable speed."
        )
        # what `switchyard recommend` prints when nothing that fits is fast here (Recommendations.pace)
        paces = [str(p) for p in (doc.get("pace") or {}).values() if p]
        self.note.setTextFormat(Qt.TextFormat.RichText)  # lines apart; every line escaped
        self.note.setText("<br>".join(html.escape(line) for line in (head, *paces)))
        self.rows = [r for recs in doc["tasks"].values() for r in recs]
        self._warned.clear()
        self.table.setRowCount(len(self.rows))
        shown: set[str] = set()
        for i, r in enumerate(self.rows):
            first = r["task"] not in shown
            shown.add(r["task"])
            self._fill(i, r, first=first)

    def _fill(self, i: int, r: dict[str, Any], *, first: bool) -> None:
        name = r["pull"][0].split(":", 1)[0] + (f":{r['quant']}" if r["quant"] else "")
        if not r["quant"]:
            name += f" · {r['files'][0].rsplit('/', 1)[-1]}"
        tags = "  [vision]" if r["vision"] else ""
        speed = predicted_words(r, tag="")
        cells = [
            TASK_WORDS[r["task"]] if first else "",
            f"{name}{tags}\n{r['why']}",
            fmt.size(r["size"]),
            VERDICT_WORDS.get(r["verdict"] or "", "unknown"),
            speed,
        ]
        tip = r["summary"] + (f"\n{r['note']}" if r.get("note") else "")
        for j, c in enumerate(cells):
            item = QTableWidgetItem(c)
            item.setToolTip(tip)
            if j in (2, 4):
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.table.setItem(i, j, item)
        dl = QPushButton("Download")
        dl.setToolTip("Fetch " + " and ".join(r["pull"]))
        if r["fits"] is False:
            dl.setText("Download anyway")
            dl.setToolTip(f"It does not fit this machine: {r['summary']}.{self._smaller(r['task'])}")
        dl.clicked.connect(lambda _=False, row=i, b=dl: self.download(row, b))
        if self.in_library(r):  # downloaded already: pressing it again would fetch it again
            dl.setText("In Library")
            dl.setEnabled(False)
            dl.setToolTip("Already downloaded: open it on the Library page")
        dl.setAccessibleName(f"{dl.text()} {name}")
        self.table.setCellWidget(i, 5, dl)

    def in_library(self, r: dict[str, Any]) -> bool:
        """Whether the entry's quantization (or every listed file) is in the library already."""
        repo = str(r["pull"][0]).split(":", 1)[0]
        mine = [
            e for e in self.desk.runtime.catalog.entries() if e.origin is not None and e.origin.repo == repo
        ]
        if r["quant"]:
            return any((e.quant or "").upper() == str(r["quant"]).upper() for e in mine)
        names = {f.name for e in mine for f in (e.path, *e.parts)}
        return bool(r["files"]) and all(str(f).rsplit("/", 1)[-1] in names for f in r["files"])

    def _on_event(self, kind: str, _data: Any) -> None:
        if kind in ("download.completed", "library.refreshed") and self.doc is not None:
            self.show_doc(self.doc)  # a row just downloaded says In Library

    def _fitting(self, task: str) -> dict[str, Any] | None:
        """The task's best entry that fits here (the list is ranked: the first that fits)."""
        return next((r for r in self.rows if r["task"] == task and r["fits"]), None)

    def _smaller(self, task: str) -> str:
        """What to pick instead of an entry that does not fit: the task's entry that fits, else a smaller
        model found by searching."""
        better = self._fitting(task)
        if better:
            return f" A smaller model fits: {better['pull'][0]} ({fmt.size(better['size'])})."
        return (
            " None of the listed models for this task fits here: free some memory, or press Back to search "
            "and look for a model with fewer parameters."
        )

    def download(self, row: int, button: QPushButton | None = None) -> asyncio.Task[Any] | None:
        """Queue the entry's files: its quantization (the projector comes with it), or each listed file.
        One that does not fit asks first, as Discover does: the first press warns on the page (naming the
        task's entry that fits, where one does), a second press downloads it anyway."""
        r = self.rows[row]
        key = r["pull"][0]
        if r["fits"] is False and key not in self._warned:
            self._warned.add(key)
            said = r["summary"]
            what = said if said.startswith("does not fit") else f"does not fit this machine ({said})"
            self.report(
                f"{key} {what}.{self._smaller(r['task'])} Press Download anyway again to fetch it regardless."
            )
            return None
        return self.desk.spawn(self._submit(r), disable=[button] if button else [], report=self.report)

    async def _submit(self, r: dict[str, Any]) -> list[Any]:
        jobs = self.desk.runtime.downloads
        if r["quant"]:
            return [await jobs.submit(r["repo"], quant=r["quant"])]
        return [await jobs.submit(r["repo"], file=f) for f in r["files"]]
