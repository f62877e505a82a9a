"""What this machine lets models take: the memory a split share or a placement is measured against.

RAM available now (so it already reflects loaded engines) less `memory_reserve_mib`, at most
`ram_budget_mib` where the user capped what models may use. The fit's own budget (plan.Budget) keeps an
automatic reserve for the system; this one is the user's word on top of it.
"""

from __future__ import annotations

from typing import Any

from app.core.settings import Settings
from app.hardware.model import Hardware

MIB = 1 << 20


def lend_budget(settings: Settings, hardware: Hardware) -> int:
    available = int(hardware.memory.available or 0)
    room = max(0, available - settings.memory.memory_reserve_mib * MIB)
    cap = settings.memory.ram_budget_mib
    return min(room, cap * MIB) if cap else room


def host_need(fit: Any) -> int:
    """The host memory (device "CPU") of a plan's chosen placement, from its public form; 0 when none."""
    if not isinstance(fit, dict):
        return 0
    chosen = fit.get("chosen") or {}
    return sum(int(d.get("total") or 0) for d in chosen.get("devices") or [] if d.get("device") == "CPU")


def beyond(fit: Any, lends: int) -> bool:
    """Whether a plan (its public form) does not fit this machine: refused, or its host memory beyond
    what the machine lends models."""
    if not isinstance(fit, dict):
        return False
    return not fit.get("fits", True) or host_need(fit) > lends
