"""Per-model context / GPU layers / KV cache with the fit recomputed as they change (Library page).

A setting that does not fit is refused with the largest context that does; one that fits is saved as the
model's `model_overrides` entry in settings.json (applied the next time Switchyard starts)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from PySide6.QtWidgets import QComboBox, QGroupBox, QHBoxLayout, QLabel, QPushButton, QSpinBox

from app.core.errors import SettingsError
from app.core.settings import KV_TYPES, load_settings
from app.core.settings_file import update_settings
from app.routing.engines import LANES

if TYPE_CHECKING:
    from app.ui.context import Desk


class TunePanel(QGroupBox):
    def __init__(self, desk: Desk) -> None:
        super().__init__("Settings for the selected model")
        self.desk = desk
        self.model: str | None = None
        self.result: dict[str, Any] | None = None
        self._task: asyncio.Task[Any] | None = None
        lay = QHBoxLayout(self)
        self.ctx = QSpinBox()
        self.ctx.setRange(0, 1 << 28)
        self.ctx.setSingleStep(1024)
        self.ctx.setSpecialValueText("automatic")
        self.ctx.setMinimumWidth(120)
        self.gpu_layers = QSpinBox()
        self.gpu_layers.setRange(-1, 999)
        self.gpu_layers.setSpecialValueText("automatic")
        self.kv = QComboBox()
        self.kv.addItems(list(KV_TYPES))
        self.lane = QComboBox()
        self.lane.addItem("automatic", None)
        for name in LANES:
            self.lane.addItem(name, name)
        self.lane.setToolTip("Pin: always run this model on one lane (refused if that lane cannot run it)")
        self.lane.activated.connect(lambda _: self.pin(self.lane.currentData()))
        self.verdict = QLabel("Select a model to see how its settings fit.")
        self.verdict.setWordWrap(True)
        self.save_btn = QPushButton("Save for this model")
        self.save_btn.clicked.connect(self.save)
        for label, w in (
            ("Context", self.ctx),
            ("GPU layers", self.gpu_layers),
            ("KV cache", self.kv),
            ("Lane", self.lane),
        ):
            lay.addWidget(QLabel(label))
            lay.addWidget(w)
        lay.addWidget(self.verdict, 1)
        lay.addWidget(self.save_btn)
        self.ctx.valueChanged.connect(lambda _: self.recompute())
        self.gpu_layers.valueChanged.connect(lambda _: self.recompute())
        self.kv.currentIndexChanged.connect(lambda _: self.recompute())
        self.setEnabled(False)

    def values(self) -> dict[str, Any]:
        return {
            "ctx_size": self.ctx.value(),
            "gpu_layers": self.gpu_layers.value(),
            "kv_type": self.kv.currentText(),
        }

    def show_model(self, model_id: str | None) -> None:
        self.model = model_id
        self.setEnabled(model_id is not None)
        if model_id is None:
            return
        s = self.desk.runtime.settings
        over = _overrides(self.desk).get(model_id, {})
        for w in (self.ctx, self.gpu_layers, self.kv):
            w.blockSignals(True)
        self.ctx.setValue(int(over.get("ctx_size", s.ctx_size)))
        self.gpu_layers.setValue(int(over.get("gpu_layers", s.gpu_layers)))
        self.kv.setCurrentText(str(over.get("kv_type", s.kv_type)))
        for w in (self.ctx, self.gpu_layers, self.kv):
            w.blockSignals(False)
        pinned = self.desk.runtime.pins.get(model_id)
        self.lane.setCurrentIndex(max(self.lane.findData(pinned), 0))
        self.recompute()

    def recompute(self) -> asyncio.Task[Any] | None:
        """The newest values win: an older computation still running is cancelled."""
        if self.model is None:
            return None
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self.verdict.setText("checking…")
        self._task = self.desk.spawn(self._compute(self.model, self.values()), report=self.verdict.setText)
        return self._task

    async def _compute(self, mid: str, values: dict[str, Any]) -> None:
        found = await self.desk.runtime.explain(mid, overrides=values)
        fit = found.fit.public() if found.fit else None
        self.result = {"values": values, "fit": fit, "problem": found.fit_problem}
        if fit is None:
            self.verdict.setText(found.fit_problem or "no memory estimate for this model")
        elif fit["fits"]:
            self.verdict.setText(f"<span style='color:#2e7d32'>Fits</span>: {fit['summary']}")
        else:
            self.verdict.setText(
                f"<span style='color:#c62828'>Does not fit</span>: {fit['summary']}. {_largest(fit)}"
            )

    def pin(self, lane: str | None) -> asyncio.Task[Any] | None:
        """Pin the model to `lane` (None: unpin). A lane that cannot run it here is refused, saying why."""
        if self.model is None:
            return None
        return self.desk.spawn(self._pin(self.model, lane), report=self.verdict.setText)

    async def _pin(self, mid: str, lane: str | None) -> None:
        rt = self.desk.runtime
        if lane is not None:
            why = await rt.check_pin(mid, lane)
            if why:
                self.lane.setCurrentIndex(max(self.lane.findData(rt.pins.get(mid)), 0))
                self.verdict.setText(f"Not pinned to {lane}: {why}")
                return
        # one pin changed under the file's lock: pins set meanwhile by the CLI or the server are kept
        await asyncio.to_thread(rt.pins.set, mid, lane)
        self.verdict.setText(f"{mid} pinned to {lane}" if lane else f"{mid} is no longer pinned")

    def save(self) -> bool:
        if self.model is None or self.result is None or self.result["values"] != self.values():
            self.verdict.setText("Still checking these settings; try again in a moment.")
            return False
        fit = self.result["fit"]
        if fit is not None and not fit["fits"]:
            self.verdict.setText(f"Not saved: these settings do not fit. {_largest(fit)}")
            return False
        model, values = self.model, self.values()

        def merge(raw: dict[str, Any]) -> None:
            over = dict(raw.get("model_overrides") or {})
            over[model] = {**over.get(model, {}), **values}
            raw["model_overrides"] = over

        try:
            # this model's entry merged into the file as it is now, under its lock (others' edits kept)
            update_settings(self.desk.paths.settings_file, merge)
        except SettingsError as exc:
            self.verdict.setText(exc.message)
            return False
        self.verdict.setText(f"Saved for {self.model}; used the next time Switchyard starts.")
        return True


def _largest(fit: dict[str, Any]) -> str:
    best = max((p.get("max_ctx") or 0 for p in fit.get("placements") or [] if p.get("max_ctx")), default=0)
    advice = "; ".join(fit.get("advice") or [])
    if best:
        return f"The largest context that fits is {best}." + (f" ({advice})" if advice else "")
    return advice or "Nothing fits on this machine."


def _overrides(desk: Desk) -> dict[str, dict[str, Any]]:
    try:
        return dict(load_settings(desk.paths.settings_file).model_overrides)
    except SettingsError:
        return dict(desk.runtime.settings.model_overrides)
