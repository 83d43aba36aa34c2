"""Leases: who may process a message, for how long, and how that is proven.

A lease is the object ``{topic}/leases/{message_id}.lease`` holding pawn-queue's JSON
(``consumer_id``, ``message_id``, ``claimed_at``, ``expires_at``, ``nonce``). Its ETag is
the *lease token*: refresh, ack and nack act only while the stored lease still has our
token (fencing).

Staleness is judged by the server's clock only: a lease is stale when the server's
current time (the Date of a response) is more than ``visibility_timeout`` past the
lease object's LastModified. A skewed client clock therefore neither steals a live
lease nor keeps a dead one. ``expires_at`` is still written for pawn-queue readers.

Every protocol here is a generator of effects (see :mod:`.effects`), so it runs
unchanged against a real store and against the simulated one in the tests.
"""

from __future__ import annotations

import bisect
import functools
import random
import secrets
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Literal, TypeVar

import attrs

from ..encoding import canonical_json, iso, md5_hex
from ..errors import (
    ConditionFailed,
    DeadlineExceeded,
    LeaseLostError,
    ObjectNotFound,
    StorageError,
)
from ..storage.base import PutResult
from .effects import Delete, Get, Head, List, Now, Parallel, Protocol, Put, Sleep

Strategy = Literal["conditional_write", "csprng_verify"]
#: What a claim still holds during verification: one token, or key -> token for a batch.
H = TypeVar("H", str | None, dict[str, str])

#: Extra seconds a lease must be past its visibility timeout before anyone removes it;
#: absorbs the one-second resolution of LastModified and Date.
STALE_GRACE_SECONDS = 1.0


@attrs.frozen
class CsprngSettings:
    """The knobs of the csprng_verify claim (milliseconds)."""

    jitter_min_ms: int = 100
    jitter_max_ms: int = 400
    verify_retries: int = 2
    verify_retry_delay_ms: int = 150
    #: The server's LIST is read-after-write consistent (AWS S3, SeaweedFS, MinIO): a
    #: consumer may check and verify a whole batch of claims with listings. False: one
    #: claim at a time with HEADs (:func:`claim_csprng`).
    consistent_list: bool = True


@attrs.frozen
class Capabilities:
    """What the server honours, found by the probe at setup."""

    if_none_match: bool
    if_match: bool

    @property
    def strategy(self) -> Strategy:
        return "conditional_write" if self.if_none_match else "csprng_verify"


@attrs.frozen
class LeaseBody:
    """The lease object's content: pawn-queue's ``LeaseContent`` fields, plus
    ``message_key`` (the key of the message object the lease was written for) when
    known. pawn-queue 0.1.3 reads leases with ``LeaseContent.from_dict``, which ignores
    fields it does not know; the key lets a janitor that reaps an abandoned lease
    record the abandoned delivery on the very object (a message key is
    ``{created_at}-{id}.json``: the id alone does not give it)."""

    consumer_id: str
    message_id: str
    claimed_at: str
    expires_at: str
    nonce: str
    message_key: str | None = None

    @classmethod
    def new(
        cls, consumer_id: str, message_id: str, now: datetime, visibility: float,
        claimed_at: str | None = None, message_key: str | None = None,
    ) -> LeaseBody:
        return cls(
            consumer_id=consumer_id,
            message_id=message_id,
            claimed_at=claimed_at or iso(now),
            expires_at=iso(now + timedelta(seconds=visibility)),
            nonce=secrets.token_hex(32),
            message_key=message_key,
        )

    def encode(self) -> bytes:
        """Canonical JSON; without ``message_key`` exactly pawn-queue's five fields."""
        return canonical_json(attrs.asdict(self, filter=lambda _a, v: v is not None))

    @property
    def token(self) -> str:
        """The ETag most servers give these bytes (their MD5). Only a fallback: with
        SSE-KMS or some gateways the ETag is not the MD5, so a write's token is the
        ETag its answer carries (:func:`_token_of`)."""
        return md5_hex(self.encode())


def _token_of(result: PutResult, body: LeaseBody) -> str:
    """Our token for a lease just written: the ETag the server returned for the PUT,
    or the MD5 of the bytes if it returned none."""
    return result.etag or body.token


