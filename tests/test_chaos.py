"""The quick chaos suite (``python -m benchmarks.chaos --quick``) in the test suite.

Every registered scenario runs at least once, the four (topic kind, strategy)
combinations spread over them, scenario 1 (faults) on all four, scenario 4 (late acks)
on a plain and a packed topic, scenario 2 (kills) under conditional_write; each row asserts the
goals (docs/guarantees.md, "Chaos suite") and, failing, shows its counts and notes.
The rows start worker processes and proxies of their own on one SeaweedFS (a row
that restarts the server gets its own), three at a time (they mostly wait), computed
once for the module; they run in an xdist group of their own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from benchmarks.chaos.harness import ScenarioResult
from benchmarks.chaos.report import row_line
from benchmarks.chaos.scenarios import NAMES
from benchmarks.chaos.suite import COMBOS, QUICK_WORKERS, Row, quick_plan, quick_seed, run_rows
from tests.seaweedfs import RestartableSeaweedFS

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("chaos")]

@pytest.fixture(scope="module")
def quick_results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Row, ScenarioResult]]:
    """Every quick row's result, the rows sharing one SeaweedFS (each its own bucket)."""
    server = RestartableSeaweedFS(tmp_path_factory.mktemp("chaos-seaweedfs"))
    server.start()
    try:
        yield run_rows(quick_plan(), quick=True, seed=quick_seed, shared_server=server,
                       workers=QUICK_WORKERS)
    finally:
        server.stop(graceful=False)  # scratch data: no need to wait for a clean stop


def test_the_quick_rows_cover_every_scenario_and_combination() -> None:
    rows = quick_plan()
    assert {r.scenario for r in rows} == set(NAMES)
    assert {(r.kind, r.strategy) for r in rows if r.scenario == 1} == set(COMBOS)
    assert {(r.kind, r.strategy) for r in rows} >= set(COMBOS)


@pytest.mark.parametrize("row", quick_plan(), ids=lambda r: f"{r.scenario}-{r.kind}-{r.strategy}")
def test_chaos_quick_row_meets_its_goals(row: Row,
                                         quick_results: dict[Row, ScenarioResult]) -> None:
    result = quick_results[row]
    shown = json.dumps(result.as_dict(), indent=1, default=str)
    assert result.goals_met, f"{row_line(result)}\nmissed: {result.misses}\n{shown}"
    c = result.counts
    assert c.published > 0, shown
    assert c.lost == 0 and c.remaining_after_sweep == 0, shown
    assert c.acked + c.dead_lettered + c.left >= c.published, shown
