"""Review of 3406363 (csprng lease writes carry ``retry_by``): reproductions, all fixed.

1. The retry bound is computed on the protocol's clock (ctx.clock, via ``Now``) but the
   S3 store compares it with ``time.monotonic()``: with any clock whose origin differs
   (the Clock protocol allows "an arbitrary origin"; PawnQueue(clock=...) takes any
   clock) the bound is meaningless -- retries keep leaving past it.
2. With opaque ETags (SSE-KMS, some gateways; csprng_verify is used there, see
   OpaqueEtags in test_consumer_regressions.py) a lease write whose first attempt
   landed, whose answer was lost and whose retry was refused is taken for "not landed":
   the claim is lost with our lease left on the key, a refresh reports LeaseLostError
   although the lease holds our new bytes.
3. No test exercised "first attempt applied, answer lost, retry refused" (the simulator
   models a resend as "earlier attempts never reached the server", the SeaweedFS race
   test uses ``reset``, which is not forwarded): the claim-gives-up mutant survived.
   test_a_dropped_answer_with_a_refused_retry_still_claims covers it on SeaweedFS.
"""

from __future__ import annotations

import random
import secrets
import threading
import time
from datetime import datetime, timezone
from typing import Any

import pytest

from pawn_queue_sync.clock import SystemClock
from pawn_queue_sync.errors import DeadlineExceeded, LeaseLostError, StorageError
from pawn_queue_sync.protocol.effects import run
from pawn_queue_sync.protocol.lease import (
    Capabilities,
    CsprngSettings,
    LeaseBody,
    claim_csprng,
    refresh,
)
from pawn_queue_sync.storage.base import PutResult
from pawn_queue_sync.storage.memory import MemoryStore
from pawn_queue_sync.storage.s3 import boto as boto_mod
from pawn_queue_sync.storage.s3 import wire as wire_mod

from .s3_recorder import PATHS, Recorder, Reply, Seen, recording, store_at

recorder = pytest.fixture(recording, name="recorder")

ORIGIN = datetime(2026, 1, 1, tzinfo=timezone.utc)
KEY = "t/leases/m.lease"
NO_CAS = Capabilities(if_none_match=False, if_match=False)
QUICK = CsprngSettings(jitter_min_ms=100, jitter_max_ms=100, verify_retries=0,
                       verify_retry_delay_ms=0)


# -- 1. clock domains ---------------------------------------------------------------------


class OffsetClock(SystemClock):
    """The machine's clock with another monotonic origin (as the Clock protocol allows:
    "seconds from an arbitrary origin"), e.g. a clock counting from the epoch."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def monotonic(self) -> float:
        return time.monotonic() + self.offset


def _free_key_slow_server(seen: Seen) -> Reply:
    if seen.method == "HEAD":
        return 404, {}, b""
    return (503, {"Content-Type": "application/xml"},
            b"<Error><Code>SlowDown</Code><Message>later</Message></Error>")


@PATHS
@pytest.mark.parametrize("offset", [0.0, 3600.0], ids=["system-origin", "other-origin"])
def test_no_lease_put_retry_leaves_past_the_bound_whatever_the_clock(
    recorder: Recorder, fast: bool, offset: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim on a key found free (HEAD 404) whose lease PUTs all get 503: no PUT may
    leave later than jitter_min after the HEAD (docs/guarantees.md, "Retries of lease
    writes are bounded too"). Backoff fixed at 0.3 s (> jitter_min 0.1 s): a retry is
    always past the bound, so exactly one PUT may be sent."""
    for mod in (wire_mod, boto_mod):
        monkeypatch.setattr(mod, "backoff", lambda attempt: 0.3)
    recorder.reply = _free_key_slow_server
    store = store_at(recorder.endpoint(), fast=fast, max_attempts=4)
    body = LeaseBody.new("c", "m", ORIGIN, 30.0)
    try:
        got: object = run(claim_csprng(KEY, body, QUICK, random.Random(0)), store,
                          OffsetClock(offset))
    except StorageError as exc:  # every attempt was sent and refused
        got = exc
    head = next(s for s in recorder.seen if s.method == "HEAD")
    puts = [s for s in recorder.seen if s.method == "PUT"]
    # every retry would leave 0.3 s after its attempt, past the bound: only the first
    # attempt may be sent (when it arrives depends on the machine's load, not on us)
    assert len(puts) == 1, (
        f"{len(puts)} PUTs, at (s after HEAD): "
        f"{[round(p.arrived - head.arrived, 3) for p in puts]}; the claim: {got!r}")
    # nothing landed (the look at the key fails too here): a store error, never a token
    assert isinstance(got, StorageError), got


