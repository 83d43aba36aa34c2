"""Re-review of e70c645 (a lease write whose retry was refused reads the key with a GET): all fixed.

1. (regression of e70c645) The GET in ``_write_lease`` is sent at once when the retry
   is refused. The write's first attempt may still be on its way: the client can learn
   of a failure (a reset of its connection after the request went out through an
   intermediary) before the server applies the request, and the model
   (docs/guarantees.md) only bounds the one-way delay by jitter_min. The GET overtakes
   the PUT, sees nothing, the claim raises DeadlineExceeded -- and then our lease
   lands: an orphan lease (the message invisible for a visibility timeout, then
   counted an abandoned delivery) and a poll that raises although the store worked.
   3406363 kept this claim (its verification found our bytes).
2. (pre-existing in 3406363, kept by e70c645) ``refresh()``'s cut path waits
   2 x jitter_min after the *refusal* before it looks; the normal path waits that long
   after the write's *answer*, which comes after the landing. When the write was still
   in flight at the refusal it lands up to jitter_min later, a taker's write up to
   2 x jitter_min after that: the look comes first, says "refreshed", and the taker's
   lease then replaces ours -- two holders, every delay inside the model.
3. Mutants of ``_retry_bound`` (the sign of the translation; the DELETE left
   untranslated) survive the suite: only the PUT on a later-origin clock and a
   bound that refuses are tested. Killed here.
"""

from __future__ import annotations

import random
from datetime import datetime, timezone

import pytest

from pawn_queue_sync.clock import FakeClock
from pawn_queue_sync.errors import DeadlineExceeded, StorageError
from pawn_queue_sync.protocol.effects import run
from pawn_queue_sync.protocol.lease import (
    CsprngSettings,
    LeaseBody,
    claim_csprng,
    claim_csprng_batch,
)
from pawn_queue_sync.storage.base import PutResult
from pawn_queue_sync.storage.memory import MemoryStore

ORIGIN = datetime(2026, 1, 1, tzinfo=timezone.utc)
PREFIX = "t/leases/"
KEY = PREFIX + "m.lease"
QUICK = CsprngSettings(jitter_min_ms=100, jitter_max_ms=100, verify_retries=0,
                       verify_retry_delay_ms=0)
#: the PUT's one-way delay: under jitter_min, as the model requires
IN_FLIGHT_S = 0.05


