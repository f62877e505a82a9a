"""Discover's Recommended view: the curated small models per task, ranked for this machine
(app/advice/recommend.py), each with one Download button. It opens on first run (an empty library)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QTableWidgetItem, QVBoxLayout, QWidget

from app.advice.hub_fit import VERDICT_WORDS
from app.ui import fmt
from app.ui.pages import table

TASK_WORDS = {"chat": "Chat", "coding": "Coding", "embeddings": "Embeddings", "speech": "Speech"}


class RecommendView(QWidget):
    """The ranked list; `download` is the page's own (the same submit the quantization table uses)."""

    def __init__(self, desk: Any, *, report: Callable[[str], None], back: Callable[[], None]) -> None:
        super().__init__()
        self.desk = desk
        self.report = report
        self.doc: dict[str, Any] | None = None
        self.rows: list[dict[str, Any]] = []
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
        self.table = table(["Task", "Model", "Size", "Fit here", "Speed", ""], stretch=1, wrap=True)
        lay.addWidget(self.table, 1)

    def refresh(self) -> asyncio.Task[Any]:
        return self.desk.spawn(self._load(), disable=[self.refresh_btn], report=self.report)

    async def _load(self) -> None:
        from app.advice.inputs import AdviceInputs
        from app.advice.recommend import hub_asker, recommend

        self.note.setText("<i>checking which models fit this machine…</i>")
        rt = self.desk.runtime
        inputs = AdviceInputs(settings=rt.settings, hardware=await rt.hardware_now(), pins=rt.pins.all())
        ask = hub_asker(rt.hub.client(), inputs=inputs)
        found = await asyncio.to_thread(recommend, inputs, ask=ask)
        self.show_doc(found.public())

    def show_doc(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        problem = doc.get("hub_problem")
        self.note.setText(
            f"The hub did not answer ({problem}), so these verdicts come from approximate sizes."
            if problem
            else "Best first for each task: what fits here, then what runs at a usable speed."
        )
        self.rows = [r for recs in doc["tasks"].values() for r in recs]
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
        speed = f"~{r['tokens_per_s']:.0f} tok/s" if r["tokens_per_s"] is not None else "-"
        if r["usable"] is False:
            speed += " (slow)"
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
            dl.setToolTip("It does not fit this machine: " + r["summary"])
        dl.clicked.connect(lambda _=False, row=i, b=dl: self.download(row, b))
        self.table.setCellWidget(i, 5, dl)

    def download(self, row: int, button: QPushButton | None = None) -> asyncio.Task[Any]:
        """Queue the entry's files: its quantization (the projector comes with it), or each listed file."""
        r = self.rows[row]
        return self.desk.spawn(self._submit(r), disable=[button] if button else [], report=self.report)

    async def _submit(self, r: dict[str, Any]) -> list[Any]:
        jobs = self.desk.runtime.downloads
        if r["quant"]:
            return [await jobs.submit(r["repo"], quant=r["quant"])]
        return [await jobs.submit(r["repo"], file=f) for f in r["files"]]