# -- 2. opaque ETags and an answer lost ---------------------------------------------------


class LostAnswer(MemoryStore):
    """A server without conditional requests whose ETags are MD5s (``opaque`` False)
    or fresh values (``opaque`` True); the PUT number ``lose`` (1-based) is applied but
    its answer is lost and the S3 layer's retry refused by ``retry_by``: the store
    raises DeadlineExceeded, exactly as S3Store does then."""

    def __init__(self, *, opaque: bool, lose: int) -> None:
        super().__init__()
        self.opaque, self.lose, self.puts = opaque, lose, 0

    def put(self, key: str, body: bytes, *, if_none_match: bool = False,
            if_match: str | None = None, deadline: float | None = None,
            retry_by: float | None = None) -> PutResult:
        self.puts += 1
        result = super().put(key, body)
        if self.opaque:  # a fresh ETag, unrelated to the bytes
            with self._lock:
                obj = self._objects[key]
                self._objects[key] = type(obj)(obj.body, secrets.token_hex(16),
                                               obj.last_modified)
            result = PutResult(key, self._objects[key].etag, result.server_time)
        if self.puts == self.lose:
            assert retry_by is not None  # a lease write relying on a check
            raise DeadlineExceeded("put_object: the retry-by time passed before attempt 2",
                                   key=key)
        return result


@pytest.mark.parametrize("opaque", [False, True], ids=["md5-etags", "opaque-etags"])
def test_a_claim_whose_write_landed_but_whose_answer_was_lost_holds_the_lease(
    opaque: bool,
) -> None:
    """Docs: "the claim goes on to its verification rounds as if it had [landed]: our
    bytes are unique, so the rounds find them only if an attempt sent in time landed".
    Our bytes did land; nobody else claims: the claim must win (else our lease sits on
    the key, unheld, until it goes stale: the message waits a visibility timeout and
    the janitor counts an abandoned delivery)."""
    store = LostAnswer(opaque=opaque, lose=1)
    body = LeaseBody.new("c", "m", ORIGIN, 30.0)
    token = run(claim_csprng(KEY, body, QUICK, random.Random(0)), store, SystemClock())
    stored = store.get(KEY)
    assert stored.body == body.encode()  # our bytes are there
    assert token == stored.etag, "the claim was given up on a lease that is ours"


@pytest.mark.parametrize("opaque", [False, True], ids=["md5-etags", "opaque-etags"])
def test_a_refresh_whose_write_landed_but_whose_answer_was_lost_is_not_lost(
    opaque: bool,
) -> None:
    """Docs: the re-check "tells refreshed, not refreshed -- DeadlineExceeded -- or
    lost". Our new bytes landed: refreshed (or at worst DeadlineExceeded), never
    LeaseLostError (that makes the message ``lost`` while its lease is ours)."""
    store = LostAnswer(opaque=opaque, lose=2)
    old = LeaseBody.new("c", "m", ORIGIN, 30.0)
    token = store.put(KEY, old.encode()).etag
    new = LeaseBody.new("c", "m", ORIGIN, 30.0)
    try:
        got = run(refresh(KEY, token, new, NO_CAS, QUICK), store,
                  SystemClock())
    except LeaseLostError as exc:
        pytest.fail(f"LeaseLostError ({exc}) though the lease holds our new bytes "
                    f"({store.get(KEY).body == new.encode()})")
    except DeadlineExceeded:
        got = None
    assert store.get(KEY).body == new.encode()
    assert got in (None, store.get(KEY).etag)


# -- 3. the untested path on a real server -------------------------------------------------


