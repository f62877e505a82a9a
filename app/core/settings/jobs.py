"""Background work and guards: update checks, standing gates and webhooks (jobs), safety judges (safety)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.core.errors import SettingsError
from app.core.policy import parse_policy  # pure: it imports only the error tree


@dataclass(frozen=True)
class JobSettings:
    """docs/jobs.md: hours between update checks of pulled models (0: off), the standing update gates
    (docs/evals.md#update-gates: model id -> {"suite", "min_score"}), and the webhooks told of job ends,
    failed gates, refusals and engine crashes ({"webhooks": [...], "refusals_per_hour": N})."""

    update_check_h: float = 6.0
    gates: dict[str, dict[str, Any]] = field(default_factory=dict)
    notify: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.update_check_h < 0:
            raise SettingsError("update_check_h must be a number of hours, 0 or more (0: off)")


@dataclass(frozen=True)
class SafetySettings:
    # safety judges (docs/safety.md): which requests and answers guard models judge; {} is off
    policy: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        parse_policy(self.policy)  # SettingsError naming the policy key at fault
