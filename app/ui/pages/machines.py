"""Machines: the paired peers (docs/peers.md), each with its own hardware, its models and its health, and
pairing from the window: invite another machine with a one-time code, or redeem one it shows. *Find
machines nearby* lists those announcing themselves on mDNS (app/lanes/peers/nearby.py); picking one fills
its address and pins the fingerprint it announced, so pairing fails if another certificate answers there.

The peers belong to the window's server (app/lanes/peers/registry.py, set up with it); pairing needs that
server to serve HTTPS, which the Server page's network switch (or a certificate in the settings) turns on.
"""

from __future__ import annotations

import html
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPushButton,
    QTableWidgetItem,
)

from app.core.errors import SwitchyardError
from app.core.events import EventKind
from app.lanes.peers import nearby
from app.lanes.peers.registry import PeerRegistry
from app.ui import fmt
from app.ui.pages import Page, table

if TYPE_CHECKING:
    from app.ui.context import Desk

COLUMNS = ["Machine", "Address", "State", "Memory", "Models", "Checked"]
FOLLOWS = (EventKind.REMOTE_STATE, EventKind.REMOTE_REMOVED, EventKind.SERVER_STATE)
CODE_HINT = "The code it shows, e.g. ABCDE-FGHJK"


class MachinesPage(Page):
    title = "Machines"
    hint = (
        "Other computers paired with this one: their models are listed and answered here as MACHINE/MODEL, "
        "each on its own memory."
    )

    def __init__(self, desk: Desk) -> None:
        super().__init__(desk)
        self.here = QLabel()
        self.here.setWordWrap(True)
        self.here.setTextFormat(Qt.TextFormat.RichText)
        self.root.addWidget(self.here)

        invite_row = QHBoxLayout()
        self.invite_btn = QPushButton("Invite a machine")
        self.invite_btn.setToolTip("Show a one-time code (10 minutes, one use) to type on the other machine")
        self.invite_btn.clicked.connect(self.invite)
        invite_row.addWidget(self.invite_btn)
        self.code = QLabel()
        self.code.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.code.setWordWrap(True)
        invite_row.addWidget(self.code, 1)
        self.root.addLayout(invite_row)

        pair_row = QHBoxLayout()
        self.address = QLineEdit()
        self.address.setPlaceholderText("Its address, e.g. 192.168.1.20:8686")
        self.address.setAccessibleName("Address of the machine to pair with")
        self.pair_code = QLineEdit()
        self.pair_code.setPlaceholderText(CODE_HINT)
        self.pair_code.setAccessibleName("Pairing code the other machine shows")
        self.name = QLineEdit()
        self.name.setPlaceholderText("A name for it (optional)")
        self.name.setAccessibleName("Name for the paired machine")
        self.pair_btn = QPushButton("Pair")
        self.pair_btn.clicked.connect(self.pair)
        for w, stretch in ((self.address, 2), (self.pair_code, 2), (self.name, 1), (self.pair_btn, 0)):
            pair_row.addWidget(w, stretch)
        self.root.addLayout(pair_row)

        near_row = QHBoxLayout()
        self.find_btn = QPushButton("Find machines nearby")
        self.find_btn.setToolTip(
            "Listen a few seconds for machines announcing Switchyard on the local network (a hint: pairing "
            "still needs the code they show)"
        )
        self.find_btn.clicked.connect(self.find_nearby)
        near_row.addWidget(self.find_btn, 0, Qt.AlignmentFlag.AlignTop)
        self.nearby_list = QListWidget()
        self.nearby_list.setAccessibleName("Machines nearby")
        self.nearby_list.setMaximumHeight(self.fontMetrics().height() * 5)
        self.nearby_list.itemClicked.connect(self.pick_nearby)
        self.nearby_list.hide()
        near_row.addWidget(self.nearby_list, 1)
        self.root.addLayout(near_row)
        self._announced: tuple[str, str] | None = None  # (address, fingerprint) picked from the list
        self.root.addWidget(self.status)

        self.table = table(COLUMNS, stretch=4, wrap=True)
        self.table.itemSelectionChanged.connect(self._buttons)
        self.root.addWidget(self.table, 1)
        actions = QHBoxLayout()
        actions.addStretch(1)
        self.check_btn = QPushButton("Check now")
        self.check_btn.clicked.connect(self.check)
        self.remove_btn = QPushButton("Unpair")
        self.remove_btn.clicked.connect(self.remove)
        actions.addWidget(self.check_btn)
        actions.addWidget(self.remove_btn)
        self.root.addLayout(actions)
        desk.bridge.received.connect(self._on_event)
        self.refresh()

    # ---- reading ---------------------------------------------------------------------------------------
    def peers(self) -> PeerRegistry:
        return self.desk.server.peers

    def showEvent(self, event: Any) -> None:
        super().showEvent(event)
        self.refresh()

    def _on_event(self, kind: str, _data: Any) -> None:
        if kind in FOLLOWS and self.isVisible():
            self.refresh()

    def refresh(self) -> None:
        doc = self.peers().public()
        pairing = doc["pairing"]
        if doc["fingerprint"]:
            addresses = ", ".join(self.peers().addresses())
            self.here.setText(
                f"This machine is reached at <b>{html.escape(addresses)}</b>; its certificate's fingerprint "
                f"is <tt>{html.escape(doc['fingerprint'][:29])}…</tt>"
                + (
                    " <b>Pairing is locked for a while after wrong codes.</b>"
                    if pairing.get("locked")
                    else ""
                )
            )
        else:
            self.here.setText(
                "Pairing needs this window's server to serve HTTPS: on the Server page tick <i>Allow access "
                "from the local network</i> and press Start (or name a certificate in the settings)."
            )
        for btn in (self.invite_btn, self.pair_btn, self.find_btn):
            btn.setEnabled(bool(doc["fingerprint"]))
        selected = self.selected()
        self.table.setRowCount(0)
        for peer in doc["peers"]:
            row = self.table.rowCount()
            self.table.insertRow(row)
            for col, text in enumerate(self._cells(peer)):
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                if col == 0:
                    item.setData(Qt.ItemDataRole.UserRole, peer["name"])
                self.table.setItem(row, col, item)
            if peer["name"] == selected:
                self.table.selectRow(row)
        self.table.resizeRowsToContents()
        self._buttons()

    def _cells(self, peer: dict[str, Any]) -> list[str]:
        hw = peer.get("hardware") or {}
        memory = hw.get("memory") or {}
        total, free = memory.get("total"), memory.get("available")
        mem = "-" if total is None else f"{fmt.size(total)}" + (f" ({fmt.size(free)} free)" if free else "")
        models = [m["id"] if isinstance(m, dict) else str(m) for m in peer.get("models") or []]
        state = str(peer.get("state") or "?")
        if peer.get("error"):
            state = f"{state}: {peer['error']}"
        checked = peer.get("checked_at")
        ago = f"{max(0, int(time.time() - checked))} s ago" if isinstance(checked, int | float) else "-"
        return [
            peer["name"],
            urlsplit(peer["url"]).netloc,
            state,
            mem,
            f"{len(models)}: {', '.join(models)}" if models else "none",
            ago,
        ]

    def selected(self) -> str | None:
        rows = self.table.selectionModel().selectedRows()
        item = self.table.item(rows[0].row(), 0) if rows else None
        return str(item.data(Qt.ItemDataRole.UserRole)) if item is not None else None

    def _buttons(self) -> None:
        name = self.selected()
        for btn, verb in ((self.check_btn, "Check"), (self.remove_btn, "Unpair")):
            btn.setEnabled(name is not None)
            btn.setToolTip(f"{verb} {name}" if name else "Select a machine first")

    # ---- acting ----------------------------------------------------------------------------------------
    def invite(self) -> None:
        self.clear_report()
        try:
            doc = self.peers().invite()
        except SwitchyardError as exc:
            self.report(exc.message)
            return
        minutes = max(1, int(doc["expires_in_s"]) // 60)
        self.code.setText(
            f"<b style='font-size:150%'>{html.escape(doc['code'])}</b> · on the other machine, pair with "
            f"{html.escape(', '.join(doc['addresses']))} and this code (valid {minutes} minutes, once)"
        )

    def pair(self) -> None:
        address, code = self.address.text().strip(), self.pair_code.text().strip()
        if not address or not code:
            self.report("Type the other machine's address and the code it shows, then press Pair.")
            return
        name = self.name.text().strip() or None
        # the fingerprint picked with the address, unless the address was edited since
        fingerprint = self._announced[1] if self._announced and self._announced[0] == address else None

        async def go() -> None:
            self.clear_report()
            spec, _remote = await self.peers().pair(address, code, name=name, fingerprint=fingerprint)
            self.pair_code.clear()
            self.pair_code.setPlaceholderText(CODE_HINT)
            self._announced = None
            self.refresh()
            self.desk.notify("Paired", f"{spec.name}'s models now show here as {spec.name}/MODEL")

        self.desk.spawn(go(), disable=[self.pair_btn], report=self.report)

    def find_nearby(self) -> None:
        async def go() -> None:
            self.clear_report()
            try:
                machines = await nearby.around(self.peers())
            except OSError as exc:
                self.report(f"Cannot listen for machines nearby here ({exc}); type the other one's address.")
                return
            self.nearby_list.clear()
            for m in machines:
                state = f"paired as {m['paired']}" if m["paired"] else "not paired: pick it, type its code"
                item = QListWidgetItem(f"{m['machine']}  ·  {m['address']}  ·  {state}")
                item.setToolTip(f"Announced certificate fingerprint {m['fingerprint']}")
                item.setData(Qt.ItemDataRole.UserRole, m)
                self.nearby_list.addItem(item)
            self.nearby_list.setVisible(bool(machines))
            if not machines:
                self.report(
                    "No machine announced itself nearby. On the other machine press Invite a machine, then "
                    "type the address it shows here."
                )

        self.desk.spawn(go(), disable=[self.find_btn], report=self.report)

    def pick_nearby(self, item: QListWidgetItem) -> None:
        """Fill the pairing fields from an announcement; the code still has to come from that machine."""
        m = item.data(Qt.ItemDataRole.UserRole)
        if not isinstance(m, dict) or m.get("paired"):
            return
        self.address.setText(m["address"])
        self._announced = (m["address"], m["fingerprint"])
        # anyone can announce any name: the fingerprint its Invite shows is what tells the machines apart
        self.pair_code.setPlaceholderText(
            f"The code {m['machine']} shows (check it shows the fingerprint {m['fingerprint'][:11]}…)"
        )
        self.pair_code.setFocus()

    def check(self) -> None:
        name = self.selected()
        if name is None:
            return

        async def go() -> None:
            await self.peers().check(name)
            self.refresh()

        self.desk.spawn(go(), disable=[self.check_btn], report=self.report)

    def remove(self) -> None:
        name = self.selected()
        if name is None:
            return
        asked = QMessageBox.question(
            self,
            "Unpair",
            f"Unpair {name}? Its models leave this machine's list, and it is asked to forget this one too.",
        )
        if asked != QMessageBox.StandardButton.Yes:
            return

        async def go() -> None:
            await self.peers().remove(name)
            self.refresh()

        self.desk.spawn(go(), disable=[self.remove_btn], report=self.report)