def test_a_dropped_answer_with_a_refused_retry_still_claims(
    real_s3: Any, real_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SeaweedFS through the fault proxy: the consumer's first lease PUT is applied but
    its answer dropped; the retry is refused (backoff fixed at 5 s, past any bound). The
    consumer is alone: its verification finds its bytes and it must get the message --
    at once, not after a visibility timeout."""
    from tests.fault_proxy import FaultRule
    from tests.test_csprng_retry_race import queues_a_and_b

    for mod in (wire_mod, boto_mod):
        monkeypatch.setattr(mod, "backoff", lambda attempt: 5.0)
    with queues_a_and_b(real_s3, real_bucket) as (proxy, qa, qb):
        qa.create_topic("drop")
        qa.register_producer("p").publish("drop", {"n": 1})
        b = qb.register_consumer("b", ["drop"])
        proxy.set_rules([FaultRule("drop_answer", 1.0, methods=frozenset({"PUT"}),
                                   prefix="drop/leases/")])
        proxy.arm()
        got: dict[str, Any] = {}
        t = threading.Thread(target=lambda: got.__setitem__("b", b.poll(1)))
        t.start()
        assert proxy.wait_for(lambda: len(proxy.fault_log()) > 0, 20)
        proxy.disarm()
        t.join(60)
        assert not t.is_alive()
        assert [m.payload for m in got["b"]] == [{"n": 1}], (
            "the lease landed (ours) but the poll gave the message up")


# -- 4. refresh and release retries in the simulation (M3, M4 survive the suite) ------------

from pawn_queue_sync.protocol.effects import Put  # noqa: E402
from pawn_queue_sync.protocol.lease import reap, release  # noqa: E402

from .sim_s3 import SimS3  # noqa: E402

TIGHT = CsprngSettings(jitter_min_ms=5, jitter_max_ms=5, verify_retries=0,
                       verify_retry_delay_ms=0)
OLD = LeaseBody.new("h", "m", ORIGIN, 30.0)


def _seed():
    yield Put(KEY, OLD.encode())
    return None


def _holder_believes(outcome) -> bool:
    return outcome.error is None and outcome.value is not None


def _world(holder, honour: bool = True) -> tuple[SimS3, dict]:
    """h's lease (OLD) was written at t=0 and is stale by now (the janitor judged it).
    From 1 ms the holder acts on it (``holder``); its write's first attempts are lost and
    the S3 layer resends it 30 ms later. From 2 ms the janitor reaps it; from 3 ms c
    claims the key (done by ~15 ms); from 40 ms d tries too. Zero one-way delays: all
    within any bound."""
    sim = SimS3(if_none_match=False, if_match=False, honour_retry_by=honour)
    sim.spawn("seed", _seed(), start=0.0, delays=0.0)
    sim.spawn("h", holder, start=0.001, delays=[(0, 0), (0, 0, 0.030), (0, 0)])
    sim.spawn("j", reap(KEY, OLD.token, NO_CAS, TIGHT), start=0.002, delays=0.0)
    sim.spawn("c", claim_csprng(KEY, LeaseBody.new("c", "m", ORIGIN, 30.0), TIGHT,
                                random.Random(1)), start=0.003, delays=0.0)
    sim.spawn("d", claim_csprng(KEY, LeaseBody.new("d", "m", ORIGIN, 30.0), TIGHT,
                                random.Random(2)), start=0.040, delays=0.0)
    return sim, sim.run()


@pytest.mark.parametrize("honour", [True, False], ids=["bounded", "unbounded-client"])
def test_a_late_refresh_retry_never_makes_two_holders(honour: bool) -> None:
    """Without the bound on the refresh PUT, its retry lands at 31 ms on c's verified
    lease, and the refresh's re-check (2 x jitter_min later) finds its own bytes: h and c
    both hold the message ('unbounded-client': the schedule races). With it, h's retry is
    not sent, its re-check finds c's lease: LeaseLostError; c alone holds it. Fails
    when refresh() drops retry_by (mutant M3)."""
    _sim, out = _world(refresh(KEY, OLD.token, LeaseBody.new("h", "m", ORIGIN, 30.0),
                              NO_CAS, TIGHT), honour)
    holders = [n for n in ("h", "c", "d") if _holder_believes(out[n])]
    want = ["c"] if honour else ["h", "c"]  # unbounded: the schedule really races
    assert holders == want, (holders, {n: (o.value, o.error) for n, o in out.items()})
    if honour:  # h's write never landed and c's lease replaced its own: lost, not "try again"
        assert isinstance(out["h"].error, LeaseLostError), out["h"].error


@pytest.mark.parametrize("honour", [True, False], ids=["bounded", "unbounded-client"])
def test_a_late_release_retry_never_makes_two_holders(honour: bool) -> None:
    """Without the bound on the release DELETE, its retry lands at 31 ms and removes c's
    verified lease; d claims the free key at 40 ms: c and d both hold the message. Fails
    when release() drops retry_by (mutant M4)."""
    _sim, out = _world(release(KEY, OLD.token, NO_CAS, TIGHT), honour)
    holders = [n for n in ("c", "d") if _holder_believes(out[n])]
    want = ["c"] if honour else ["c", "d"]  # unbounded: the schedule really races
    assert holders == want, (holders, {n: (o.value, o.error) for n, o in out.items()})


# -- 5. a store refusing lease writes looks like an empty topic ------------------------------


@pytest.mark.parametrize("fault", ["slowdown_503", "error_500"])
def test_a_store_refusing_every_lease_write_is_an_error_not_an_empty_topic(
    real_s3: Any, real_bucket: str, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """queue.claims.claim_batch: "every lease write that did not meet a rival failed (a
    full disk, a store refusing writes): say so, rather than look like an empty topic".
    SeaweedFS through the fault proxy answering every lease PUT with 503 SlowDown (or
    500): before 3406363 the poll raised StoreUnavailable after the retries; now the
    first attempt's failure becomes a refused retry (DeadlineExceeded), which the claim
    swallows, the verification LIST finds nothing and poll() returns [] -- as for an
    empty topic, poll after poll. (Backoff fixed at 0.5 s: past the retry bound.)"""
    from pawn_queue_sync.errors import StorageError as _StorageError
    from tests.fault_proxy import FaultRule
    from tests.test_csprng_retry_race import queues_a_and_b

    for mod in (wire_mod, boto_mod):
        monkeypatch.setattr(mod, "backoff", lambda attempt: 0.5)
    with queues_a_and_b(real_s3, real_bucket) as (proxy, qa, qb):
        topic = f"refuse{fault[-3:]}"
        qa.create_topic(topic)
        qa.register_producer("p").publish(topic, {"n": 1})
        b = qb.register_consumer("b", [topic])
        proxy.set_rules([FaultRule(fault, 1.0, methods=frozenset({"PUT"}),
                                   prefix=f"{topic}/leases/")])
        proxy.arm()
        outcomes = []
        for _ in range(3):
            try:
                outcomes.append(b.poll(1))
            except _StorageError as exc:
                outcomes.append(exc)
        proxy.disarm()
        assert len(proxy.fault_log()) >= 3  # every poll's lease PUT was refused
        assert all(isinstance(o, _StorageError) for o in outcomes), (
            f"poll() under a lease-write outage: {outcomes!r}")


# -- 6. the bound counts from the check's send, not its answer (M8 survives the suite) -------

from .test_protocol_csprng import Claimer, Schedule, run_schedule  # noqa: E402

#: c1's HEAD takes 4.999 ms each way (the key free when it arrives at 4.999 ms), its
#: answer back at 9.998 ms; c1's PUT's first attempt is lost and the S3 layer resends it
#: 4.9 ms later (14.898 ms: within jitter_min of the *answer*, not of the send), landing
#: at 19.897 ms. c0 starts at 5 ms (the key free), writes, verifies and confirms by 15 ms.
LATE_ANSWER = Schedule(
    CsprngSettings(jitter_min_ms=5, jitter_max_ms=5, verify_retries=0, verify_retry_delay_ms=0),
    (
        Claimer(start_ms=5, delays_us=((0, 0),), seed=0),
        Claimer(start_ms=0, delays_us=((4_999, 4_999), (4_999, 0, 4_900), (0, 0)), seed=0),
    ),
)


def test_the_retry_bound_counts_from_sending_the_check() -> None:
    """Every one-way delay under jitter_min: one believer. A retry bound counted from the
    check's answer (``sent`` read after the HEAD) lets c1's resend land on c0's confirmed
    lease: two believers."""
    assert LATE_ANSWER.max_delay_ms < LATE_ANSWER.settings.jitter_min_ms
    _sim, won = run_schedule(LATE_ANSWER)
    assert list(won) == ["c0"], won


# -- 7. pinning what the suite leaves open (M10c/M11c, M14 survive it) -----------------------


@PATHS
def test_a_retry_past_retry_by_is_refused_without_waiting_its_backoff(
    recorder: Recorder, fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """base.py: "one whose backoff would end past it is not made (DeadlineExceeded)". A
    503 and a 3 s backoff ending past retry_by: DeadlineExceeded at once -- the caller
    (a csprng claim inside a poll) does not sleep the backoff first."""
    for mod in (wire_mod, boto_mod):
        monkeypatch.setattr(mod, "backoff", lambda attempt: 3.0)
    slept: list[float] = []
    real_sleep = time.sleep
    me = threading.current_thread()

    def sleep(seconds: float) -> None:
        if threading.current_thread() is me:
            slept.append(seconds)
        real_sleep(min(seconds, 0.01))

    monkeypatch.setattr(time, "sleep", sleep)
    recorder.reply = _free_key_slow_server
    store = store_at(recorder.endpoint(), fast=fast, max_attempts=4)
    with pytest.raises(DeadlineExceeded):
        store.put("t/k", b"{}", retry_by=time.monotonic() + 0.2)
    assert len(recorder.seen) == 1
    assert 3.0 not in slept, slept


class Refusing(MemoryStore):
    """Every write carrying retry_by: not applied, its retry refused (DeadlineExceeded)."""

    def put(self, key: str, body: bytes, *, if_none_match: bool = False,
            if_match: str | None = None, deadline: float | None = None,
            retry_by: float | None = None) -> PutResult:
        if retry_by is not None:
            raise DeadlineExceeded("put_object: the retry-by time passed", key=key)
        return super().put(key, body)


def test_a_take_over_whose_write_is_refused_gives_up_quietly() -> None:
    """segments.take_over: "None ... when our write could not be sent in time and did
    not land (the stale version stays for a later take-over)"."""
    from pawn_queue_sync.protocol import segments

    store = Refusing()
    stale = store.put(KEY, OLD.encode()).etag
    mine = LeaseBody.new("me", "m", ORIGIN, 30.0)
    assert run(segments.take_over(NO_CAS, KEY, stale, mine, QUICK), store,
               SystemClock()) is None
    assert store.get(KEY).etag == stale


