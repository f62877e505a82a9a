"""Settings: defaults, then `settings.json` in SWITCHYARD_HOME, then command-line overrides.

`Settings` is a frozen value of small frozen areas (server.py, library.py, lanes.py, kinds.py, jobs.py),
each with its checks beside it; loader.py reads the flat file into it (root.py says how flat keys map).
"""

from app.core.settings.jobs import JobSettings, SafetySettings
from app.core.settings.kinds import (
    KIND_AREAS,
    RUNTIME_ORDER,
    RUNTIMES,
    CudaSettings,
    LlamaCppSettings,
    MlxSettings,
    SdSettings,
)
from app.core.settings.lanes import (
    FLASH_ATTN,
    KV_TYPES,
    LOAD_KEYS,
    NOT_WIRED_KEYS,
    OVERRIDE_KEYS,
    EngineSettings,
    MemorySettings,
    ModelSettings,
    check_overrides,
)
from app.core.settings.library import APP_STORES, DownloadSettings, HubSettings, LibrarySettings
from app.core.settings.loader import load_settings, settings_document, settings_from_mapping
from app.core.settings.root import Settings
from app.core.settings.server import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    ImageSettings,
    LimitSettings,
    SecuritySettings,
    ServerSettings,
)

__all__ = [
    "APP_STORES",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "FLASH_ATTN",
    "KIND_AREAS",
    "KV_TYPES",
    "LOAD_KEYS",
    "NOT_WIRED_KEYS",
    "OVERRIDE_KEYS",
    "RUNTIMES",
    "RUNTIME_ORDER",
    "CudaSettings",
    "DownloadSettings",
    "EngineSettings",
    "HubSettings",
    "ImageSettings",
    "JobSettings",
    "LibrarySettings",
    "LimitSettings",
    "LlamaCppSettings",
    "MemorySettings",
    "MlxSettings",
    "ModelSettings",
    "SafetySettings",
    "SdSettings",
    "SecuritySettings",
    "ServerSettings",
    "Settings",
    "check_overrides",
    "load_settings",
    "settings_document",
    "settings_from_mapping",
]
