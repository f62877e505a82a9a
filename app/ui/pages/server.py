"""Server: state and address, Start/Stop, Copy base URL, client snippets, API keys, LAN access, and the
live request log from `request.done` events."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.core.errors import BadRequestError, SettingsError
from app.core.secrets import KeyStore
from app.lanes.engines.llamacpp.request_defaults import ModelLimits, model_limits
from app.server import auth
from app.ui.chat_models import chat_model_ids
from app.ui.pages import Page, table
from app.ui.theme import tone

if TYPE_CHECKING:
    from app.ui.context import Desk

LOG_ROWS = 500


class ServerPage(Page):
    title = "Server"
    hint = "The local OpenAI-compatible API. Editors and scripts use the base URL below."

    def __init__(self, desk: Desk) -> None:
        super().__init__(desk)
        grid = QGridLayout()
        self.state = QLabel()
        self.address = QLineEdit()
        self.address.setReadOnly(True)
        self.toggle = QPushButton()
        self.toggle.clicked.connect(self.start_stop)
        self.copy = QPushButton("Copy base URL")
        self.copy.clicked.connect(self.copy_url)
        self.port = QSpinBox()
        self.port.setRange(0, 65535)
        self.port.setSpecialValueText("any free port")
        self.port.setValue(desk.runtime.settings.server.port)
        self.port.setMinimumWidth(140)
        self.port_btn = QPushButton("Use this port")
        self.port_btn.clicked.connect(lambda: self.apply_port(self.port.value()))
        # the certificate's fingerprint, for a LAN client to check before it trusts the certificate
        self.fingerprint = QLineEdit()
        self.fingerprint.setReadOnly(True)
        self.copy_fp = QPushButton("Copy fingerprint")
        self.copy_fp.clicked.connect(self.copy_fingerprint)
        self.lan = QCheckBox("Allow access from the local network (needs an API key; served over HTTPS)")
        self.lan.setChecked(not auth.is_loopback(_saved_host(desk) or desk.runtime.settings.server.host))
        self.lan.clicked.connect(self.set_lan)
        # what the box means now: the address other computers use (the box applies at once: the server
        # listens again with the address and request guards of the new choice)
        self.lan_note = QLabel("")
        self.lan_note.setWordWrap(True)
        self.lan_note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        grid.addWidget(QLabel("State"), 0, 0)
        grid.addWidget(self.state, 0, 1, 1, 2)
        grid.addWidget(self.toggle, 0, 3)
        grid.addWidget(QLabel("Base URL"), 1, 0)
        grid.addWidget(self.address, 1, 1, 1, 2)
        grid.addWidget(self.copy, 1, 3)
        grid.addWidget(QLabel("Port"), 2, 0)
        port_row = QHBoxLayout()
        port_row.addWidget(self.port)
        port_row.addWidget(self.port_btn)
        port_row.addStretch(1)
        grid.addLayout(port_row, 2, 1, 1, 3)
        grid.addWidget(QLabel("TLS (SHA-256)"), 3, 0)
        grid.addWidget(self.fingerprint, 3, 1, 1, 2)
        grid.addWidget(self.copy_fp, 3, 3)
        grid.addWidget(self.lan, 4, 0, 1, 4)
        grid.addWidget(self.lan_note, 5, 0, 1, 4)
        grid.setColumnStretch(1, 1)
        self.root.addLayout(grid)
        self.root.addWidget(self.status)

        tabs = QTabWidget()
        self.snippet = QPlainTextEdit()
        self.snippet.setReadOnly(True)
        self.snippet.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        tabs.addTab(self.snippet, "Snippets")
        kw = QWidget()
        kl = QVBoxLayout(kw)
        row = QHBoxLayout()
        self.key_name = QLineEdit()
        self.key_name.setPlaceholderText("Name for a new key, e.g. laptop-editor")
        self.create_btn = QPushButton("Create key")
        self.create_btn.clicked.connect(lambda: self.create_key(self.key_name.text()))
        self.revoke_btn = QPushButton("Revoke selected")
        self.revoke_btn.clicked.connect(self.revoke_selected)
        row.addWidget(self.key_name, 1)
        row.addWidget(self.create_btn)
        row.addWidget(self.revoke_btn)
        kl.addLayout(row)
        self.new_key = QLineEdit()
        self.new_key.setReadOnly(True)
        self.new_key.setPlaceholderText("A new key shows here once; copy it to the client")
        kl.addWidget(self.new_key)
        self.keys = table(["Name", "Created", "Ends with", "In keyring"])
        # Revoke acts on the selected key: off while none is
        self.keys.itemSelectionChanged.connect(
            lambda: self.revoke_btn.setEnabled(bool(self.keys.selectionModel().selectedRows()))
        )
        self.revoke_btn.setEnabled(False)
        kl.addWidget(self.keys, 1)
        tabs.addTab(kw, "API keys")
        self.log = table(["Time", "Client", "Model", "Route", "Status", "Duration"], stretch=3)
        tabs.addTab(self.log, "Request log")
        self.tabs = tabs
        self.root.addWidget(tabs, 1)
        desk.bridge.received.connect(self._on_event)
        self.refresh_state()
        self.refresh_keys()

    def theme_changed(self) -> None:
        self.refresh_state()  # "Running" in the new theme's green

    def hideEvent(self, event: Any) -> None:
        """A new key is shown once, while the page is open: leaving the page takes it off the screen."""
        super().hideEvent(event)
        self.new_key.clear()

    # ---- state ------------------------------------------------------------------------------------
    def _on_event(self, kind: str, data: dict[str, Any]) -> None:
        if kind in ("server.state", "library.refreshed"):  # the snippets name a model that is here
            self.refresh_state()
        elif kind == "request.done":
            self._log(data)

    def refresh_state(self) -> None:
        srv = self.desk.server
        if srv.running:
            self.state.setText(f"<b style='color:{tone('ok')}'>Running</b> on {srv.url}")
            self.toggle.setText("Stop server")
        else:
            why = f": {srv.error}" if srv.error else ""
            self.state.setText(f"<b>Stopped</b>{why}")
            self.toggle.setText("Start server")
        self.state.setWordWrap(True)
        base = f"{srv.url}/v1" if srv.url else ""
        self.address.setText(base or "(not listening)")
        self.copy.setEnabled(bool(base))
        self.lan_note.setText(self._lan_words())
        material = srv.tls if srv.running else None
        self.fingerprint.setText(material.fingerprint if material else "(plain HTTP: no certificate)")
        self.fingerprint.setToolTip(str(material.cert) if material else "")
        self.copy_fp.setEnabled(material is not None)
        # stopped: the port it will listen on (the one just chosen on this page, else the settings')
        port = srv.port if srv.port is not None else self.desk.runtime.settings.server.port
        url = base or (f"http://127.0.0.1:{port}/v1" if port else "")
        model = (chat_model_ids(self.desk.runtime.catalog) or ["MODEL"])[0]  # a snippet chats: a chat model
        if not url:  # any free port, not chosen yet: no made-up address in the snippets
            self.snippet.setPlainText("The snippets show here once the server listens: press Start server.")
            return
        text = _snippets(url, model, limits=self._request_limits(model))
        if material is not None:
            text = _tls_note(str(material.cert), material.fingerprint) + text
        self.snippet.setPlainText(text)

    def _request_limits(self, model: str) -> ModelLimits:
        """What one request may use on `model`: its context over the engine's parallel slots, the output cap
        a request without max_tokens gets, and tools where its template takes them; 2048 tokens where no
        plan is known."""
        rt = self.desk.runtime
        try:
            found = rt.explain_brief(model) if model != "MODEL" else None
        except Exception:  # a model that cannot be planned: the snippet still shows
            found = None
        chosen = found.fit.chosen if found is not None and found.fit is not None else None
        slot = chosen.params.ctx_size // max(1, chosen.params.parallel) if chosen is not None else 2048
        template = found.facts.chat_template if found is not None and found.facts is not None else None
        return model_limits(model, rt.settings, slot_ctx=slot, chat_template=template)

    def start_stop(self) -> asyncio.Task[Any]:
        srv = self.desk.server
        self.clear_report()
        return self.desk.spawn(
            srv.stop() if srv.running else srv.start(), disable=[self.toggle], report=self.report
        )

    def apply_port(self, port: int) -> asyncio.Task[Any]:
        """Listen on `port` now (a busy one is reported and the server stays stopped) and remember it."""
        srv = self.desk.server
        self.clear_report()

        async def move() -> None:
            wanted = srv.wanted  # a server the user stopped stays stopped; it listens there when started
            await srv.stop(keep_wanted=True)
            srv.port = port
            try:
                _save_setting(self.desk.paths.settings_file, "port", port)
            except (OSError, SettingsError) as exc:
                self.report(getattr(exc, "message", str(exc)))
            try:
                if wanted:
                    await srv.start()
                else:
                    where = f"port {port}" if port else "any free port"
                    self.desk.notify("Port saved", f"The server will listen on {where} when you press Start.")
            finally:
                self.refresh_state()  # the button says what the server does now, event or not

        return self.desk.spawn(move(), disable=[self.port_btn, self.toggle], report=self.report)

    def copy_url(self) -> str | None:
        """Copy the /v1 base URL; the button says so for two seconds."""
        if not self.desk.server.url:
            return None
        url = self.desk.server.url + "/v1"
        QGuiApplication.clipboard().setText(url)
        self.copy.setText("Copied")
        # the button is the timer's context: deleted with the window (quit), the timer never fires
        QTimer.singleShot(2000, self.copy, lambda: self.copy.setText("Copy base URL"))
        return url

    def copy_fingerprint(self) -> None:
        if self.desk.server.tls is not None:
            QGuiApplication.clipboard().setText(self.desk.server.tls.fingerprint)

    def _lan_words(self) -> str:
        srv = self.desk.server
        wanted = not auth.is_loopback(self.desk.runtime.settings.server.host)
        if srv.running and srv.host is not None and auth.is_loopback(srv.host) == wanted:
            # changed elsewhere (settings.json, the admin API) while listening: the next Start applies it
            now = "only this computer" if wanted else "the local network"
            return f"Saved. It still answers {now} until you press Stop server, then Start server."
        if not wanted:
            return ""
        if not srv.running or not srv.url:
            return "Other computers can connect once the server is started."
        scheme, port = srv.url.split("://", 1)[0], srv.url.rsplit(":", 1)[-1]
        urls = [f"{scheme}://{a}:{port}/v1" for a in lan_addresses()]
        if not urls:
            return "No network address was found on this computer: other computers cannot reach it now."
        return "Other computers use: " + " or ".join(urls) + " (with an API key from the API keys tab)"

    def set_lan(self, on: bool) -> asyncio.Task[Any] | None:
        """Refused without a key; else saved to settings.json, taken by the Runtime, and, while the server
        listens, applied at once: it listens again on the new address with guards built for it. Stopped,
        the next Start applies it. The note under the box then names the address other computers use."""
        self.clear_report()
        store = KeyStore.at(self.desk.paths)
        if on and not store:
            self.lan.setChecked(False)
            self.report("Create an API key first: anyone on the network could otherwise use your models.")
            return None
        host = "0.0.0.0" if on else "127.0.0.1"
        try:
            _save_setting(self.desk.paths.settings_file, "host", host)
        except (OSError, SettingsError) as exc:
            self.lan.setChecked(not on)
            self.report(getattr(exc, "message", str(exc)))
            return None
        srv = self.desk.server

        async def apply() -> None:
            await self.desk.runtime.change_settings({"host": host})
            try:
                if srv.running:
                    await srv.stop(keep_wanted=True)
                    await srv.start()
            finally:
                self.refresh_state()

        return self.desk.spawn(apply(), disable=[self.lan, self.toggle], report=self.report)

    # ---- keys -------------------------------------------------------------------------------------
    def refresh_keys(self) -> None:
        entries = [k.public() for k in KeyStore.at(self.desk.paths).entries()]
        self.keys.setRowCount(len(entries))
        for i, k in enumerate(entries):
            cells = [
                k["name"],
                str(k["created"])[:16].replace("T", " "),
                "…" + k["last4"],
                "yes" if k["in_keyring"] else "no (hash on disk only)",
            ]
            for j, c in enumerate(cells):
                self.keys.setItem(i, j, QTableWidgetItem(c))

    def create_key(self, name: str) -> str | None:
        self.clear_report()
        try:
            made = KeyStore.at(self.desk.paths).create(name.strip())
        except BadRequestError as exc:
            self.report(exc.message)
            return None
        except Exception as exc:
            self.report(getattr(exc, "message", str(exc)))
            return None
        value = made.secret.reveal()
        self.new_key.setText(value)
        self.key_name.clear()
        self.refresh_keys()
        if made.keyring_problem:
            self.report(f"Copy the key now: {made.note()}")
        return value

    def revoke_selected(self) -> None:
        rows = self.keys.selectionModel().selectedRows()
        if not rows:
            self.report("Select a key to revoke.")
            return
        item = self.keys.item(rows[0].row(), 0)
        if item is not None:
            self.revoke(item.text())

    def revoke(self, name: str) -> None:
        try:
            KeyStore.at(self.desk.paths).revoke(name)
        except Exception as exc:
            self.report(getattr(exc, "message", str(exc)))
        self.refresh_keys()

    # ---- log --------------------------------------------------------------------------------------
    def _log(self, d: dict[str, Any]) -> None:
        self.log.insertRow(0)
        cells = [
            time.strftime("%H:%M:%S"),
            str(d.get("client") or "local"),
            str(d.get("model") or "-"),
            str(d.get("route") or d.get("path") or "-"),
            str(d.get("status")),
            f"{float(d.get('seconds') or 0) * 1000:.0f} ms",
        ]
        for j, c in enumerate(cells):
            self.log.setItem(0, j, QTableWidgetItem(c))
        if self.log.rowCount() > LOG_ROWS:
            self.log.removeRow(self.log.rowCount() - 1)


def _snippets(url: str, model: str, *, limits: ModelLimits) -> str:
    ctx, out, tools = limits.context, limits.max_output, limits.tools
    caps = "\n    capabilities: [tool_use]" if tools else ""
    flag = "true" if tools else "false"
    return f"""# Python, openai client