class AnswerLostEarly(MemoryStore):
    """A server (ETag = MD5, no conditional requests) behind a link that resets the
    client's connection once a lease PUT has gone out: the PUT reaches the server
    ``IN_FLIGHT_S`` later (on the fake clock) and is applied then; the client's S3
    layer sees the reset at once and its retry is refused by ``retry_by``
    (DeadlineExceeded, as S3Store raises it). Every request first applies the writes
    whose arrival time has come."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.fake = clock
        self.in_flight: list[tuple[float, str, bytes]] = []

    def _land(self) -> None:
        now = self.fake.monotonic()
        due = [w for w in self.in_flight if w[0] <= now]
        self.in_flight = [w for w in self.in_flight if w[0] > now]
        for _, key, body in due:
            super().put(key, body)

    def put(self, key: str, body: bytes, *, if_none_match: bool = False,
            if_match: str | None = None, deadline: float | None = None,
            retry_by: float | None = None) -> PutResult:
        self._land()
        if retry_by is None:
            return super().put(key, body)
        self.in_flight.append((self.fake.monotonic() + IN_FLIGHT_S, key, bytes(body)))
        raise DeadlineExceeded("put_object: the retry-by time passed before attempt 2",
                               key=key)

    def get(self, key):  # type: ignore[no-untyped-def]
        self._land()
        return super().get(key)

    def head(self, key):  # type: ignore[no-untyped-def]
        self._land()
        return super().head(key)

    def list(self, prefix, **kw):  # type: ignore[no-untyped-def]
        self._land()
        return super().list(prefix, **kw)

    def settle(self) -> None:
        """Let everything in flight arrive."""
        self.fake.advance(1.0)
        self._land()


def test_a_claim_whose_write_is_still_in_flight_is_not_given_up() -> None:
    """Alone on the key; our lease lands 50 ms after it was sent (under jitter_min):
    the claim must hold it. At e70c645 the GET overtakes the PUT, the claim raises
    DeadlineExceeded and our lease lands afterwards, held by no one."""
    clock = FakeClock()
    store = AnswerLostEarly(clock)
    body = LeaseBody.new("c", "m", ORIGIN, 30.0)
    try:
        got: object = run(claim_csprng(KEY, body, QUICK, random.Random(0)), store, clock)
    except StorageError as exc:
        got = exc
    store.settle()
    stored = store.get(KEY)
    assert stored.body == body.encode()  # our lease is on the key
    assert got == stored.etag, f"our lease landed, the claim said {got!r}: an orphan lease"


def test_a_batch_claim_whose_write_is_still_in_flight_is_not_given_up() -> None:
    """The same through claim_csprng_batch (the poll's path on consistent LISTs): the
    claim is None with the DeadlineExceeded in ``errors`` (claim_batch raises it: the
    poll fails) while our lease lands on the key."""
    clock = FakeClock()
    store = AnswerLostEarly(clock)
    body = LeaseBody.new("c", "m", ORIGIN, 30.0)
    errors: list[StorageError] = []
    listed_at = clock.monotonic()
    tokens = run(claim_csprng_batch(PREFIX, [(KEY, body)], listed_at, QUICK,
                                    random.Random(0), errors=errors), store, clock)
    store.settle()
    stored = store.get(KEY)
    assert stored.body == body.encode()
    assert tokens == [stored.etag], (
        f"our lease landed, the batch claim said {tokens!r}, errors {errors!r}")


class NeverLands(AnswerLostEarly):
    """A lease PUT reset before it was forwarded: never applied, its retry refused."""

    def put(self, key, body, **kw):  # type: ignore[no-untyped-def]
        if kw.get("retry_by") is None:
            return MemoryStore.put(self, key, body)
        raise DeadlineExceeded("put_object: refused", key=key)


def test_a_write_that_never_lands_is_still_an_error() -> None:
    """The other side of the fix: a refused write that never lands stays the claim's
    DeadlineExceeded (whatever the wait before the look), and nothing is left."""
    clock = FakeClock()
    store = NeverLands(clock)
    body = LeaseBody.new("c", "m", ORIGIN, 30.0)
    with pytest.raises(DeadlineExceeded):
        run(claim_csprng(KEY, body, QUICK, random.Random(0)), store, clock)
    store.settle()
    assert not store.list(PREFIX).objects


# -- 2. refresh's cut path: its wait before the GET matters (a mutant without it survives) --

from pawn_queue_sync.protocol.lease import Capabilities, refresh  # noqa: E402

NO_CAS = Capabilities(if_none_match=False, if_match=False)


def test_a_refresh_whose_write_is_still_in_flight_is_refreshed() -> None:
    """refresh() without If-Match, our new bytes landing 50 ms after the refused retry:
    refreshed (the new token), not "not refreshed, still ours under the old token"
    (DeadlineExceeded; the old token is no longer the lease's: the next act on it says
    LeaseLostError although the lease holds our bytes)."""
    clock = FakeClock()
    store = AnswerLostEarly(clock)
    old = LeaseBody.new("c", "m", ORIGIN, 30.0)
    token = store.put(KEY, old.encode()).etag
    new = LeaseBody.new("c", "m", ORIGIN, 30.0)
    try:
        got: object = run(refresh(KEY, token, new, NO_CAS, QUICK), store, clock)
    except StorageError as exc:
        got = exc
    store.settle()
    stored = store.get(KEY)
    assert stored.body == new.encode()
    assert got == stored.etag, f"our refresh landed, refresh() said {got!r}"


# -- 3. the time translation in perform() (mutants of _retry_bound survive the suite) -------


from pawn_queue_sync.protocol.lease import release  # noqa: E402
from pawn_queue_sync.storage.s3 import boto as boto_mod  # noqa: E402
from pawn_queue_sync.storage.s3 import wire as wire_mod  # noqa: E402

from .s3_recorder import PATHS, Recorder, Reply, Seen, recording, store_at  # noqa: E402
from .test_review_retry import OffsetClock  # noqa: E402

recorder = pytest.fixture(recording, name="recorder")


def _ours_then_one_503(seen: Seen) -> Reply:
    if seen.method == "HEAD":
        return 200, {"ETag": '"abc"', "Last-Modified": "Thu, 26 Nov 2026 10:00:00 GMT"}, b""
    return (503, {"Content-Type": "application/xml"},
            b"<Error><Code>SlowDown</Code><Message>later</Message></Error>")


OFFSETS = pytest.mark.parametrize("offset", [0.0, 3600.0, -3600.0],
                                  ids=["system-origin", "later-origin", "earlier-origin"])


@PATHS
@OFFSETS
def test_a_release_delete_retry_within_the_bound_is_sent(
    recorder: Recorder, fast: bool, offset: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """release() without If-Match; the first DELETE gets 503, the backoff (10 ms) ends
    well inside the bound (jitter_min 5 s after the HEAD): the retry must be sent and
    the release succeed, whatever the clock's origin. (A translation with the sign
    turned puts the bound in the past: no retry is ever sent, DeadlineExceeded.)"""
    for mod in (wire_mod, boto_mod):
        monkeypatch.setattr(mod, "backoff", lambda attempt: 0.01)
    answered: list[Seen] = []

    def reply(seen: Seen) -> Reply:
        if seen.method == "DELETE":
            answered.append(seen)
            if len(answered) == 1:
                return _ours_then_one_503(seen)
            return 204, {}, b""
        return _ours_then_one_503(seen)

    recorder.reply = reply
    store = store_at(recorder.endpoint(), fast=fast, max_attempts=4)
    roomy = CsprngSettings(jitter_min_ms=5000, jitter_max_ms=5000)  # a bound far off
    assert run(release(KEY, "abc", NO_CAS, roomy), store, OffsetClock(offset)) is True
    assert [s.method for s in recorder.seen] == ["HEAD", "DELETE", "DELETE"]


@PATHS
@OFFSETS
def test_a_release_delete_is_not_retried_past_the_bound_whatever_the_clock(
    recorder: Recorder, fast: bool, offset: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """test_review_retry's release test on clocks of other origins (the DELETE path of
    perform(): the review's clock test only covers the PUT)."""
    for mod in (wire_mod, boto_mod):
        monkeypatch.setattr(mod, "backoff", lambda attempt: 0.3)
    recorder.reply = _ours_then_one_503
    store = store_at(recorder.endpoint(), fast=fast, max_attempts=4)
    with pytest.raises(DeadlineExceeded):
        run(release(KEY, "abc", NO_CAS, QUICK), store, OffsetClock(offset))
    assert [s.method for s in recorder.seen] == ["HEAD", "DELETE"]