def _ours_then_slow(seen: Seen) -> Reply:
    if seen.method == "HEAD":
        return 200, {"ETag": '"abc"',
                     "Last-Modified": "Thu, 26 Nov 2026 10:00:00 GMT"}, b""
    return (503, {"Content-Type": "application/xml"},
            b"<Error><Code>SlowDown</Code><Message>later</Message></Error>")


@PATHS
def test_a_release_delete_is_not_retried_past_the_bound_on_a_real_store(
    recorder: Recorder, fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """release() without If-Match through effects.run on the S3 store (the path the
    simulator skips: it reads the effect, not what perform() passes the store): the
    HEAD shows our lease, every DELETE gets 503 and each retry would leave past
    jitter_min after the HEAD: one DELETE, DeadlineExceeded."""
    for mod in (wire_mod, boto_mod):
        monkeypatch.setattr(mod, "backoff", lambda attempt: 0.3)
    recorder.reply = _ours_then_slow
    store = store_at(recorder.endpoint(), fast=fast, max_attempts=4)
    with pytest.raises(DeadlineExceeded):
        run(release(KEY, "abc", NO_CAS, QUICK), store, SystemClock())
    assert [s.method for s in recorder.seen] == ["HEAD", "DELETE"]


# -- 1b. the clock-domain defect, end to end: the scenario-1 duplicate comes back -------------


def test_a_retried_lease_put_with_another_clock_origin_never_takes_a_verified_lease(
    real_s3: Any, real_bucket: str
) -> None:
    """tests/test_csprng_retry_race.py, except that consumer B's queue runs on a clock
    with another monotonic origin (PawnQueue(config, clock=...): "any clock"): B's lease
    PUT is reset by the proxy, its retry_by is an hour away for the S3 store, the S3
    layer retries late, and the retry overwrites A's verified lease."""
    from tests.test_csprng_retry_race import race_rounds

    race_rounds(real_s3, real_bucket, b_clock=OffsetClock(3600.0), name="clock")