from openai import OpenAI

client = OpenAI(base_url="{url}", api_key="local")  # a key from the API keys tab if one is required
reply = client.chat.completions.create(model="{model}", messages=[{{"role": "user", "content": "Hello"}}])
print(reply.choices[0].message.content)

# curl
curl {url}/chat/completions -H 'Content-Type: application/json' \\
  -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello"}}]}}'

# editors: an "OpenAI-compatible" provider with base URL {url} and model {model};
# {ctx} tokens per request, answers capped at {out} tokens unless a request asks otherwise
# Continue (~/.continue/config.yaml):
models:
  - name: {model} (Switchyard)
    provider: openai
    model: {model}
    apiBase: {url}
    apiKey: local   # or a key from the API keys tab
    defaultCompletionOptions: {{contextLength: {ctx}, maxTokens: {out}}}{caps}

# Zed (settings.json):
"language_models": {{"openai_compatible": {{"Switchyard": {{"api_url": "{url}",
  "available_models": [{{"name": "{model}", "max_output_tokens": {out},
    "capabilities": {{"tools": {flag}, "images": false, "parallel_tool_calls": false}},
    "max_tokens": {ctx}}}]}}}}}}

# VS Code (Chat: Open Language Models (JSON)):
[{{"name": "Switchyard", "vendor": "customoai", "apiKey": "local",
  "models": [{{"id": "{model}", "name": "{model}", "url": "{url}/chat/completions",
    "toolCalling": {flag}, "vision": false, "maxInputTokens": {ctx - out}, "maxOutputTokens": {out}}}]}}]
