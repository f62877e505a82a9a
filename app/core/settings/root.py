"""`Settings`: one frozen value of small frozen areas, each checking its own keys as it is made.

settings.json stays flat: every key of the file names exactly one field of one area, under the same name
(`port` is `settings.server.port`). Code reads through the areas; the flat names are for the file, the
admin API and the command line (`value`, `keys`, `public`), and for building one in a line (`flat`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app.core.settings.jobs import JobSettings, SafetySettings
from app.core.settings.kinds import CudaSettings, LlamaCppSettings, MlxSettings, SdSettings
from app.core.settings.lanes import EngineSettings, MemorySettings, ModelSettings
from app.core.settings.library import DownloadSettings, HubSettings, LibrarySettings
from app.core.settings.server import ImageSettings, LimitSettings, SecuritySettings, ServerSettings


@dataclass(frozen=True)
class Settings:
    # the areas' order is the flat keys' order (public(), changed_keys): close to the one list it replaced
    server: ServerSettings = field(default_factory=ServerSettings)
    library: LibrarySettings = field(default_factory=LibrarySettings)
    memory: MemorySettings = field(default_factory=MemorySettings)
    models: ModelSettings = field(default_factory=ModelSettings)
    llamacpp: LlamaCppSettings = field(default_factory=LlamaCppSettings)
    engines: EngineSettings = field(default_factory=EngineSettings)
    limits: LimitSettings = field(default_factory=LimitSettings)
    images: ImageSettings = field(default_factory=ImageSettings)
    jobs: JobSettings = field(default_factory=JobSettings)
    safety: SafetySettings = field(default_factory=SafetySettings)
    security: SecuritySettings = field(default_factory=SecuritySettings)
    hub: HubSettings = field(default_factory=HubSettings)
    downloads: DownloadSettings = field(default_factory=DownloadSettings)
    cuda: CudaSettings = field(default_factory=CudaSettings)
    mlx: MlxSettings = field(default_factory=MlxSettings)
    sdcpp: SdSettings = field(default_factory=SdSettings)

    @classmethod
    def flat(cls, **values: Any) -> Settings:
        """Settings from flat keys as settings.json spells them (the rest default): `flat(port=0)`."""
        return cls().replace(**values)

    @classmethod
    def areas(cls) -> tuple[str, ...]:
        """The area names, in declaration order."""
        return _AREAS

    def area(self, name: str) -> Any:
        """One area by its name (for code that walks the areas; code that knows one reads it directly)."""
        if name not in _AREAS:
            raise TypeError(f"Settings has no area {name!r}; areas: {', '.join(_AREAS)}")
        return getattr(self, name)

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """Every flat key, area by area in declaration order."""
        return tuple(_AREA_OF)

    @classmethod
    def fields(cls) -> tuple[dataclasses.Field[Any], ...]:
        """Every flat key's dataclass field (its name, default), in `keys()` order."""
        return tuple(_FIELD_OF.values())

    @classmethod
    def area_of(cls, key: str) -> str:
        """The area holding flat key `key` (TypeError for a key that is none)."""
        area = _AREA_OF.get(key)
        if area is None:
            raise TypeError(f"Settings has no key {key!r}; known: {', '.join(sorted(_AREA_OF))}")
        return area

    @classmethod
    def area_keys(cls, area: str) -> tuple[str, ...]:
        """The flat keys of one area, in declaration order."""
        return tuple(k for k, a in _AREA_OF.items() if a == area)

    def value(self, key: str) -> Any:
        """One setting by its flat name (for code that takes key names from outside: the API, the CLI)."""
        return getattr(self.area(self.area_of(key)), key)

    def replace(self, **values: Any) -> Settings:
        """A copy with these flat keys set exactly (None included); each touched area checks itself."""
        by_area: dict[str, dict[str, Any]] = {}
        for key, v in values.items():
            by_area.setdefault(self.area_of(key), {})[key] = v
        areas = {a: dataclasses.replace(getattr(self, a), **kv) for a, kv in by_area.items()}
        return dataclasses.replace(self, **areas)

    def with_changes(self, **changes: Any) -> Settings:
        """`replace` for the keys given a value: None means "keep" (command-line flags not passed)."""
        return self.replace(**{k: v for k, v in changes.items() if v is not None})

    def ttl_for(self, model_id: str) -> float:
        return float(self.models.model_overrides.get(model_id, {}).get("ttl_s", self.memory.idle_ttl_s))

    def override(self, model_id: str, key: str, default: Any) -> Any:
        return self.models.model_overrides.get(model_id, {}).get(key, default)

    def public(self) -> dict[str, Any]:
        """The flat settings as JSON values (settings.json's shape)."""
        out: dict[str, Any] = {}
        for area in _AREAS:
            out.update(dataclasses.asdict(getattr(self, area)))
        out["models_dirs"] = [str(p) for p in self.library.models_dirs]
        out["shared_model_dirs"] = [str(p) for p in self.library.shared_model_dirs]
        return out

    if not TYPE_CHECKING:  # mypy keeps reporting flat reads, so each is moved to its area, not kept

        def __getattr__(self, name: str) -> Any:
            area = _AREA_OF.get(name)
            if area is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            raise AttributeError(f"Settings.{name} is read through its area: settings.{area}.{name}")


_DEFAULTS = Settings()
_AREAS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Settings))
_FIELD_OF: dict[str, dataclasses.Field[Any]] = {
    f.name: f for area in _AREAS for f in dataclasses.fields(getattr(_DEFAULTS, area))
}
_AREA_OF: dict[str, str] = {
    f.name: area for area in _AREAS for f in dataclasses.fields(getattr(_DEFAULTS, area))
}
