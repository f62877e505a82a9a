"""Per-model context / parallel slots / GPU layers / KV cache / flash attention, speculative decoding (the
type, that type's knobs, and for "draft" the draft model) and LoRA adapters, with the fit recomputed as they
change, beside the plan the model runs with now (Library page).

A setting that does not fit, or that the engine would refuse (a minimum above its maximum, a draft model
that does not pair), is refused saying why; one that fits is saved into the model's `model_overrides` entry
in settings.json (only the keys the user changed) and applied at once: the model's lane, if loaded,
restarts alone with them (`Runtime.set_overrides`). The drafts and adapters offered are the library's models
that pair with this one (app/library/pairing.py), read in a thread; their widgets are tune_spec.py's.
A LoRA adapter selected in the table has no settings of its own: the panel says which model it loads with."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QGridLayout,
    QGroupBox,
    QLabel,
    QPushButton,
    QSpinBox,
    QStackedWidget,
    QWidget,
)

from app.core.errors import SettingsError
from app.core.settings import FLASH_ATTN, KV_TYPES, load_settings
from app.core.settings_file import update_settings
from app.core.speculation import KNOBS, NGRAM_DEFAULT, SPEC_TYPES, adapters_of, speculation_of
from app.library.pairing import ADAPTER_KIND, Pairings, pairings
from app.routing.engines import LANES
from app.ui.pages.tune_spec import NOTES, SPEC_LABELS, AdapterList, KnobsPage
from app.ui.theme import tone
from app.ui.wording import for_window

if TYPE_CHECKING:
    from app.ui.context import Desk


class VerdictLabel(QLabel):
    """The panel's verdict line. Whatever lands here (a plan's summary, a refusal, an error an action
    reported) is said in the window's words: the core's messages name commands, settings keys and bytes."""

    def setText(self, text: str) -> None:
        super().setText(for_window(text))


class TunePanel(QGroupBox):
    def __init__(self, desk: Desk) -> None:
        super().__init__("Settings for the selected model")
        self.desk = desk
        self.model: str | None = None
        self.result: dict[str, Any] | None = None
        self._task: asyncio.Task[Any] | None = None
        self.pairing: asyncio.Task[Any] | None = None  # reading the drafts and adapters that pair
        self._pairs: Pairings | None = None
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
        self.lane = QComboBox()
        self.lane.addItem("automatic", None)
        for name in LANES:
            self.lane.addItem(name, name)
        self.lane.setToolTip("Pin: always run this model on one lane (refused if that lane cannot run it)")
        self.lane.activated.connect(lambda _: self.pin(self.lane.currentData()))
        self.spec = QComboBox()
        for kind in SPEC_TYPES:  # words a person knows; the engine's type name is the item's tooltip
            self.spec.addItem(SPEC_LABELS.get(kind, kind), kind)
            self.spec.setItemData(
                self.spec.count() - 1, f"llama.cpp type: {kind}", Qt.ItemDataRole.ToolTipRole
            )
        self.spec.setAccessibleName("Speculation")
        self.spec.setToolTip(
            "Faster replies by guessing ahead (speculative decoding, llama.cpp): Repeated text pays "
            "on output that repeats its context; a smaller model with the same tokenizer can guess any text"
        )
        # one page of knobs per distinct knob list ("ngram" reads ngram_mod's); each type shows its own
        self.pages: dict[str, KnobsPage] = {}
        self.stack = QStackedWidget()
        by_keys: dict[tuple[str, ...], KnobsPage] = {}
        for kind in SPEC_TYPES:
            keys = KNOBS[NGRAM_DEFAULT if kind == "ngram" else kind]
            if keys not in by_keys or not keys:
                note = NOTES.get(NGRAM_DEFAULT if kind == "ngram" else kind, "")
                by_keys[keys] = KnobsPage(keys, note, self.recompute)
                self.stack.addWidget(by_keys[keys])
            self.pages[kind] = by_keys[keys]
        self.adapters = AdapterList(self.recompute)
        self._shown: dict[str, Any] = {}  # the values shown for the model: only those changed are saved
        self.applying: asyncio.Task[Any] | None = None  # the last save's apply to the running Runtime
        self.verdict = VerdictLabel("Select a model to see how its settings fit.")
        self.verdict.setWordWrap(True)
        # two lines kept for it (the plan and the one it replaces): the panel's height does not jump
        self.verdict.setMinimumHeight(2 * self.verdict.fontMetrics().lineSpacing())
        self.save_btn = QPushButton("Save for this model")
        self.save_btn.clicked.connect(self.save)
        # label + control pairs, four to a row, Save beside them; speculation's knobs, the adapters and the
        # verdict under them: fits a 1024x640 window
        pairs = (
            ("Context", self.ctx),
            ("Slots", self.parallel),
            ("GPU layers", self.gpu_layers),
            ("KV cache", self.kv),
            ("Flash attention", self.flash),
            ("Lane", self.lane),
            ("Speculation", self.spec),
        )
        for i, (text, w) in enumerate(pairs):
            row, col = divmod(i, 4)
            label = QLabel(text)
            label.setBuddy(w)
            lay.addWidget(label, row, 2 * col)
            lay.addWidget(w, row, 2 * col + 1)
        lay.addWidget(self.stack, 2, 0, 1, 9)
        lora = QLabel("LoRA adapters")
        lora.setToolTip("Adapters load with the model when its lane starts; each is served as MODEL+ADAPTER")
        lay.addWidget(lora, 3, 0)
        lay.addWidget(self.adapters, 3, 1, 1, 8)
        lay.addWidget(self.save_btn, 1, 6, 1, 2)
        lay.addWidget(self.verdict, 4, 0, 1, 9)
        lay.setColumnStretch(8, 1)  # an empty last column takes the room left: the controls keep their size
        self.ctx.valueChanged.connect(lambda _: self.recompute())
        self.gpu_layers.valueChanged.connect(lambda _: self.recompute())
        self.kv.currentIndexChanged.connect(lambda _: self.recompute())
        self.parallel.valueChanged.connect(lambda _: self.recompute())
        self.flash.currentIndexChanged.connect(lambda _: self.recompute())
        self.spec.currentIndexChanged.connect(lambda _: self._spec_changed())
        self._tab_chain()
        self.setEnabled(False)

    def _tab_chain(self) -> None:
        """Tab goes down the panel as it reads, Save last (adapter rows are made as models are shown)."""
        chain: list[QWidget] = [self.ctx, self.parallel, self.gpu_layers, self.kv, self.flash, self.lane]
        chain.append(self.spec)
        for page in dict.fromkeys(self.pages.values()):
            chain += page.focusable()
        chain += [*self.adapters.focusable(), self.save_btn]
        for a, b in itertools.pairwise(chain):
            QWidget.setTabOrder(a, b)

    def values(self) -> dict[str, Any]:
        return {
            "ctx_size": self.ctx.value(),
            "parallel": self.parallel.value(),
            "gpu_layers": self.gpu_layers.value(),
            "kv_type": self.kv.currentText(),
            "flash_attn": self.flash.currentText(),
            "speculative": self._speculative(),
            "lora": self.adapters.value(),
        }

    def _speculative(self) -> dict[str, Any]:
        kind = str(self.spec.currentData())
        return {"type": kind, **self.pages[kind].knobs()}

    def changed(self) -> dict[str, Any]:
        """The values that differ from those shown for the model: what a save writes and applies."""
        return {k: v for k, v in self.values().items() if v != self._shown.get(k)}

    def _spec_changed(self) -> None:
        self.stack.setCurrentWidget(self.pages[str(self.spec.currentData())])
        self.recompute()

    def show_model(self, model_id: str | None) -> None:
        for task in (self._task, self.pairing):  # a result for the model shown before must not land
            if task is not None and not task.done():
                task.cancel()
        why = None
        if model_id is not None and (why := self._adapter_note(model_id)) is not None:
            model_id = None
            self.verdict.setText(why)
        self.model = model_id
        self.setEnabled(model_id is not None)
        # the pane names the model it sets up: it can never seem to belong to another row
        self.setTitle(f"Settings for {model_id}" if model_id else "Settings for the selected model")
        if model_id is None:
            if why is None:  # nothing selected (or the model was deleted): nothing of the last one stays
                self.verdict.setText("Select a model to see how its settings fit.")
                self.result = None
            return
        s = self.desk.runtime.settings
        over = _overrides(self.desk).get(model_id, {})
        spec, lora = over.get("speculative"), over.get("lora")
        widgets = (self.ctx, self.parallel, self.gpu_layers, self.kv, self.flash, self.spec)
        for w in widgets:
            w.blockSignals(True)
        self.ctx.setValue(int(over.get("ctx_size", s.models.ctx_size)))
        self.parallel.setValue(int(over.get("parallel", s.models.parallel)))
        self.gpu_layers.setValue(int(over.get("gpu_layers", s.models.gpu_layers)))
        self.kv.setCurrentText(str(over.get("kv_type", s.models.kv_type)))
        self.flash.setCurrentText(str(over.get("flash_attn", s.models.flash_attn)))
        self._show_speculation(spec if isinstance(spec, dict) else {})
        try:
            saved = adapters_of(lora)
        except SettingsError:
            saved = ()
        self.adapters.show_saved(saved)
        for w in widgets:
            w.blockSignals(False)
        self._shown = self.values()
        self._tab_chain()
        pinned = self.desk.runtime.pins.get(model_id)
        self.lane.setCurrentIndex(max(self.lane.findData(pinned), 0))
        self._pairs = None
        self.pairing = self.desk.spawn(self._pair(model_id, spec, lora), report=self.verdict.setText)
        self.recompute()

    def _adapter_note(self, model_id: str) -> str | None:
        """For a LoRA adapter (no settings of its own): where it is set up instead; None for a model."""
        rt = self.desk.runtime
        entry = rt.catalog.find(model_id)
        if entry is None or entry.kind != ADAPTER_KIND:
            return None
        pairing = rt.catalog.adapter(model_id)
        if pairing is None or not pairing.bases:
            why = pairing.why if pairing is not None else "no base model in the library pairs with it"
            return f"{model_id} is a LoRA adapter, not a model: {why}."
        bases = " or ".join(pairing.bases)
        return f"{model_id} is a LoRA adapter of {bases}: select {bases} and tick it under LoRA adapters."

    def _show_speculation(self, spec: dict[str, Any]) -> None:
        """The saved type and its knobs (the older shape, a draft without a type, too); every other page
        starts from the engine's defaults."""
        kind = str(spec.get("type", "draft" if "draft" in spec else "off"))
        kind = kind if kind in self.pages else "off"
        knobs = {k: v for k, v in spec.items() if k != "type"}
        quiet = [w for page in self.pages.values() for w in page.focusable()]
        for w in quiet:
            w.blockSignals(True)
        for page in self.pages.values():
            page.show_knobs({})
        self.pages[kind].show_knobs(knobs)
        named = knobs.get("draft") if isinstance(knobs.get("draft"), str) else None
        self.pages["draft"].show_drafts(named if kind == "draft" else None, None)
        for w in quiet:
            w.blockSignals(False)
        self.spec.setCurrentIndex(max(self.spec.findData(kind), 0))
        self.stack.setCurrentWidget(self.pages[kind])

    async def _pair(self, mid: str, spec: Any, lora: Any) -> None:
        rt = self.desk.runtime

        def read() -> Pairings:
            entry = rt.catalog.get(mid, allow_broken=True)
            return pairings(entry, rt.catalog.scan(), spec=spec, lora=lora)

        found = await asyncio.to_thread(read)
        if self.model != mid:
            return
        self._pairs = found
        before = self.values()
        page = self.pages["draft"]
        named = page.draft.currentData() if page.draft is not None else None
        page.show_drafts(named, found.draft)
        self.adapters.show_choices(found.adapters, found.no_adapter)
        self._tab_chain()
        # what the library says may refuse the values shown (a draft or an adapter that does not pair)
        if self.values() != before or self.problem(self.values()) is not None:
            self.recompute()

    def problem(self, values: Mapping[str, Any]) -> str | None:
        """Why these values cannot be applied (the engine would refuse them), or None."""
        spec = values["speculative"]
        low, high = spec.get("n_min"), spec.get("n_max")
        if low is not None and high is not None and low > high:
            return f"Min. drafted ({low}) is above Max. drafted ({high}); lower it, or raise Max. drafted"
        try:
            speculation_of(spec)
            adapters_of(values["lora"])
        except SettingsError as exc:
            return exc.message
        if self._pairs is None:
            return None
        bad = {a.file: a.problem for a in self._pairs.adapters if a.problem}
        for item in values["lora"]:
            if item["file"] in bad:
                name = Path(item["file"]).name
                return f"the LoRA adapter {name} no longer pairs ({bad[item['file']]}); untick it"
        if spec["type"] == "draft":
            choices = self._pairs.draft
            named = spec.get("draft")
            if named in choices.refused:
                return f"the draft {named} is refused ({choices.refused[named]}); choose another draft"
            if named is None and choices.proposed is None:
                return f"no draft model qualifies ({choices.reason}); choose Repeated text instead"
        return None

    def recompute(self) -> asyncio.Task[Any] | None:
        """The newest values win: an older computation still running is cancelled."""
        if self.model is None:
            return None
        if self._task is not None and not self._task.done():
            self._task.cancel()
        page = self.pages["draft"]
        if self._pairs is not None and page.draft is not None:
            page.note.setText(page.draft_note(self._pairs.draft))
        self.verdict.setText("checking…")
        self._task = self.desk.spawn(self._compute(self.model, self.values()), report=self.verdict.setText)
        return self._task

    async def _compute(self, mid: str, values: dict[str, Any]) -> None:
        if (problem := self.problem(values)) is not None:
            self.result = {"values": values, "fit": None, "before": None, "problem": problem, "refused": True}
            self.verdict.setText(f"<span style='color:{tone('error')}'>Cannot be applied</span>: {problem}.")
            return
        rt = self.desk.runtime
        found = await rt.explain(mid, overrides=values)
        # the explanation's own view of the plan: its summary gives this model's measured speed where
        # there is one, as the Why? window does (the bare plan's says "not measured yet")
        fit = found.public()["fit"] if found.fit else None
        # the plan before: what the model runs with now, shown beside the new one when they differ
        now = await rt.explain(mid) if values != self._shown else found
        before = now.public()["fit"] if now.fit else None
        self.result = {"values": values, "fit": fit, "before": before, "problem": found.fit_problem}
        was = f" (now: {before['summary']})" if before and fit and before["summary"] != fit["summary"] else ""
        if fit is None:
            self.verdict.setText(found.fit_problem or "no memory estimate for this model")
        elif fit["fits"]:
            self.verdict.setText(f"<span style='color:{tone('ok')}'>Fits</span>: {fit['summary']}{was}")
        else:
            self.verdict.setText(
                f"<span style='color:{tone('error')}'>Does not fit</span>: "
                f"{fit['summary']}. {_largest(fit)}{was}"
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
        if self.result.get("refused"):
            self.verdict.setText(f"Not saved: {self.result['problem']}.")
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
        return dict(load_settings(desk.paths.settings_file).models.model_overrides)
    except SettingsError:
        return dict(desk.runtime.settings.models.model_overrides)
