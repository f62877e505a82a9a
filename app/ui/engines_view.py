"""The engines table of the Lanes page: versions, where each engine comes from, and Install / Update /
Rollback for the selected one. Installs run as the Runtime's jobs; the table follows `engine.*` events."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QTableWidgetItem, QVBoxLayout, QWidget

from app.core.errors import EngineInstallError
from app.lanes.engines.cuda import CudaKind, cuda_refusal
from app.lanes.engines.registry import engine_kinds
from app.lanes.install import engine as engine_install
from app.lanes.install.listing import engine_rows
from app.ui.context import Desk
from app.ui.pages import table
from app.ui.wording import for_window

_WHERE = {
    "managed": "own environment",
    "app": "Switchyard's Python",
    "path": "binary",
    "container": "container image",
    "registered": "registered build",
}


class EnginesPanel(QWidget):
    def __init__(self, desk: Desk, *, report: Callable[[str], None]) -> None:
        super().__init__()
        self.desk = desk
        self.report = report
        self.rows: list[dict[str, Any]] = []
        root = QVBoxLayout(self)
        root.setContentsMargins(0, 0, 0, 0)
        root.addWidget(QLabel("<b>Engines</b>"))
        # the health column carries install hints: they wrap onto more lines rather than being cut
        # Build: the GPU build this machine calls for (cpu, cuda12/13, rocm, vulkan, metal), why in its tip
        headers = ["Engine", "Installed", "From", "Pinned", "Previous", "Health", "Build"]
        self.table = table(headers, stretch=5, wrap=True)
        self.table.itemSelectionChanged.connect(self._buttons)
        root.addWidget(self.table)
        row = QHBoxLayout()
        self.progress = QLabel("")
        self.progress.setWordWrap(False)
        row.addWidget(self.progress, 1)
        self.install_btn = QPushButton("Install")
        self.install_btn.setToolTip("Install the pinned version into the engine's own environment")
        self.install_btn.clicked.connect(lambda: self._job("install"))
        self.update_btn = QPushButton("Update")
        self.update_btn.setToolTip("Install the pinned version where the installed one differs")
        self.update_btn.clicked.connect(lambda: self._job("update"))
        self.rollback_btn = QPushButton("Rollback")
        self.rollback_btn.setToolTip("Switch back to the version installed before")
        self.rollback_btn.clicked.connect(self._rollback)
        for b in (self.install_btn, self.update_btn, self.rollback_btn):
            row.addWidget(b)
        root.addLayout(row)
        desk.bridge.received.connect(self._on_event)
        self.refresh()

    def _on_event(self, kind: str, data: Any) -> None:
        if kind == "engine.progress":
            self.progress.setText(f"{data.get('engine')}: {data.get('line', '')}"[:200])
        elif kind in ("engine.done", "engine.failed", "engine.changed", "engine.started"):
            if kind == "engine.done":
                self.progress.setText(f"{data.get('engine')} {data.get('version')} installed")
            elif kind == "engine.failed":
                self.progress.setText(f"{data.get('engine')}: install failed")
            self.refresh()

    def refresh(self) -> None:
        rt = self.desk.runtime
        try:
            self.rows = [r for r in engine_rows(rt.settings, rt.hardware, store=rt.engines.store)]
        except Exception as exc:  # a broken engine install must not break the page
            self.rows = []
            self.report(f"engines could not be listed: {exc}")
        keep = self.selected()
        running = {j.engine for j in rt.engines.all() if j.state == "running"}
        self.table.setRowCount(len(self.rows))
        for i, r in enumerate(self.rows):
            installed = r["version"] or "-"
            if r["engine"] in running:
                installed += " (installing…)"
            pinned = f"{r['pinned']}{' (you)' if r['pinned_by'] == 'you' else ''}" if r["pinned"] else "-"
            cells = [
                r["engine"],
                installed,
                _WHERE.get(r["where"] or "", "-"),
                pinned,
                r["previous"] or "-",
                brief(for_window(r["problem"] or ("ok" if r["can_start"] else r["health"]))),
                r.get("build") or "-",
            ]
            health = for_window(r["problem"] or ("ok" if r["can_start"] else r["health"]))
            tips = {2: str(r["path"] or cells[2]), 5: health, 6: str(r.get("build_why") or cells[6])}
            for j, c in enumerate(cells):
                item = QTableWidgetItem(c)
                item.setToolTip(tips.get(j, c))
                self.table.setItem(i, j, item)
            if r["engine"] == keep:
                self.table.selectRow(i)
        self._buttons()

    def selected(self) -> str | None:
        rows = self.table.selectionModel().selectedRows()
        i = rows[0].row() if rows else -1
        return str(self.rows[i]["engine"]) if 0 <= i < len(self.rows) else None

    def _row(self) -> dict[str, Any] | None:
        name = self.selected()
        return next((r for r in self.rows if r["engine"] == name), None)

    def machine_refusal(self, engine: str) -> str | None:
        """Why this machine cannot run `engine` whatever is installed (vLLM or SGLang without a CUDA GPU),
        or None: installing it would only fetch gigabytes that cannot start."""
        kind = engine_kinds().get(engine)
        return cuda_refusal(self.desk.runtime.hardware) if isinstance(kind, CudaKind) else None

    def _buttons(self) -> None:
        r = self._row()
        installable = bool(r and r["installable"])
        refusal = self.machine_refusal(r["engine"]) if r is not None else None
        self.install_btn.setEnabled(
            installable and r is not None and r["where"] != "managed" and refusal is None
        )
        self.install_btn.setToolTip(
            f"{r['title']} cannot run here: {refusal}"
            if r is not None and refusal
            else "Install the pinned version into the engine's own environment"
        )
        self.update_btn.setEnabled(installable and r is not None and r["where"] == "managed")
        self.rollback_btn.setEnabled(installable and r is not None and bool(r["previous"]))

    def _job(self, action: str) -> None:
        r = self._row()
        if r is None:
            self.report("Select an engine first.")
            return
        engines = self.desk.runtime.engines

        async def run() -> None:
            job = engines.start(r["engine"], action=action)
            self.refresh()
            done = await engines.wait(job.id)
            if done.state == "failed":
                raise EngineInstallError(done.error or "the install failed")

        self.desk.spawn(run(), disable=[self.install_btn, self.update_btn], report=self.report)

    def _rollback(self) -> None:
        r = self._row()
        if r is None:
            return
        rt = self.desk.runtime

        async def run() -> None:  # a state file swap: quick, and the bus is only published from this thread
            engine_install.rollback(r["engine"], store=rt.engines.store, bus=rt.bus)

        self.desk.spawn(run(), disable=[self.rollback_btn], report=self.report)


def brief(text: str, *, limit: int = 70) -> str:
    """A health cell's first clause (its whole text, with any commands, is the tooltip): a cell of pip
    and docker command lines made each row a paragraph and pushed the running lanes out of view."""
    cuts = [i for stop in (". ", "; ", ": ", " (") if (i := text.find(stop, 12)) >= 0]
    first = text[: min(cuts)] if cuts else text
    return first if len(first) <= limit else first[: limit - 1].rstrip() + "…"
