"""The quick chaos suite (``python -m benchmarks.chaos --quick``) in the test suite.

Every registered scenario runs at least once, the four (topic kind, strategy)
combinations spread over them, scenario 1 (faults) on all four; each row asserts the
goals (docs/guarantees.md, "Chaos suite") and, failing, shows its counts and notes.
The rows start servers and worker processes of their own, so they run one after
another in one xdist group.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from benchmarks.chaos.report import row_line
from benchmarks.chaos.scenarios import NAMES
from benchmarks.chaos.suite import KINDS, STRATEGIES, Row, plan, run_row
from tests.seaweedfs import RestartableSeaweedFS

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("chaos")]

COMBOS = [(kind, strategy) for kind in KINDS for strategy in STRATEGIES]


def quick_rows() -> list[Row]:
    """Scenario 1 on the four combinations; every other one once, combinations rotated."""
    rows = [Row(1, kind, strategy) for kind, strategy in COMBOS]
    others = [n for n in sorted(NAMES) if n != 1]
    for i, number in enumerate(others):
        kind, strategy = COMBOS[(i + 1) % len(COMBOS)]
        [row] = plan(only=[number], kinds=[kind], strategies=[strategy])
        rows.append(row)
    return rows


@pytest.fixture(scope="module")
def chaos_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestartableSeaweedFS]:
    """One SeaweedFS for the rows, in turn (each has a bucket of its own)."""
    with RestartableSeaweedFS(tmp_path_factory.mktemp("chaos-seaweedfs")) as server:
        yield server


def test_the_quick_rows_cover_every_scenario_and_combination() -> None:
    rows = quick_rows()
    assert {r.scenario for r in rows} == set(NAMES)
    assert {(r.kind, r.strategy) for r in rows if r.scenario == 1} == set(COMBOS)
    assert {(r.kind, r.strategy) for r in rows} >= set(COMBOS)


@pytest.mark.parametrize("row", quick_rows(), ids=lambda r: f"{r.scenario}-{r.kind}-{r.strategy}")
def test_chaos_quick_row_meets_its_goals(row: Row, chaos_server: RestartableSeaweedFS) -> None:
    result = run_row(row, quick=True, seed=row.scenario, shared_server=chaos_server)
    if not chaos_server.running:  # a scenario that stops the server must start it again
        pytest.fail(f"row {row} left the shared SeaweedFS stopped")
    shown = json.dumps(result.as_dict(), indent=1, default=str)
    assert result.goals_met, f"{row_line(result)}\nmissed: {result.misses}\n{shown}"
    c = result.counts
    assert c.published > 0, shown
    assert c.lost == 0 and c.remaining_after_sweep == 0, shown
    assert c.acked + c.dead_lettered + c.left >= c.published, shown
