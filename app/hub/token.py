"""The Hugging Face token: where it comes from, and where `switchyard hub login` keeps it.

Precedence when reading, first found wins:
  1. HF_TOKEN in the environment (set by the user or a CI; never stored by us),
  2. the system keyring (service "switchyard", user "hf_token"),
  3. a token kept for this process only (set where no keyring exists and the file was not opted into),
  4. the 0600 file SWITCHYARD_HOME/hf_token, written only on opt-in (setting `hf_token_file` or
     `switchyard hub login --file`); a file other users can read is ignored and reported.

Tokens are `Secret`s: masked in repr and str, never logged, never put in an error or API answer.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from app.core.errors import HubTokenError
from app.core.paths import Paths
from app.core.settings import Settings
from app.core.vault import SERVICE, Secret, SessionVault

USER = "hf_token"
FILE_NAME = "hf_token"
SOURCES = ("env", "keyring", "session", "file")


@dataclass(frozen=True)
class TokenFound:
    token: Secret | None
    source: str | None  # one of SOURCES, None when there is no token
    problems: tuple[str, ...] = ()  # sources that exist but could not be used, and why

    def public(self) -> dict[str, object]:
        return {"set": self.token is not None, "source": self.source, "problems": list(self.problems)}


@dataclass(frozen=True)
class Stored:
    where: str  # "keyring", "file" or "session"
    note: str  # a sentence for the user
    persistent: bool


def check_token(value: str) -> Secret:
    token = value.strip()
    if not token:
        raise HubTokenError("the token is empty; paste a token from https://huggingface.co/settings/tokens")
    if any(c.isspace() for c in token) or not token.isprintable():
        raise HubTokenError("the token contains spaces or control characters; paste only the token itself")
    return Secret(token)


class TokenStore:
    """The token sources of one SWITCHYARD_HOME; one per process (it holds the session-only token)."""

    def __init__(self, paths: Paths, settings: Settings, *, env: Mapping[str, str] | None = None) -> None:
        self.paths = paths
        self.settings = settings
        self._env = env
        self.vault = SessionVault()  # keyring, then this process's memory

    @property
    def file(self) -> Path:
        return self.paths.home / FILE_NAME

    def _environ(self) -> Mapping[str, str]:
        return os.environ if self._env is None else self._env

    # ---- reading -------------------------------------------------------------------------------------
    def find(self) -> TokenFound:
        problems: list[str] = []
        env = self._environ().get("HF_TOKEN", "").strip()
        if env:
            return TokenFound(Secret(env), "env")
        value, where, problem = self.vault.find(USER)
        if problem:
            problems.append(problem)
        if value is not None:
            return TokenFound(value, where, tuple(problems))
        from_file, problem = self._file_get()
        if problem:
            problems.append(problem)
        if from_file is not None:
            return TokenFound(from_file, "file", tuple(problems))
        return TokenFound(None, None, tuple(problems))

    def get(self) -> Secret | None:
        return self.find().token

    def _file_get(self) -> tuple[Secret | None, str | None]:
        try:
            st = self.file.stat()
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            return None, f"{self.file} cannot be read ({exc.strerror or exc})"
        if os.name == "posix" and stat.S_IMODE(st.st_mode) & 0o077:
            return None, (
                f"{self.file} is readable by other users (mode {stat.S_IMODE(st.st_mode):o}), "
                "so it is ignored; "
                f"run `chmod 600 {self.file}` or log in again with `switchyard hub login --file`"
            )
        try:
            text = self.file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            return None, f"{self.file} cannot be read ({type(exc).__name__}); log in again"
        return (Secret(text), None) if text else (None, None)

    # ---- changing ------------------------------------------------------------------------------------
    def set(self, token: Secret, *, to_file: bool = False) -> Stored:
        """Keep `token`: in the keyring; where none exists, in the file if opted into, else this process."""
        opted = to_file or self.settings.hub.hf_token_file
        kept = self.vault.put(USER, token, session=not opted)  # with the file opted into, no memory copy
        problem = kept.problem
        if problem is None:
            return Stored(
                "keyring", f"stored in the system keyring (service {SERVICE!r}, user {USER!r})", True
            )
        if opted:
            self._write_file(token)
            return Stored(
                "file",
                f"{problem}, so it was written to {self.file} (mode 0600, readable only by you)",
                True,
            )
        return Stored(
            "session",
            f"{problem}, so the token is kept for this process only and is gone when it ends. To keep it, "
            f"log in with `switchyard hub login --file` (a 0600 file at {self.file}; or the setting "
            "hf_token_file), or set HF_TOKEN in the environment",
            False,
        )

    def clear(self) -> list[str]:
        """Remove the stored token from every place we keep one; the places it was removed from."""
        removed = self.vault.forget(USER)
        try:
            self.file.unlink()
            removed.append("file")
        except FileNotFoundError:
            pass
        return removed

    def _write_file(self, token: Secret) -> None:
        self.file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.file.with_name(f".{FILE_NAME}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                os.chmod(tmp, 0o600)  # O_CREAT's mode does not apply to a leftover file
                f.write(token.reveal() + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.file)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise HubTokenError(
                f"cannot write {self.file} ({exc.strerror or exc}); check the folder"
            ) from None