"""


def _tls_note(cert: str, fingerprint: str) -> str:
    return f"""# HTTPS with the certificate {cert}
# SHA-256 fingerprint {fingerprint}
# copy the certificate to the client and trust it there, e.g. for the openai client:
#   import httpx, ssl
#   client = OpenAI(..., http_client=httpx.Client(verify=ssl.create_default_context(cafile="cert.pem")))
#   curl --cacert cert.pem ...

"""


def _saved_host(desk: Desk) -> str | None:
    """The host settings.json holds now (the LAN box's saved choice), or None where it sets none."""
    import json

    try:
        raw = json.loads(desk.paths.settings_file.read_text())
    except (OSError, ValueError):
        return None
    host = raw.get("host") if isinstance(raw, dict) else None
    return host if isinstance(host, str) else None


def lan_addresses() -> list[str]:
    """This machine's IPv4 addresses another computer on the network could dial (not loopback)."""
    return sorted(a for a in auth.own_addresses() if "." in a and not a.startswith("127.") and ":" not in a)


def _save_setting(path: Any, key: str, value: Any) -> None:
    """Change one key of settings.json, keeping every other key; a malformed file is left untouched."""
    from app.core.settings_file import set_settings

    set_settings(path, {key: value})  # under the file's lock, into the file as it is now (STORES, issue 21)
