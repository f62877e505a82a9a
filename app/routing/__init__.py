"""Routing: which lane (upstream engine) runs a model on this machine, with the reasons and every rejection.

Pure functions over the model's format, the hardware, the installed engines, the pins and the memory model's
verdicts: `decide` for the decision, `check_pin` for refusing a pin up front.
"""

from app.routing.decide import FitFn, check_pin, decide
from app.routing.engines import LANES
from app.routing.model import Decision, FitCheck, LaneInstall, Rejection, RejectionKind

__all__ = [
    "LANES",
    "Decision",
    "FitCheck",
    "FitFn",
    "LaneInstall",
    "Rejection",
    "RejectionKind",
    "check_pin",
    "decide",
]
