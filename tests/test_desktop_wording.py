"""The window's wording of the core's messages (issue 20, defects 8 and 12): buttons, not commands; sizes,
not byte counts; no Python class names."""

from __future__ import annotations

from app.core.secrets import Secret
from app.core.vault import keyring_put
from app.hub.errors import LOGIN_HINT
from app.routing.engines import install_hint
from app.server.auth import CREATE_HINT
from app.ui.wording import for_window


def test_commands_become_the_windows_buttons() -> None:
    assert "switchyard" not in for_window(f"the repository is gated: {LOGIN_HINT}")
    assert "Settings page" in for_window(LOGIN_HINT)
    assert for_window(CREATE_HINT) == "create one on the Server page (API keys tab, Create key)"
    hint = for_window(install_hint("mlx"))
    assert "Lanes page and press Install" in hint and "switchyard engine" not in hint
    msg = "ollama can run it too; `switchyard pin acme/m:Q4_0 mistral.rs` to use mistral.rs instead."
    assert "choose mistral.rs under Lane on the Library page" in for_window(msg)
    corrupt = "x is corrupt: expected sha256 a, got b. The bad bytes were deleted; retry the pull"
    assert for_window(corrupt).endswith("press Resume in the Downloads list")


def test_sizes_and_no_class_names() -> None:
    full = "the disk is full: m.gguf stopped at 1048576 of 4294967296 bytes. Free some space"
    assert "1.0 MiB of 4.00 GiB" in for_window(full) and "bytes" not in for_window(full)
    problem = keyring_put("test-user", Secret("value"))  # the tests' keyring backend is the failing one
    assert problem is not None and "keyring.backends" in problem
    assert "keyring.backends" not in for_window(problem) and "password store" in for_window(problem)
