"""Which engines are installed here, at what version, and which of them Switchyard can drive today."""

from __future__ import annotations

import shutil

from app.core.settings import Settings
from app.hardware.model import Hardware
from app.lanes.engines.kind import module_install
from app.lanes.engines.registry import engine_kinds
from app.routing import LANES, LaneInstall

# engines that are known to routing but have no lane module yet: how to see whether one is installed
_PLANNED: dict[str, tuple[str, str] | str] = {}


def installed_lanes(settings: Settings) -> dict[str, LaneInstall]:
    kinds = engine_kinds()
    out: dict[str, LaneInstall] = {}
    for lane in LANES:
        if lane in kinds:
            out[lane] = kinds[lane].install(settings)
            continue
        probe = _PLANNED.get(lane)
        found: str | None = None
        if isinstance(probe, tuple):
            got = module_install(lane, probe[0], probe[1], hint="")
            found = got.version if got.installed else None
        elif probe is not None and (path := shutil.which(probe)):
            found = f"{probe} at {path}"
        note = (
            f"{found} is installed, but Switchyard has no {lane} lane yet"
            if found
            else f"Switchyard has no {lane} lane yet; it is planned"
        )
        out[lane] = LaneInstall(lane, False, found, note=note)
    return out


def lane_report(settings: Settings, hardware: Hardware | None) -> list[dict[str, object]]:
    """Every lane for `switchyard doctor`: installed, version, can it start here and why not."""
    kinds = engine_kinds()
    rows: list[dict[str, object]] = []
    for lane, install in installed_lanes(settings).items():
        kind = kinds.get(lane)
        refusal = (
            kind.start_refusal(settings, hardware)
            if kind is not None
            else install.note or f"Switchyard has no {lane} lane yet"
        )
        rows.append(
            {
                "lane": lane,
                "installed": install.installed,
                "version": install.version,
                "note": install.note,
                "has_lane": kind is not None,
                "can_start": refusal is None,
                "why_not": refusal,
                "capabilities": sorted(kind.offers) if kind else [],
                "formats": sorted(kind.formats) if kind else [],
                "memory": kind.memory if kind else None,
            }
        )
    return rows