def is_stale(
    last_modified: datetime | None, server_now: datetime | None, visibility: float
) -> bool:
    """True when a lease last written at ``last_modified`` has expired by the server's
    clock ``server_now``; a lease is never stale under its visibility timeout, nor
    when the server did not give either time (None: it cannot be judged, so it is live;
    no client clock stands in for the server's)."""
    if last_modified is None or server_now is None:
        return False
    age = (server_now - last_modified).total_seconds()
    return age > visibility + STALE_GRACE_SECONDS


# -- claims ---------------------------------------------------------------------------


def claim_conditional(
    key: str, body: LeaseBody, confirm: CsprngSettings | None = None
) -> Protocol[str | None]:
    """Claim with ``If-None-Match: *``: the server lets exactly one writer create the
    lease. Returns our token, or None when someone else holds it.

    ``confirm`` is for servers that honour If-None-Match but not If-Match: there a
    janitor's reap is HEAD-then-DELETE and may remove a lease created between the two.
    We look again ``2 x jitter_min_ms`` after the create and give up if it is gone,
    which catches any such DELETE within the bound of docs/guarantees.md.
    """
    try:
        result = yield Put(key, body.encode(), if_none_match=True)
    except ConditionFailed:
        return None
    token = _token_of(result, body)
    if confirm is not None:
        yield Sleep(_confirm_delay(confirm))
        if not (yield from _still_ours(key, token)):
            return None
    return token


def _confirm_delay(settings: CsprngSettings) -> float:
    """How long after our write we look again when others may act on the key by
    verify-then-act: a rival's check and its write each take under jitter_min."""
    return 2 * settings.jitter_min_ms / 1000.0


def claim_csprng(
    key: str, body: LeaseBody, settings: CsprngSettings, rng: random.Random | None = None
) -> Protocol[str | None]:
    """Claim on a server without conditional writes (pawn-queue's 4 steps).

    1. check the key is free, then write our bytes (a 256-bit nonce makes them unique);
    2. sleep a random jitter in [jitter_min, jitter_max] so rival writes land;
    3. verify the stored ETag is ours ``verify_retries + 1`` times;
    4. sleep ``jitter_min`` more and confirm once more.

    Safe when every request's one-way delay is below ``jitter_min_ms`` (see
    docs/guarantees.md); returns our token, or None when we lost. The write is not
    retried later than the check allows (:func:`_checked`): a retry landing late
    could overwrite a rival's lease after the rival verified it. Raises the store's
    error when the write failed (DeadlineExceeded when its retry was refused and
    nothing landed: :func:`_write_lease`).
    """
    rng = rng or random.SystemRandom()
    retry_by = yield from _checked(_free(key), listing_fresh_for(settings))
    if retry_by is None:
        return None  # someone holds it already: never overwrite a lease blindly
    token = yield from _write_lease(key, body, retry_by, listing_fresh_for(settings))
    if token is None:
        return None
    return (yield from _verify(settings, rng, token, functools.partial(_kept, key)))


def _checked(check: Protocol[bool], fresh: float) -> Protocol[float | None]:
    """Run ``check`` (one request: :func:`_free`, :func:`_still_ours`): None when it
    fails; else the last instant a write or delete relying on it may still be retried:
    ``fresh`` (jitter_min) after sending the check, which the server answered later.
    A request sent by then lands under ``2 x fresh`` after the check, as one made at
    once on the answer does, given one-way delays under ``fresh`` (docs/guarantees.md).
    (A check answered later than that leaves no time for retries: the first attempt,
    made on the answer, is the only one.)"""
    sent = yield Now()
    if not (yield from check):
        return None
    return sent + fresh


def _write_lease(
    key: str, body: LeaseBody, retry_by: float, in_flight: float
) -> Protocol[str | None]:
    """Write a csprng lease on a key just found free; no retry leaves after
    ``retry_by``. Returns our token. When ``retry_by`` cut the retries short, an
    attempt sent in time may still have been applied (only its answer lost) or still
    be on its way, so we wait ``in_flight`` (the one-way bound, jitter_min) and read
    the key (:func:`_landed`): our bytes -> the token the server shows (on to
    verification, as for any write); a rival's -> None (lost); nothing -> the write
    failed, and its DeadlineExceeded is raised (a store refusing lease writes is an
    error, not an empty topic). Other store errors are raised."""
    data = body.encode()
    try:
        return _token_of((yield Put(key, data, retry_by=retry_by)), body)
    except DeadlineExceeded as cut:
        # an attempt sent by retry_by may still be on its way: it lands within the
        # one-way bound (``in_flight``, jitter_min) of the refusal at the latest
        yield Sleep(in_flight)
        found, token = yield from _landed(key, data)
        if not found:
            raise cut from None
        return token


