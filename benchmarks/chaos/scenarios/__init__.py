"""The registry of chaos scenarios: ``SCENARIOS[n](settings) -> ScenarioResult``.

Each scenario module has ``NAME`` and ``run(settings)``; entries import their module
on first call, so a scenario being written does not break the others.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from benchmarks.chaos.harness import ChaosSettings, ScenarioResult

__all__ = ["FIXED_STRATEGY", "NAMES", "SCENARIOS", "Scenario"]

Scenario = Callable[[ChaosSettings], ScenarioResult]


def _lazy(module: str) -> Scenario:
    """The ``run`` of ``benchmarks.chaos.scenarios.<module>``, imported when called."""

    def run(settings: ChaosSettings) -> ScenarioResult:
        scenario = importlib.import_module(f"benchmarks.chaos.scenarios.{module}")
        return scenario.run(settings)

    run.__name__ = f"run_{module}"
    return run


#: Scenario number -> module (its NAME is the row's name).
NAMES: dict[int, str] = {
    1: "faults",
    2: "kills",
    7: "poison",
    3: "restart",
    4: "freeze",
    5: "producer_kills",
    6: "racing_cas",
}
SCENARIOS: dict[int, Scenario] = {n: _lazy(module) for n, module in NAMES.items()}
#: Scenarios that run at one strategy whatever was asked (6 is about `auto`'s probe).
FIXED_STRATEGY: dict[int, str] = {6: "auto"}
