"""Which rows a chaos run makes, with which settings, and running them."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs

from benchmarks.chaos.accounting import Counts
from benchmarks.chaos.harness import ChaosSettings, ScenarioResult
from benchmarks.chaos.scenarios import FIXED_STRATEGY, NAMES, SCENARIOS

__all__ = ["KINDS", "OWN_SERVER", "QUICK_WORKERS", "STRATEGIES", "Row", "plan", "quick_plan",
           "quick_seed", "run_row", "run_rows", "settings_for"]

log = logging.getLogger(__name__)

KINDS = ("plain", "packed")
#: Scenarios that stop the server: never given a shared one while other rows use it.
OWN_SERVER = frozenset({3})
STRATEGIES = ("conditional_write", "csprng_verify")


@attrs.frozen
class Row:
    """One (scenario, kind, strategy) to run."""

    scenario: int
    kind: str
    strategy: str


def plan(*, only: Iterable[int] | None = None, kinds: Sequence[str] = KINDS,
         strategies: Sequence[str] = STRATEGIES) -> list[Row]:
    """Every asked scenario at every asked kind and strategy (a scenario fixed to one
    strategy runs once per kind at it)."""
    rows: list[Row] = []
    for number in sorted(SCENARIOS if only is None else only):
        if number not in SCENARIOS:
            raise ValueError(f"no chaos scenario {number} (known: {sorted(SCENARIOS)})")
        for kind in kinds:
            fixed = FIXED_STRATEGY.get(number)
            for strategy in [fixed] if fixed else strategies:
                rows.append(Row(number, kind, strategy))
    return rows


#: The four (topic kind, strategy) combinations.
COMBOS = tuple((kind, strategy) for kind in KINDS for strategy in STRATEGIES)
#: Quick rows run at a time (they mostly wait on faults, leases and processes).
QUICK_WORKERS = 3
#: Quick rows beyond the rotation: scenario 4 on a plain topic under conditional_write
#: (a late ack there is refused by the message's own fence, which no packed row
#: exercises), and scenario 2 under conditional_write (where any overlap is a miss).
QUICK_EXTRA_ROWS = (Row(4, "plain", "conditional_write"), Row(2, "packed", "conditional_write"))


def quick_plan() -> list[Row]:
    """The quick suite's rows (``--quick`` with no filter, and tests/test_chaos.py):
    scenario 1 on the four combinations; every other one once, combinations rotated;
    then QUICK_EXTRA_ROWS."""
    rows = [Row(1, kind, strategy) for kind, strategy in COMBOS]
    others = [n for n in sorted(NAMES) if n != 1]
    for i, number in enumerate(others):
        kind, strategy = COMBOS[(i + 1) % len(COMBOS)]
        [row] = plan(only=[number], kinds=[kind], strategies=[strategy])
        rows.append(row)
    rows.extend(row for row in QUICK_EXTRA_ROWS if row not in rows)
    return rows


def quick_seed(row: Row) -> int:
    """The quick suite's seed of a row: its scenario number."""
    return row.scenario


def settings_for(row: Row, *, quick: bool, seed: int = 0,
                 shared_server: Any = None) -> ChaosSettings:
    """A row's settings: the contract's defaults in the full run; in the quick one, fewer
    processes and threads, short leases and timeouts (messages: the scenario's quick
    default). ``shared_server``: a running SeaweedFS the row uses (its own bucket)."""
    kind: Any = row.kind
    strategy: Any = row.strategy
    if not quick:
        return ChaosSettings(kind=kind, strategy=strategy, messages=0, seed=seed,
                             shared_server=shared_server)
    return ChaosSettings(
        kind=kind, strategy=strategy, messages=0, seed=seed, processes=2, threads=4,
        visibility_timeout=5.0, refresh_interval=1.5, read_timeout=1.5, quick=True,
        shared_server=shared_server,
    )


def _crashed(row: Row, exc: BaseException) -> ScenarioResult:
    """The row of a scenario that raised: no counts, one miss saying why."""
    zero = Counts(published=0, unconfirmed=0, acked=0, dead_lettered=0, left=0, lost=0,
                  delivered_twice=0, twice_while_live=0, remaining_after_sweep=0,
                  wrong_dead_letters=0, poison_delivery_errors=0)
    return ScenarioResult(
        scenario=row.scenario, name=NAMES.get(row.scenario, "?"), kind=row.kind,
        strategy=row.strategy, counts=zero,
        notes={"error": "".join(traceback.format_exception_only(type(exc), exc)).strip()},
        goals_met=False, misses=[f"the scenario raised {type(exc).__name__}: {exc}"],
    )


def run_row(row: Row, *, quick: bool, seed: int = 0, shared_server: Any = None,
            runner: Callable[[ChaosSettings], ScenarioResult] | None = None) -> ScenarioResult:
    """Run one row; a scenario that raises gives a failed row (the others still run)."""
    settings = settings_for(row, quick=quick, seed=seed, shared_server=shared_server)
    try:
        result = (runner or SCENARIOS[row.scenario])(settings)
    except Exception as exc:
        log.exception("chaos scenario %s (%s, %s) raised", row.scenario, row.kind, row.strategy)
        return _crashed(row, exc)
    if result.scenario != row.scenario:  # a scenario that left finish()'s default
        result = attrs.evolve(result, scenario=row.scenario)
    return result


def run_rows(rows: Sequence[Row], *, quick: bool, seed: Callable[[Row], int] = lambda r: 0,
             shared_server: Any = None, workers: int = 1) -> dict[Row, ScenarioResult]:
    """Run ``rows``, ``workers`` at a time (each row has its own bucket, proxy and pool;
    with more than one worker, rows of OWN_SERVER scenarios start a server of their
    own). The rows mostly wait on faults, leases and processes, so on a small machine
    three at a time take about a third of the time."""
    if workers <= 1:
        return {row: run_row(row, quick=quick, seed=seed(row), shared_server=shared_server)
                for row in rows}

    def one(row: Row) -> ScenarioResult:
        server = None if row.scenario in OWN_SERVER else shared_server
        return run_row(row, quick=quick, seed=seed(row), shared_server=server)

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="chaos-row") as pool:
        futures = {row: pool.submit(one, row) for row in rows}
        return {row: future.result() for row, future in futures.items()}
