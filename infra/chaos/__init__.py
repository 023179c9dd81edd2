"""Chaos on the local stack: the soak behind ``durafix chaos`` and ``make soak``.

:mod:`infra.chaos.soak` drives the runs and the faults, :mod:`infra.chaos.faults` injects them (worker and
Temporal server kills), :mod:`infra.chaos.audit` reads what the runs left on the forge, in their histories and
on the disk, :mod:`infra.chaos.report` prints it.
"""

from infra.chaos.report import as_json, render
from infra.chaos.soak import Soak, SoakPlan, SoakResult, StateDirInUse, soak_policy

__all__ = ["Soak", "SoakPlan", "SoakResult", "StateDirInUse", "as_json", "render", "soak_policy"]