def _landed(key: str, data: bytes) -> Protocol[tuple[bool, str | None]]:
    """After a write of ``data`` at ``key`` whose answer we never got: (whether any
    object is there, the token of ours -- the ETag the server shows, whatever its kind,
    so servers whose ETags are not MD5s are judged right -- or None when the object
    is another's)."""
    try:
        got = yield Get(key)
    except ObjectNotFound:
        return False, None
    return True, (got.etag if got.body == data else None)


def _verify(
    settings: CsprngSettings, rng: random.Random, held: H, check: Callable[[H], Protocol[H]]
) -> Protocol[H]:
    """Steps 2-4 after the write(s): a random jitter, ``verify_retries + 1`` rounds
    ``verify_retry_delay_ms`` apart, then ``jitter_min`` and a final round. ``check`` is
    one round: what of ``held`` is still ours (falsy: nothing, and we stop)."""
    yield Sleep(rng.uniform(settings.jitter_min_ms, settings.jitter_max_ms) / 1000.0)
    for attempt in range(settings.verify_retries + 1):
        if attempt:
            yield Sleep(settings.verify_retry_delay_ms / 1000.0)
        held = yield from check(held)
        if not held:
            return held
    yield Sleep(settings.jitter_min_ms / 1000.0)
    return (yield from check(held))


def _kept(key: str, token: str | None) -> Protocol[str | None]:
    """One verification round of a single claim: our token, or None once it is gone."""
    return token if token and (yield from _still_ours(key, token)) else None


def _free(key: str) -> Protocol[bool]:
    """True when no object (lease) exists at ``key``."""
    try:
        yield Head(key)
    except ObjectNotFound:
        return True
    return False


def listing_fresh_for(settings: CsprngSettings) -> float:
    """How long after *sending* a LIST of the lease prefix its "key free" may stand in
    for a HEAD of the key: jitter_min. The key was free when the server built the
    listing, after we sent it; our PUT, sent within jitter_min of that and arriving
    within jitter_min more (the bound), lands under 2 x jitter_min after the check,
    as a HEAD-then-PUT does (docs/guarantees.md)."""
    return settings.jitter_min_ms / 1000.0


