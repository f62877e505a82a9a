"""The Tune panel's speculative decoding and LoRA widgets (tune.py lays them out): one page of knobs per
speculative type, within speculation.py's ranges (the lowest step of each box reads "default" and leaves
the knob to the engine), the draft model picker, and the list of LoRA adapters with their scales."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.core.speculation import (
    DRAFT_MAX_TEMPERATURE,
    FLOAT_RANGES,
    INT_RANGES,
    NGRAM_DEFAULT,
    SCALE_RANGE,
    Adapter,
)
from app.library.pairing import AdapterChoice, DraftChoices
from app.ui.theme import tone

_TIP = Qt.ItemDataRole.ToolTipRole
# each knob's label and tooltip (its range is added from speculation.py)
_LABELS = {
    "size_n": ("N-gram size", "size_n: the tokens of context looked up in the n-gram table"),
    "size_m": ("Tokens drafted", "size_m: the tokens drafted after an n-gram is found"),
    "min_hits": ("Min. hits", "min_hits: how often an n-gram must have been seen before it drafts"),
    "n_match": ("Match length", "n_match: the tokens that must match before it drafts"),
    "n_max": ("Max. drafted", "n_max: the most tokens drafted per step"),
    "n_min": ("Min. drafted", "n_min: the fewest tokens drafted per step"),
    "p_min": ("Min. confidence", "p_min: the draft goes on guessing while it is at least this sure"),
    "max_temperature": (
        "Up to temperature",
        "max_temperature: above this temperature a draft's guesses are mostly refused; kept with the "
        "model's settings (requests are not yet steered by it)",
    ),
}
# each speculative type in words a person knows; the engine's own name is the item's tooltip
SPEC_LABELS = {
    "off": "Off",
    "ngram": "Repeated text",
    "ngram_simple": "Repeated text, simple",
    "ngram_map_k": "Repeated text, keyed",
    "ngram_map_k4v": "Repeated text, keyed x4",
    "ngram_mod": "Repeated text, rolling",
    "ngram_cache": "Repeated text, cache",
    "draft": "Smaller model guesses",
}
# what a type does, under its knobs (tune.py builds one page per distinct knob list)
NOTES = {
    "off": "Off: every token comes from the model itself.",
    NGRAM_DEFAULT: "Guesses from a rolling n-gram match of the text so far; pays on output that repeats "
    "its context (code edits, quoting).",
    "ngram_simple": "Guesses from an n-gram table of the context; pays on output that repeats its context.",
    "ngram_cache": "llama.cpp's n-gram cache; it has no knobs.",
}


def knob_spin(key: str) -> QSpinBox | QDoubleSpinBox:
    """A knob's spin box over speculation.py's range; one step below it reads "default" (left out of the
    setting: the engine's own value)."""
    label, tip = _LABELS[key]
    spin: QSpinBox | QDoubleSpinBox
    if key in FLOAT_RANGES:
        low, high = FLOAT_RANGES[key]
        spin = QDoubleSpinBox()
        spin.setDecimals(2)
        spin.setSingleStep(0.05)
        spin.setRange(low - 0.05, high)
        special = f"default ({DRAFT_MAX_TEMPERATURE:g})" if key == "max_temperature" else "default"
        tip += f" ({low:g} to {high:g})"
    else:
        ilow, ihigh = INT_RANGES[key]
        spin = QSpinBox()
        spin.setRange(ilow - 1, ihigh)
        special = "default"
        tip += f" ({ilow} to {ihigh})"
    spin.setSpecialValueText(special)
    spin.setToolTip(f"{tip}; “default” leaves it to the engine")
    spin.setAccessibleName(label)
    return spin


class KnobsPage(QWidget):
    """One speculative type's page: its knobs on a line, and under them what it does (for "draft": the
    draft model picker and why the library proposes it, or why none qualifies)."""

    def __init__(self, keys: tuple[str, ...], note: str, changed: Callable[[], object]) -> None:
        super().__init__()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.spins: dict[str, QSpinBox | QDoubleSpinBox] = {}
        self.draft: QComboBox | None = None
        line = QHBoxLayout()
        for key in keys:
            if key == "draft":
                continue
            spin = self.spins[key] = knob_spin(key)
            spin.valueChanged.connect(lambda _: changed())
            label = QLabel(_LABELS[key][0])
            label.setBuddy(spin)
            line.addWidget(label)
            line.addWidget(spin)
        line.addStretch(1)
        if self.spins:
            lay.addLayout(line)
        under = QHBoxLayout()
        if "draft" in keys:
            self.draft = QComboBox()
            self.draft.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
            self.draft.setAccessibleName("Draft model")
            self.draft.setToolTip("A smaller model that guesses ahead; it must share this model's tokenizer")
            self.draft.currentIndexChanged.connect(lambda _: changed())
            label = QLabel("Draft model")
            label.setBuddy(self.draft)
            under.addWidget(label)
            under.addWidget(self.draft)
        self.note = QLabel(note)
        self.note.setWordWrap(True)
        under.addWidget(self.note, 1)
        lay.addLayout(under)
        lay.addStretch(1)

    def focusable(self) -> list[QWidget]:
        return [*self.spins.values(), *([self.draft] if self.draft is not None else [])]

    def show_knobs(self, knobs: Mapping[str, Any]) -> None:
        for key, spin in self.spins.items():
            v = knobs.get(key)
            if isinstance(v, bool) or not isinstance(v, int | float):
                v = spin.minimum()  # unset: "default"
            if isinstance(spin, QSpinBox):
                spin.setValue(int(v))
            else:
                spin.setValue(float(v))

    def knobs(self) -> dict[str, Any]:
        """The knobs set (those left at "default" are not), the draft model when one is named."""
        out: dict[str, Any] = {}
        if self.draft is not None and self.draft.currentData() is not None:
            out["draft"] = self.draft.currentData()
        for key, spin in self.spins.items():
            if spin.value() > spin.minimum():
                out[key] = round(spin.value(), 2) if isinstance(spin, QDoubleSpinBox) else spin.value()
        return out

    def show_drafts(self, named: str | None, choices: DraftChoices | None) -> None:
        """The picker: the library's proposal first (the setting then names none, so the library chooses
        again when it changes), then each other model whose tokenizer matches; a named draft that no
        longer pairs stays, marked, so it is not dropped unseen. `choices` None: still reading."""
        box = self.draft
        if box is None:
            return
        box.blockSignals(True)
        box.clear()
        if choices is None:
            box.addItem(named or "proposed (checking…)", named)
            self.note.setText("Checking which models share this model's tokenizer…")
        else:
            if choices.proposed is not None:
                smaller = _smaller(choices, choices.proposed)
                box.addItem(f"{choices.proposed} (proposed{', ' + smaller if smaller else ''})", None)
                box.setItemData(0, f"The library's proposal: {choices.reason}", _TIP)
            for other in choices.others:
                smaller = _smaller(choices, other)
                box.addItem(f"{other} ({smaller})" if smaller else other, other)
            for bad, why in choices.refused.items():
                box.addItem(f"{bad} (refused)", bad)
                box.setItemData(box.count() - 1, why, _TIP)
            if box.count() == 0:
                box.addItem("none qualifies", None)
                box.setItemData(0, choices.reason, _TIP)
            box.setCurrentIndex(max(box.findData(named), 0))
            self.note.setText(self.draft_note(choices))
        box.blockSignals(False)

    def draft_note(self, choices: DraftChoices) -> str:
        named = self.draft.currentData() if self.draft is not None else None
        if named in choices.refused:
            return f"{named} is refused: {choices.refused[named]}."
        if named is not None:
            return f"{named} shares this model's tokenizer. {effect(choices, named)}"
        if choices.proposed is None:
            return f"None qualifies: {choices.reason}."
        return (
            f"Proposed: {choices.proposed}, the smallest model in the library with this tokenizer. "
            f"{effect(choices, choices.proposed)}"
        )


def _smaller(choices: DraftChoices, draft: str) -> str:
    ratio = choices.ratios.get(draft)
    return f"{ratio:.0f}x smaller" if ratio is not None and ratio >= 2 else ""


def effect(choices: DraftChoices, draft: str) -> str:
    """What the draft is expected to do to reply speed, from how much smaller than the model it is."""
    ratio = choices.ratios.get(draft)
    if ratio is None:
        return ""
    cost = 100 / ratio
    if ratio < 4:  # a guess costs a third of a model step or more: little left to gain
        return (
            f"Each of its guesses costs about {cost:.0f} % of one of this model's steps: expect little gain, "
            "or slower replies when guesses are refused."
        )
    return (
        f"Each of its guesses costs about {cost:.0f} % of one of this model's steps: replies come faster "
        "when most guesses are accepted (code, quoting, predictable text), up to about twice as fast."
    )


class AdapterRow:
    def __init__(self, file: str, *, checked: bool, scale: float, changed: Callable[[], object]) -> None:
        self.file = file
        self.check = QCheckBox(Path(file).name)
        self.check.setChecked(checked)
        self.check.setToolTip(f"Load {file} with this model")
        self.scale = QDoubleSpinBox()
        self.scale.setDecimals(2)
        self.scale.setSingleStep(0.1)
        self.scale.setRange(*SCALE_RANGE)
        self.scale.setValue(scale)
        self.scale.setAccessibleName(f"Scale of {Path(file).name}")
        low, high = SCALE_RANGE
        self.scale.setToolTip(
            f"How strongly the adapter applies ({low:g} to {high:g}; 0 loads it without applying it)"
        )
        self.note = QLabel("checking…")
        self.note.setWordWrap(True)
        self.check.toggled.connect(lambda _: changed())
        self.scale.valueChanged.connect(lambda _: changed())

    def show_problem(self, problem: str | None) -> None:
        if problem is None:
            self.note.setText("pairs with this model")
        else:
            self.note.setText(f"<span style='color:{tone('error')}'>no longer pairs</span>: {problem}")


class AdapterList(QScrollArea):
    """The LoRA adapters that pair with the model, each with a box to load it and its scale; two rows in
    view, the rest scrolled."""

    def __init__(self, changed: Callable[[], object]) -> None:
        super().__init__()
        self.changed = changed
        self.rows: list[AdapterRow] = []
        self.setWidgetResizable(True)
        self.setFrameShape(QScrollArea.Shape.NoFrame)
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # its boxes take the focus, not the area
        self._fill_with([])

    def _fill_with(self, rows: list[AdapterRow], empty: str = "checking…") -> None:
        inner = QWidget()
        grid = QGridLayout(inner)
        grid.setContentsMargins(0, 0, 0, 0)
        for i, row in enumerate(rows):
            grid.addWidget(row.check, i, 0)
            scale = QLabel("Scale")
            scale.setBuddy(row.scale)
            grid.addWidget(scale, i, 1)
            grid.addWidget(row.scale, i, 2)
            grid.addWidget(row.note, i, 3)
        if not rows:
            self.empty = QLabel(empty)
            self.empty.setWordWrap(True)
            grid.addWidget(self.empty, 0, 0, 1, 4)
        grid.setColumnStretch(3, 1)
        self.rows = rows
        self.setWidget(inner)
        line = max(QCheckBox("x").sizeHint().height(), QDoubleSpinBox().sizeHint().height())
        self.setFixedHeight(2 * line + grid.verticalSpacing())

    def show_saved(self, saved: Sequence[Adapter]) -> None:
        """The saved adapters, ticked, while the library is read."""
        self._fill_with(
            [AdapterRow(a.file, checked=True, scale=a.scale, changed=self.changed) for a in saved]
        )

    def show_choices(self, choices: Sequence[AdapterChoice], empty: str) -> None:
        """Every adapter offered; the ones on screen keep what the user set on them."""
        have = {r.file: r for r in self.rows}
        rows = []
        for c in choices:
            row = have.get(c.file) or AdapterRow(c.file, checked=False, scale=1.0, changed=self.changed)
            row.show_problem(c.problem)
            rows.append(row)
        self._fill_with(rows, empty)

    def value(self) -> list[dict[str, Any]]:
        return [
            {"file": r.file, "scale": round(r.scale.value(), 2)} for r in self.rows if r.check.isChecked()
        ]

    def focusable(self) -> list[QWidget]:
        return [w for r in self.rows for w in (r.check, r.scale)]
