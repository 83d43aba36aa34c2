"""claim_conditional on the simulated S3: with If-None-Match honoured, exactly one winner
whatever the request delays; on a server that ignores it, several (why setup probes)."""

from __future__ import annotations

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pawn_queue_sync.protocol.lease import LeaseBody, claim_conditional
from tests.sim_s3 import ORIGIN, SimS3

KEY = "orders/leases/m.lease"

FAST = settings(max_examples=100, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])


@attrs.frozen
class Claimer:
    start_ms: int
    to_us: int
    back_us: int


claimers = st.lists(
    st.builds(
        Claimer,
        start_ms=st.integers(0, 3_000),
        to_us=st.integers(0, 5_000_000),
        back_us=st.integers(0, 5_000_000),
    ),
    min_size=2,
    max_size=16,
)


def run_claims(sim: SimS3, schedule: list[Claimer]) -> dict[str, str]:
    for i, c in enumerate(schedule):
        body = LeaseBody.new(f"c{i}", "m", ORIGIN, 30.0)
        sim.spawn(f"c{i}", claim_conditional(KEY, body), start=c.start_ms / 1000,
                  delays=(c.to_us / 1e6, c.back_us / 1e6))
    outcomes = sim.run()
    assert all(o.done and o.error is None for o in outcomes.values())
    return {name: o.value for name, o in outcomes.items() if o.value is not None}


@FAST
@given(claimers)
def test_exactly_one_winner_whatever_the_delays(schedule):
    sim = SimS3(if_none_match=True, if_match=True)
    won = run_claims(sim, schedule)
    assert len(won) == 1, won
    (winner, token), = won.items()
    assert sim.objects[KEY].etag == token
    assert [(e.actor, e.before) for e in sim.log] == [(winner, None)]  # nothing overwritten


def test_a_server_that_ignores_if_none_match_gives_several_winners():
    """Why the strategy is chosen by a probe and never assumed."""
    sim = SimS3(if_none_match=False)
    won = run_claims(sim, [Claimer(0, 0, 0), Claimer(100, 0, 0)])
    assert sorted(won) == ["c0", "c1"]
