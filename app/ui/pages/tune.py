"""Per-model context / parallel slots / GPU layers / KV cache / flash attention, with the fit recomputed as
they change, beside the plan the model runs with now (Library page).

A setting that does not fit is refused with the largest context that does; one that fits is saved into the
model's `model_overrides` entry in settings.json (only the values the user changed) and applied at once:
the model's lane, if loaded, restarts alone with them (`Runtime.set_overrides`)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from PySide6.QtWidgets import QComboBox, QGridLayout, QGroupBox, QLabel, QPushButton, QSpinBox

from app.core.errors import SettingsError
from app.core.settings import FLASH_ATTN, KV_TYPES, load_settings
from app.core.settings_file import update_settings
from app.core.speculation import SPEC_TYPES
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
        lay = QGridLayout(self)
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
        self.parallel = QSpinBox()
        self.parallel.setRange(1, 256)
        self.flash = QComboBox()
        self.flash.addItems(list(FLASH_ATTN))
        self.spec = QComboBox()  # speculative decoding's type; its knobs stay in settings.json
        self.spec.addItems(list(SPEC_TYPES))
        self.spec.setToolTip(
            "Speculative decoding (llama.cpp): ngram pays on output that repeats its context; draft uses "
            "a smaller model with the same tokenizer"
        )
        self._spec_knobs: dict[str, Any] = {}  # the shown model's speculative knobs (draft, n_max ...)
        self._spec_type = "off"
        self._shown: dict[str, Any] = {}  # the values shown for the model: only those changed are saved
        self.applying: asyncio.Task[Any] | None = None  # the last save's apply to the running Runtime
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
        # two rows of label + control pairs, the verdict under them: fits a 1024-px window
        pairs = (
            ("Context", self.ctx),
            ("Slots", self.parallel),
            ("GPU layers", self.gpu_layers),
            ("KV cache", self.kv),
            ("Flash attention", self.flash),
            ("Speculation", self.spec),
            ("Lane", self.lane),
        )
        for i, (label, w) in enumerate(pairs):
            row, col = divmod(i, 4)
            lay.addWidget(QLabel(label), row, 2 * col)
            lay.addWidget(w, row, 2 * col + 1)
        lay.addWidget(self.save_btn, 1, 6, 1, 2)
        lay.addWidget(self.verdict, 2, 0, 1, 9)
        lay.setColumnStretch(8, 1)  # an empty last column takes the room left: the controls keep their size
        self.ctx.valueChanged.connect(lambda _: self.recompute())
        self.gpu_layers.valueChanged.connect(lambda _: self.recompute())
        self.kv.currentIndexChanged.connect(lambda _: self.recompute())
        self.parallel.valueChanged.connect(lambda _: self.recompute())
        self.flash.currentIndexChanged.connect(lambda _: self.recompute())
        self.spec.currentIndexChanged.connect(lambda _: self.recompute())
        self.setEnabled(False)

    def values(self) -> dict[str, Any]:
        return {
            "ctx_size": self.ctx.value(),
            "parallel": self.parallel.value(),
            "gpu_layers": self.gpu_layers.value(),
            "kv_type": self.kv.currentText(),
            "flash_attn": self.flash.currentText(),
            "speculative": self._speculative(),
        }

    def _speculative(self) -> dict[str, Any]:
        kind = self.spec.currentText()
        # the saved knobs belong to the saved type: another type starts from the engine's defaults
        knobs = self._spec_knobs if kind == self._spec_type else {}
        return {**knobs, "type": kind}

    def changed(self) -> dict[str, Any]:
        """The values that differ from those shown for the model: what a save writes and applies."""
        return {k: v for k, v in self.values().items() if v != self._shown.get(k)}

    def show_model(self, model_id: str | None) -> None:
        self.model = model_id
        self.setEnabled(model_id is not None)
        if model_id is None:
            return
        s = self.desk.runtime.settings
        over = _overrides(self.desk).get(model_id, {})
        widgets = (self.ctx, self.parallel, self.gpu_layers, self.kv, self.flash, self.spec)
        for w in widgets:
            w.blockSignals(True)
        self.ctx.setValue(int(over.get("ctx_size", s.ctx_size)))
        self.parallel.setValue(int(over.get("parallel", s.parallel)))
        self.gpu_layers.setValue(int(over.get("gpu_layers", s.gpu_layers)))
        self.kv.setCurrentText(str(over.get("kv_type", s.kv_type)))
        self.flash.setCurrentText(str(over.get("flash_attn", s.flash_attn)))
        raw_spec = over.get("speculative")
        spec: dict[str, Any] = raw_spec if isinstance(raw_spec, dict) else {}
        # the saved knobs travel with the type shown (the older shape, a draft without a type, too)
        self._spec_knobs = {k: v for k, v in spec.items() if k != "type"}
        self._spec_type = str(spec.get("type", "draft" if "draft" in spec else "off"))
        self.spec.setCurrentText(self._spec_type)
        for w in widgets:
            w.blockSignals(False)
        self._shown = self.values()
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
        rt = self.desk.runtime
        found = await rt.explain(mid, overrides=values)
        fit = found.fit.public() if found.fit else None
        # the plan before: what the model runs with now, shown beside the new one when they differ
        now = await rt.explain(mid) if values != self._shown else found
        before = now.fit.public() if now.fit else None
        self.result = {"values": values, "fit": fit, "before": before, "problem": found.fit_problem}
        was = f" (now: {before['summary']})" if before and fit and before["summary"] != fit["summary"] else ""
        if fit is None:
            self.verdict.setText(found.fit_problem or "no memory estimate for this model")
        elif fit["fits"]:
            self.verdict.setText(f"<span style='color:#2e7d32'>Fits</span>: {fit['summary']}{was}")
        else:
            self.verdict.setText(
                f"<span style='color:#c62828'>Does not fit</span>: {fit['summary']}. {_largest(fit)}{was}"
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
        model, values = self.model, self.changed()
        if not values:
            self.verdict.setText("Nothing changed for this model.")
            return True

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
        self._shown = self.values()
        self.verdict.setText(f"Saved for {model}; applying…")
        self.applying = self.desk.spawn(
            self._apply(model, values), disable=[self.save_btn], report=self.verdict.setText
        )
        return True

    async def _apply(self, model: str, values: dict[str, Any]) -> None:
        change = await self.desk.runtime.set_overrides(model, values)
        if model in change.failed:
            self.verdict.setText(f"Saved for {model}, but its lane did not restart: {change.failed[model]}")
        elif model in change.restarted:
            self.verdict.setText(f"Saved for {model}; its lane restarted with {change.restarted[model]}.")
        else:
            self.verdict.setText(f"Saved for {model}; used from its next start (it is not loaded now).")


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