# -- 4. refresh's cut path confirms too early when its write was still in flight -----------


from pawn_queue_sync.errors import LeaseLostError  # noqa: E402
from pawn_queue_sync.protocol.effects import Put  # noqa: E402
from pawn_queue_sync.protocol.lease import reap  # noqa: E402

from .sim_s3 import SimS3  # noqa: E402

TIGHT = CsprngSettings(jitter_min_ms=5, jitter_max_ms=5, verify_retries=0,
                       verify_retry_delay_ms=0)


def _seed(body: LeaseBody):  # type: ignore[no-untyped-def]
    yield Put(KEY, body.encode())
    return None


def test_a_refresh_cut_short_in_flight_never_makes_two_holders() -> None:
    """Every one-way delay under jitter_min (5 ms). h's lease (OLD, t=0) is stale; from
    1 ms h refreshes it: its HEAD finds OLD, its PUT leaves at 1 ms and lands at 5.9 ms,
    but h learns of a reset at once (retry refused). At 1.5 ms the janitor reaps OLD.
    c claims from 5.8 ms: its HEAD arrives at 5.85 ms (free), its answer back at
    10.75 ms, its PUT lands at 15.65 ms, over h's; c verifies and confirms its own.
    h's cut path waits 2 x jitter_min after the *refusal* (1 ms), GETs at 11 ms, finds
    its new bytes and says "refreshed": h and c both hold the message. The normal path
    waits from the write's answer, which comes after the landing; here the landing can
    come up to jitter_min after the refusal, so the look must wait 3 x jitter_min."""
    old = LeaseBody.new("h", "m", ORIGIN, 30.0)
    sim = SimS3(if_none_match=False, if_match=False, early={("h", 1)})
    sim.spawn("seed", _seed(old), start=0.0, delays=0.0)
    sim.spawn("h", refresh(KEY, old.token, LeaseBody.new("h", "m", ORIGIN, 30.0), NO_CAS,
                           TIGHT), start=0.001, delays=[(0, 0), (0.0049, 0), (0, 0)])
    sim.spawn("j", reap(KEY, old.token, NO_CAS, TIGHT), start=0.0015, delays=0.0)
    sim.spawn("c", claim_csprng(KEY, LeaseBody.new("c", "m", ORIGIN, 30.0), TIGHT,
                                random.Random(1)),
              start=0.0058, delays=[(0.00005, 0.0049), (0.0049, 0.0001), (0.0001, 0.0001)])
    out = sim.run()
    assert max(0.0049, 0.00005) < TIGHT.jitter_min_ms / 1000  # inside the model
    holders = {n: o.value for n, o in out.items()
               if n in ("h", "c") and o.error is None and o.value is not None}
    assert set(holders) != {"h", "c"}, (
        f"two holders: {holders}; h: {out['h'].error!r}; server: "
        f"{[(round(e.at * 1000, 2), e.actor, e.op) for e in sim.log]}")
    if "h" not in holders:
        assert isinstance(out["h"].error, LeaseLostError), out["h"].error