def claim_csprng_batch(
    prefix: str,
    claims: Sequence[tuple[str, LeaseBody]],
    listed_at: float,
    settings: CsprngSettings,
    rng: random.Random | None = None,
    fresh_for: float | None = None,
    group: int | None = None,
    relist_after: float | None = None,
    ranges: KeyRange | None = None,
    on_written: Callable[[list[str]], object] | None = None,
    errors: list[StorageError] | None = None,
) -> Protocol[list[str | None]]:
    """:func:`claim_csprng` for many lease keys under ``prefix`` at once; returns our
    token or None per claim, in order. Needs a read-after-write consistent LIST.
    ``errors`` (if given) receives the store errors of lease writes that failed (their
    claims are None, like lost ones), so a caller can tell a failing store from rivals.

    The keys must have been free (or reaped) after a LIST of ``prefix`` sent at
    ``listed_at`` (the monotonic clock): that listing is the "is it free" check while
    younger than ``fresh_for`` (default :func:`listing_fresh_for`); later, a HEAD per key.
    The PUTs go in parallel in key order, ``group`` at a time (what the pool sends at
    once; default all); before a group, a listing older than ``relist_after`` seconds
    (default: never) is replaced by a LIST of the keys still to write -- one request
    instead of a HEAD per key once it would have gone stale -- and keys the new one
    shows held are given up. One jitter follows the last answer, and every
    verification round is one LIST of the range our keys span, in which a claim
    survives only while its key shows our token. Claims on a narrow range of keys
    keep those listings short; ``ranges`` (default: a new one) lists them and may
    carry its estimate of how crowded they are from one batch to the next.
    ``on_written`` is called with the keys written, before the jitter (a caller may
    start reading what the claims are for while verification waits).

    A key given more than once is claimed once, for its first claim; the others get
    None (one lease cannot stand for two claims).
    """
    rng = rng or random.SystemRandom()
    fresh = listing_fresh_for(settings) if fresh_for is None else fresh_for
    first: dict[str, int] = {}
    for i, (key, _body) in enumerate(claims):
        first.setdefault(key, i)
    ordered = sorted((claims[i] for i in first.values()), key=lambda claim: claim[0])
    size = max(1, group or len(ordered))
    keys = [key for key, _ in ordered]
    ranges = ranges or KeyRange(prefix)
    taken: set[str] = set()  # held by others in the newest listing
    written: dict[str, str | None] = {}
    for start in range(0, len(ordered), size):
        chunk = ordered[start : start + size]
        if relist_after is not None:
            now = yield Now()
            if now > listed_at + relist_after:
                try:  # sent at `now`: the new origin for every key still to write
                    taken = set((yield from ranges.etags(keys[start:])))
                except StorageError:
                    pass  # the old listing stands; past it, each PUT HEADs its key
                else:
                    listed_at = now
        until = listed_at + fresh
        todo = [(key, body) for key, body in chunk if key not in taken]
        done = (
            (yield Parallel(tuple(_put_if_free(k, b, until, fresh, errors) for k, b in todo)))
            if todo else []
        )
        written.update(zip((key for key, _ in todo), done))
    held = {key: token for key, token in written.items() if token is not None}
    if held:
        if on_written is not None:
            on_written(list(held))
        held = yield from _verify(settings, rng, held, ranges.still_ours)
    return [held.get(key) if first[key] == i else None for i, (key, _) in enumerate(claims)]


@attrs.define
class KeyRange:
    """Lists just the part of ``prefix`` that a set of keys spans: from just before the
    smallest to the largest, sized by how crowded the range was last time, paging on
    only when others' keys in it were underestimated. A LIST costs the server and the
    client in proportion to the keys it returns (SeaweedFS: ~40 us each, ~2 ms a
    request), so a batch claimed on a narrow range verifies in short listings."""

    prefix: str
    #: others' keys listed per key of ours in the range, as last seen (1: a guess)
    crowd: float = 1.0
    #: keys asked for beyond the estimate (a page more costs a request)
    slack: int = 16

    def etags(self, keys: Sequence[str]) -> Protocol[dict[str, str]]:
        """key -> ETag of every object from before ``keys[0]`` through ``keys[-1]``
        (``keys`` sorted, non-empty)."""
        lo, hi = keys[0], keys[-1]
        # lo[:-1] sorts just before lo: every key from lo on is after it.
        after: str | None = lo[:-1] if len(lo) > len(self.prefix) else None
        etags: dict[str, str] = {}
        left = len(keys)
        while True:
            limit = left + int(left * self.crowd) + self.slack
            listing = yield List(self.prefix, start_after=after, limit=limit)
            objects = listing.objects
            etags.update((info.key, info.etag) for info in objects)
            if not listing.truncated or not objects or objects[-1].key >= hi:
                break
            after = objects[-1].key
            left = len(keys) - bisect.bisect_right(keys, after)
        spanned = sum(1 for key in etags if lo <= key <= hi)
        self.crowd = max(0.0, spanned / len(keys) - 1.0)
        return etags

    def still_ours(self, held: dict[str, str]) -> Protocol[dict[str, str]]:
        """One verification round for a batch: the claims whose key the listing shows
        with our token (absent or another ETag: lost for good, as our bytes are unique)."""
        etags = yield from self.etags(sorted(held))
        return {key: token for key, token in held.items() if etags.get(key) == token}


def _put_if_free(
    key: str, body: LeaseBody, fresh_until: float, fresh: float,
    errors: list[StorageError] | None = None,
) -> Protocol[str | None]:
    """Write our lease unless the key is held: the caller's listing says it is free
    until ``fresh_until`` (``fresh`` seconds after it was sent), later a HEAD must. No
    retry of the write leaves after ``fresh_until`` (or the HEAD's bound:
    :func:`_checked`). Returns our token, or None (held, or an error, added to
    ``errors``: a lease we may have written goes stale and is reaped)."""
    try:
        if (yield Now()) > fresh_until:
            retry_by = yield from _checked(_free(key), fresh)
            if retry_by is None:
                return None
            fresh_until = retry_by
        return (yield from _write_lease(key, body, fresh_until, fresh))
    except StorageError as exc:
        if errors is not None:
            errors.append(exc)
        return None


