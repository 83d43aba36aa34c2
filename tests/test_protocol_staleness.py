"""Staleness is judged by the server's clock only: LastModified of the lease against the
Date of the response. Client clocks, however wrong, neither steal a live lease nor keep
a dead one; the 1 s resolution of both times is absorbed by the grace."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from pawn_queue_sync.encoding import iso
from pawn_queue_sync.protocol.effects import Get, Put, Sleep
from pawn_queue_sync.protocol.lease import STALE_GRACE_SECONDS, LeaseBody, is_stale
from tests.sim_s3 import ORIGIN, SimS3

KEY = "orders/leases/m.lease"
FAST = settings(max_examples=150, derandomize=True, deadline=None, database=None)

visibilities = st.floats(3.0, 86_400.0)
resolutions = st.sampled_from([0.0, 0.001, 1.0])
#: When the lease was written, the visibility timeout, the server's time resolution and
#: the holder's clock skew: the world both properties below are drawn in.
WORLD = {
    "written_at": st.floats(0.0, 100_000.0),
    "visibility": visibilities,
    "resolution": resolutions,
    "skew": st.floats(-86_400.0, 86_400.0),
}


def observe(written_at: float, observed_at: float, resolution: float, skew: float):
    """A holder whose clock is off by ``skew`` writes its lease at server time
    ``written_at``; a janitor GETs it at ``observed_at``. Returns (body, GetResult)."""
    sim = SimS3(time_resolution=resolution)
    body = LeaseBody.new("h", "m", ORIGIN + timedelta(seconds=written_at + skew), 30.0)

    def holder():
        yield Sleep(written_at)
        yield Put(KEY, body.encode())

    def janitor():
        yield Sleep(observed_at)
        return (yield Get(KEY))

    sim.spawn("h", holder())
    seen = sim.spawn("j", janitor())
    sim.run()
    return body, seen.value


@FAST
@given(age_fraction=st.floats(0.0, 1.0), **WORLD)
def test_never_stale_within_the_visibility_timeout(
    written_at, age_fraction, visibility, resolution, skew
):
    _, seen = observe(written_at, written_at + age_fraction * visibility, resolution, skew)
    assert not is_stale(seen.last_modified, seen.server_time, visibility)


@FAST
@given(extra=st.floats(0.001, 86_400.0), **WORLD)
def test_always_stale_once_past_visibility_grace_and_resolution(
    written_at, extra, visibility, resolution, skew
):
    age = visibility + STALE_GRACE_SECONDS + resolution + extra
    _, seen = observe(written_at, written_at + age, resolution, skew)
    assert is_stale(seen.last_modified, seen.server_time, visibility)


@FAST
@given(visibility=visibilities, age=st.floats(0.0, 200_000.0), later=st.floats(0.0, 1000.0))
def test_staleness_only_grows_with_server_time(visibility, age, later):
    lm = ORIGIN
    now = ORIGIN + timedelta(seconds=age)
    if is_stale(lm, now, visibility):
        assert is_stale(lm, now + timedelta(seconds=later), visibility)


def test_a_client_clock_an_hour_behind_neither_keeps_nor_steals():
    """pawn-queue 0.1.3 compared ``expires_at`` (written by the holder's clock) with the
    janitor's clock. Here a holder an hour slow writes an ``expires_at`` already an hour
    in the past for an honest janitor: the lease still lives its full visibility
    timeout, then dies on time."""
    body, seen = observe(10.0, 12.0, 1.0, skew=-3600.0)
    assert body.expires_at < iso(seen.server_time)  # pawn-queue would call it expired
    assert not is_stale(seen.last_modified, seen.server_time, 30.0)
    body, seen = observe(10.0, 10.0 + 30.0 + 2.0 + 0.5, 1.0, skew=+3600.0)
    assert body.expires_at > iso(seen.server_time)  # pawn-queue would keep it an hour
    assert is_stale(seen.last_modified, seen.server_time, 30.0)
