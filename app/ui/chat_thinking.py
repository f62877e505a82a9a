"""The Chat page's thinking: a toggle per conversation, and a reply's reasoning folded above its answer.

The toggle is kept in the conversation's sampling as `reasoning_effort` ("medium" on, "none" off), which
the gateway turns into the chat template's thinking switch (app/server/surfaces/thinking.py); a
conversation that never touched it leaves the template's default. The reasoning a reply streamed is kept
in its message's meta (never sent back to the model), and shown folded: a link opens and closes it.
"""

from __future__ import annotations

import html
from typing import Any

from PySide6.QtWidgets import QCheckBox

EFFORT_KEY = "reasoning_effort"
ON, OFF = "medium", "none"
SCHEME = "think"  # the fold's link: think:MESSAGE_ID
TIP = "Let a thinking model reason before it answers; the reasoning is shown folded above the reply."


class ThinkingToggle(QCheckBox):
    """Thinking on or off for the open conversation (on, the template's default, until it is changed)."""

    def __init__(self) -> None:
        super().__init__("Thinking")
        self.setToolTip(TIP)
        self.setChecked(True)

    def show_model(self, model_id: str | None, *, has_switch: bool | None) -> None:
        """Off, with the reason, for a model whose chat template has no thinking switch (the box would do
        nothing); on where it has one or where no template was read (the engine's own may have one)."""
        self.setEnabled(has_switch is not False)
        if has_switch is False:
            self.setToolTip(
                f"{model_id}'s chat template has no thinking switch: it answers the same either way. Pick a "
                "thinking model (Qwen3, gpt-oss, DeepSeek-R1...) to use this."
            )
        else:
            self.setToolTip(TIP)

    def show_sampling(self, sampling: dict[str, Any]) -> None:
        """Show a conversation's setting (without counting as a change)."""
        self.blockSignals(True)
        self.setChecked(sampling.get(EFFORT_KEY) != OFF)
        self.blockSignals(False)

    def into(self, sampling: dict[str, Any]) -> dict[str, Any]:
        """`sampling` with this toggle's effort (written once the user flips it)."""
        return {**sampling, EFFORT_KEY: ON if self.isChecked() else OFF}


def folded(message_id: int, reasoning: str, *, unfolded: bool, live: bool) -> str:
    """Markdown for a reply's reasoning above its answer: one link line while folded, the text quoted under
    it while open. Empty when the reply has none."""
    if not reasoning.strip():
        return ""
    words = len(reasoning.split())
    what = "Thinking…" if live else f"Thought ({words} words)"
    link = f"[{'▾' if unfolded else '▸'} {what}]({SCHEME}:{message_id})"
    if not unfolded:
        return f"{link}\n\n"
    quoted = "\n".join(f"> {html.escape(line)}" if line.strip() else ">" for line in reasoning.splitlines())
    return f"{link}\n\n{quoted}\n\n"
