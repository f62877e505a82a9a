"""Where Switchyard writes. `SWITCHYARD_HOME` overrides the platform directory for everything."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from app.core.platform.home import data_home


@dataclass(frozen=True)
class Paths:
    home: Path

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Paths:
        env = dict(os.environ) if env is None else env
        override = env.get("SWITCHYARD_HOME")
        return cls(home=Path(override).expanduser().resolve() if override else data_home(env))

    @property
    def models(self) -> Path:
        return self.home / "models"

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    @property
    def lane_logs(self) -> Path:
        return self.logs / "lanes"

    @property
    def settings_file(self) -> Path:
        return self.home / "settings.json"

    @property
    def pins_file(self) -> Path:
        return self.home / "pins.json"

    @property
    def footprints_file(self) -> Path:
        return self.home / "footprints.json"

    @property
    def library_db(self) -> Path:
        """The SQLite catalog (app/library/db.py)."""
        return self.home / "library.db"

    @property
    def evals_db(self) -> Path:
        """Eval runs and their cases (app/quality/store.py)."""
        return self.home / "evals.db"

    @property
    def suites(self) -> Path:
        """The one folder the server reads eval suite files from (docs/evals.md#where-suites-live)."""
        return self.home / "suites"

    @property
    def imported(self) -> Path:
        """Where `switchyard import` copies models (inside the models folder)."""
        return self.models / "imported"

    @property
    def engines(self) -> Path:
        """Engines in environments of their own, one folder per lane (app/lanes/install/store.py)."""
        return self.home / "engines"

    @property
    def hardware_cache(self) -> Path:
        return self.home / "hardware.json"

    @property
    def server_file(self) -> Path:
        """Written by a running `serve` so `switchyard ps` can find it."""
        return self.home / "server.json"

    def ensure(self) -> None:
        for p in (self.home, self.models, self.lane_logs):
            p.mkdir(parents=True, exist_ok=True)
