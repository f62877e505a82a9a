"""Settings: models folders, context/TTL/max lanes, Hugging Face token, mirror/proxy, start server with app.

Only the keys the user changed are merged into settings.json (other keys kept; checked the way the server
checks them), then applied to the running Runtime at once (`Runtime.change_settings`): a new hub, TTL or
lane limit needs no restart, a context change restarts only the lanes it touches, and the page says what
happened."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.core.errors import SettingsError
from app.core.secrets import Secret
from app.core.settings_file import set_settings
from app.hub.config import DEFAULT_ENDPOINT, hub_config
from app.safety.known import DEFAULT_JUDGE, KNOWN, KnownJudge
from app.ui import autostart
from app.ui.pages import Page

if TYPE_CHECKING:
    from app.ui.context import Desk

NO_JUDGE = (
    "No judge yet: tick the box above and press Save settings. Switchyard then downloads a small safety "
    "model (Qwen3Guard 0.6B) and makes it the judge."
)


# each setting as this page labels it: what was applied is said in the page's words, not settings.json's
LABELS = {
    "models_dirs": "Models folders",
    "ctx_size": "Default context",
    "idle_ttl_s": "Unload idle models after",
    "max_loaded_lanes": "Models loaded at once",
    "hf_endpoint": "Hugging Face mirror",
    "proxy": "Proxy",
    "start_server": "Start the local API server",
    "safety": "Safety",
}


def _named(keys: Any) -> str:
    return ", ".join(LABELS.get(str(k), str(k).replace("_", " ")) for k in keys)


def change_words(change: Any) -> str:
    """What a save did, in sentences: "Saved. In use now: Hugging Face mirror." and what still waits."""
    out = ["Saved."]
    if change.applied:
        out.append(f"In use now: {_named(change.applied)}.")
    if change.restarted:
        out.append(f"Restarted with the new values: {', '.join(change.restarted)}.")
    if change.failed:
        out.append("Could not restart: " + "; ".join(f"{k} ({v})" for k, v in change.failed.items()) + ".")
    if change.needs_server_restart:
        out.append(
            f"Takes effect when the server restarts (Server page): {_named(change.needs_server_restart)}."
        )
    if change.not_applied:
        out.append(f"Kept, but no engine uses it yet: {_named(change.not_applied)}.")
    return " ".join(out) if len(out) > 1 else "Saved: nothing changed."


def default_judge() -> KnownJudge:
    """The guard model `switchyard guard enable` uses by default (its repository, quantization, format)."""
    return KNOWN[DEFAULT_JUDGE]


class SettingsPage(Page):
    title = "Settings"
    hint = "Changes are saved to settings.json in the data folder and apply at once where they can."

    def __init__(self, desk: Desk) -> None:
        super().__init__(desk)
        s = desk.runtime.settings
        # the fields scroll below the title: the page's full height must not set the window's smallest
        # height (the window works at 1024x640, docs/desktop.md)
        body = QWidget()
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        scroll.setWidget(body)
        self.root.addWidget(scroll, 1)
        self.body = QVBoxLayout(body)
        self.body.setContentsMargins(0, 0, 0, 0)
        form = QFormLayout()
        self.models_dirs = QLineEdit("; ".join(str(p) for p in s.library.models_dirs))
        self.models_dirs.setPlaceholderText(f"{desk.paths.models} (default); separate several with ;")
        self.ctx = QSpinBox()
        self.ctx.setRange(0, 1 << 20)
        self.ctx.setSpecialValueText("automatic")
        self.ctx.setValue(s.models.ctx_size)
        self.ttl = QDoubleSpinBox()
        self.ttl.setRange(0, 7 * 86400)
        self.ttl.setDecimals(0)
        self.ttl.setSuffix(" s")
        self.ttl.setSpecialValueText("never unload")
        self.ttl.setValue(s.memory.idle_ttl_s)
        self.max_lanes = QSpinBox()
        self.max_lanes.setRange(0, 16)
        self.max_lanes.setSpecialValueText("automatic")  # 0: one, or as many as memory holds (residency)
        self.max_lanes.setValue(s.memory.max_loaded_lanes or 0)
        self.endpoint = QLineEdit(s.hub.hf_endpoint or "")
        self.hub_in_use = QLabel("")
        self.show_hub()
        self.proxy = QLineEdit(s.hub.hf_proxy or "")
        self.proxy.setPlaceholderText("none, e.g. http://proxy:3128")
        self.start_server = QCheckBox("Start the local API server when Switchyard opens")
        self.start_server.setChecked(s.server.start_server_with_app)
        self.login = QCheckBox("Start Switchyard when I log in")
        self.login.setChecked(autostart.enabled())
        self.login.clicked.connect(self.set_login)
        for spin in (self.ctx, self.ttl, self.max_lanes):
            spin.setMinimumWidth(180)
            spin.setMaximumWidth(220)
        form.addRow("Data folder", QLabel(str(desk.paths.home)))
        form.addRow("Models folders", self.models_dirs)
        form.addRow("Default context", self.ctx)
        form.addRow("Unload idle models after", self.ttl)
        form.addRow("Models loaded at once", self.max_lanes)
        # rows that share a line where they can: at 1024x640 the whole page fits without a scrollbar (a
        # scrollbar whose handle filled its track read as a second, nested one)
        form.addRow("Hugging Face mirror", _side_by_side(self.endpoint, self.hub_in_use))
        form.addRow("Proxy", self.proxy)
        self.theme = QComboBox()
        self.theme.addItems(["system", "light", "dark"])
        self.theme.setCurrentText(str(desk.state.get("theme", "system")))
        self.theme.currentTextChanged.connect(self.set_theme)
        self.theme.setMaximumWidth(220)
        form.addRow("Theme", self.theme)
        form.addRow("", _side_by_side(self.start_server, self.login, fill_first=False))
        self._safety_rows(form, s.safety.policy)
        self.body.addLayout(form)
        self.save_btn = QPushButton("Save settings")
        self.save_btn.clicked.connect(self.save)
        self.saved = QLabel("")
        row = QHBoxLayout()
        row.addWidget(self.save_btn)
        row.addWidget(self.saved, 1)
        self.body.addLayout(row)

        self.body.addWidget(
            QLabel("<b>Hugging Face token</b> (for gated and private models; kept in the system keyring)")
        )
        trow = QHBoxLayout()
        self.token = QLineEdit()
        self.token.setEchoMode(QLineEdit.EchoMode.Password)
        self.token.setPlaceholderText("hf_…  from huggingface.co/settings/tokens")
        self.to_file = QCheckBox("No keyring here: keep it in a private file")
        self.token_btn = QPushButton("Save token")
        self.token_btn.clicked.connect(lambda: self.save_token())
        trow.addWidget(self.token, 1)
        trow.addWidget(self.to_file)
        trow.addWidget(self.token_btn)
        self.body.addLayout(trow)
        found = desk.runtime.tokens.find().public()
        self.token_state = QLabel(
            f"Token: {'set (' + str(found.get('source')) + ')' if found.get('set') else 'none'}"
        )
        self.body.addWidget(self.token_state)
        self.body.addWidget(self.status)
        self.body.addStretch(1)
        self._shown = self.values()  # what the page showed: only what differs from it is saved
        self.applying: asyncio.Task[Any] | None = None  # the last save's apply to the running Runtime
        self.judge_download: asyncio.Task[Any] | None = None  # the default judge's, when saving added it

    def _safety_rows(self, form: QFormLayout, policy: dict[str, Any]) -> None:
        """The Safety section (docs/safety.md): the policy's switches. With no judge yet, turning it on and
        saving makes the default guard model the judge and downloads it (as `switchyard guard enable`)."""
        self._policy_base = dict(policy)
        self.safety_on = QCheckBox("Judge requests and answers with a safety model")
        self.safety_on.setChecked(bool(policy.get("enabled")))
        self.safety_judge = QComboBox()
        self.safety_judge.addItems(["request", "answer", "both"])
        self.safety_judge.setCurrentText(str(policy.get("judge", "request")))
        self.safety_fail = QComboBox()
        self.safety_fail.addItems(["open", "closed"])
        self.safety_fail.setCurrentText(str(policy.get("fail", "open")))
        self.safety_controversial = QComboBox()
        self.safety_controversial.addItems(["safe", "unsafe"])
        self.safety_controversial.setCurrentText(str(policy.get("controversial", "safe")))
        for box in (self.safety_judge, self.safety_fail, self.safety_controversial):
            box.setMaximumWidth(220)
        judges = ", ".join(str(j.get("model")) for j in policy.get("judges", []) if isinstance(j, dict))
        self.safety_judges = QLabel(f"Judges: {judges}" if judges else NO_JUDGE)
        self.safety_judges.setWordWrap(True)
        form.addRow(QLabel("<b>Safety</b>"), self.safety_on)
        form.addRow("Judge each", self.safety_judge)
        form.addRow("When no judge answers, fail", self.safety_fail)
        form.addRow("Controversial counts as", self.safety_controversial)
        form.addRow("", self.safety_judges)

    def _policy_value(self) -> dict[str, Any]:
        if not self._policy_base and not self.safety_on.isChecked():
            return {}  # no policy, and none asked for: nothing to write
        judges = self._policy_base.get("judges") or []
        if self.safety_on.isChecked() and not judges:
            judge = default_judge()
            judges = [{"model": judge.model, "format": judge.format}]
        return {
            **self._policy_base,
            **({"judges": judges} if judges else {}),
            "enabled": self.safety_on.isChecked(),
            "judge": self.safety_judge.currentText(),
            "fail": self.safety_fail.currentText(),
            "controversial": self.safety_controversial.currentText(),
        }

    def show_hub(self) -> None:
        """The hub in use and where it comes from: the setting, HF_ENDPOINT, or the default."""
        s = self.desk.runtime.settings
        used = hub_config(s).endpoint
        source = (
            "this setting" if s.hub.hf_endpoint else "HF_ENDPOINT" if used != DEFAULT_ENDPOINT else "default"
        )
        self.endpoint.setPlaceholderText(f"{used} ({source}); or a mirror")
        self.hub_in_use.setText(f"Hub in use: {used} ({source})")

    def values(self) -> dict[str, Any]:
        dirs = [d.strip() for d in self.models_dirs.text().split(";") if d.strip()]
        return {
            "models_dirs": dirs,
            "ctx_size": self.ctx.value(),
            "idle_ttl_s": float(self.ttl.value()),
            "max_loaded_lanes": self.max_lanes.value() or None,
            "hf_endpoint": self.endpoint.text().strip() or None,
            "hf_proxy": self.proxy.text().strip() or None,
            "start_server_with_app": self.start_server.isChecked(),
            "policy": self._policy_value(),
        }

    def save(self) -> bool:
        """Merge into settings.json; a value the server would refuse is refused here, with its reason."""
        self.clear_report()
        path: Path = self.desk.paths.settings_file
        adding_judge = self.safety_on.isChecked() and not self._policy_base.get("judges")
        values = self.values()
        changed = {k: v for k, v in values.items() if v != self._shown.get(k)}
        try:
            # merged into the file as it is now, under its lock: keys changed elsewhere meanwhile are kept
            set_settings(path, changed, origin="these settings")
        except SettingsError as exc:
            self.report(exc.message)
            return False
        self._shown = values
        self.saved.setText("Saved; applying…" if changed else "Nothing changed.")
        if changed:
            self.applying = self.desk.spawn(self._apply(changed), disable=[self.save_btn], report=self.report)
        if adding_judge:
            self._policy_base = dict(values["policy"])
            self.judge_download = self._fetch_judge()
        return True

    def _fetch_judge(self) -> asyncio.Task[Any] | None:
        """Queue the default judge's download unless the library has it; it shows in Discover's list."""
        judge = default_judge()
        self.safety_judges.setText(f"Judges: {judge.model}")
        have = any(
            e.origin is not None and e.origin.repo == judge.repo and (e.quant or "").upper() == judge.quant
            for e in self.desk.runtime.catalog.entries()
        )
        if have:
            return None
        self.safety_judges.setText(
            f"Judges: {judge.model} (downloading: see the Downloads list on the Discover page)"
        )
        return self.desk.spawn(
            self.desk.runtime.downloads.submit(judge.repo, quant=judge.quant), report=self.report
        )

    async def _apply(self, changed: dict[str, Any]) -> None:
        change = await self.desk.runtime.change_settings(changed)
        self.show_hub()
        self.saved.setText(change_words(change))

    def set_theme(self, choice: str) -> None:
        """Applies at once; kept in ui.json."""
        self.desk.theme.set(choice)
        self.desk.state.set("theme", choice)

    def set_login(self, on: bool) -> None:
        """Applies at once (the login entry is the setting)."""
        try:
            where = autostart.set_enabled(on)
        except OSError as exc:
            self.login.setChecked(autostart.enabled())
            self.report(f"Could not change the login entry: {exc}")
            return
        self.saved.setText(
            ("Starts on login" if on else "No longer starts on login") + (f" ({where})" if where else "")
        )

    def save_token(self) -> asyncio.Task[Any]:
        value = self.token.text().strip()

        async def store() -> None:
            if not value:
                self.report("Paste a token first.")
                return
            where = await asyncio.to_thread(
                self.desk.runtime.tokens.set, Secret(value), to_file=self.to_file.isChecked()
            )
            self.token.clear()
            self.clear_report()
            self.token_state.setText(f"Token: saved ({getattr(where, 'where', where)})")

        return self.desk.spawn(store(), disable=[self.token_btn], report=self.report)


def _side_by_side(first: QWidget, second: QWidget, *, fill_first: bool = True) -> QWidget:
    """Two widgets on one form row: the first takes the room left (a field), or both keep to the left (two
    check boxes)."""
    row = QWidget()
    lay = QHBoxLayout(row)
    lay.setContentsMargins(0, 0, 0, 0)
    lay.addWidget(first, 1 if fill_first else 0)
    lay.addSpacing(0 if fill_first else 24)
    lay.addWidget(second)
    if not fill_first:
        lay.addStretch(1)
    return row