def _still_ours(key: str, token: str) -> Protocol[bool]:
    try:
        info = yield Head(key)
    except ObjectNotFound:
        return False
    return bool(info.etag == token)


def claim(
    caps: Capabilities | Strategy, key: str, body: LeaseBody, settings: CsprngSettings,
    rng: random.Random | None = None,
) -> Protocol[str | None]:
    """The claim protocol for the server's capabilities (or a bare strategy name, which
    assumes the server honours If-Match)."""
    if isinstance(caps, str):
        caps = Capabilities(if_none_match=caps == "conditional_write", if_match=True)
    if caps.strategy == "conditional_write":
        return claim_conditional(key, body, None if caps.if_match else settings)
    return claim_csprng(key, body, settings, rng)


# -- acting on a held lease ----------------------------------------------------------------


def refresh(
    key: str, token: str, body: LeaseBody, caps: Capabilities,
    settings: CsprngSettings | None = None,
) -> Protocol[str]:
    """Rewrite our lease (new ``expires_at``, new LastModified) only if it is still ours.
    Returns the new token; raises LeaseLostError otherwise.

    Without If-Match this is check, write, and check again ``2 x jitter_min_ms`` later
    (``settings``, default CsprngSettings()): between our check and our write the lease
    may have been reaped and taken, and the taker's write may land just after ours.
    The write leaves within ``jitter_min_ms`` of the check or not at all; when that
    cut its retries short, the look after the delay tells what happened: our new
    bytes (refreshed), our old ones (not refreshed: the DeadlineExceeded is raised, the
    lease still ours under ``token``) or another's (lost).
    """
    if caps.if_match:
        try:
            result = yield Put(key, body.encode(), if_match=token)
        except ConditionFailed:
            raise LeaseLostError(body.message_id, "refresh found another lease") from None
        return _token_of(result, body)
    settings = settings or CsprngSettings()
    retry_by = yield from _checked(_still_ours(key, token), listing_fresh_for(settings))
    if retry_by is None:
        raise LeaseLostError(body.message_id, "refresh found another lease")
    data = body.encode()
    try:
        new = _token_of((yield Put(key, data, retry_by=retry_by)), body)
    except DeadlineExceeded as cut:
        # the write may land up to jitter_min after the refusal (an attempt still on
        # its way): confirm 2 x jitter_min after that, as the normal path does after
        # its answer
        yield Sleep(listing_fresh_for(settings) + _confirm_delay(settings))
        found, new_token = yield from _landed(key, data)
        if new_token is not None:
            return new_token  # refreshed: its answer was lost
        if found and (yield from _still_ours(key, token)):
            raise cut from None  # not refreshed, still ours under ``token``
        raise LeaseLostError(body.message_id, "lease replaced during refresh") from None
    yield Sleep(_confirm_delay(settings))
    if (yield from _still_ours(key, new)):
        return new
    raise LeaseLostError(body.message_id, "lease overwritten during refresh")


def release(
    key: str, token: str, caps: Capabilities, settings: CsprngSettings | None = None
) -> Protocol[bool]:
    """Delete our lease if it is still ours; True if we deleted it. Without If-Match,
    a HEAD then a DELETE sent within ``jitter_min_ms`` of it (``settings``, default
    CsprngSettings()), never later: a late retry could remove a lease written since
    (DeadlineExceeded is raised then; the DELETE may or may not have been applied)."""
    if caps.if_match:
        try:
            yield Delete(key, if_match=token)
        except ConditionFailed:
            return False
        return True
    fresh = listing_fresh_for(settings or CsprngSettings())
    retry_by = yield from _checked(_still_ours(key, token), fresh)
    if retry_by is None:
        return False
    yield Delete(key, retry_by=retry_by)
    return True


def reap(
    key: str, etag: str, caps: Capabilities, settings: CsprngSettings | None = None
) -> Protocol[bool]:
    """Janitor: remove a stale lease only if it is still the version judged stale."""
    return release(key, etag, caps, settings)
