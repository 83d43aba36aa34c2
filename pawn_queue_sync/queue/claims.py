"""Claiming messages stored one object each: the lease first (a conditional_write
claim, or a csprng_verify batch), then the message body. A claim whose message has
vanished (acked meanwhile) gives its lease back; a message delivered too often is
dead-lettered at its claim; objects that are not messages are moved to the
dead-letter prefix with a reason and never break a poll."""

from __future__ import annotations

import base64
import logging
import uuid
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import attrs

from .. import layout
from ..errors import ObjectNotFound, StorageError
from ..protocol import lease as leases
from ..protocol.effects import run
from ..storage.base import GetResult
from .claimant import Claimant, attempts_of, decode_message
from .message import Message
from .planning import Candidate
from .registry import NAMESPACE

log = logging.getLogger(__name__)

#: csprng_verify batch claims send their PUTs this many at a time at most: a group must
#: leave while the lease listing is fresh (jitter_min), and sending 64 costs ~60 ms of
#: client CPU on a busy machine; a re-listing before a group costs one request.
_CSPRNG_GROUP = 32


@attrs.frozen
class Won:
    """A claim we won: the message key, its id, our lease and when we started writing
    it (monotonic; the time fence counts the lease's age from there)."""

    key: str
    mid: str
    lease_key: str
    token: str
    started: float


def claim_each(
    claimant: Claimant, topic: str, candidates: Sequence[Candidate]
) -> list[Message]:
    """Claim every candidate on its own (conditional_write), in parallel on the claim
    pool: the messages claimed (not those a rival holds). Raises the first store
    error when every claim that did not lose a race failed (a full disk, a store
    refusing writes), rather than look like an empty topic."""
    outcomes = claimant.in_parallel(lambda c: claim_safely(claimant, topic, *c), candidates)
    errors = [e for e in outcomes if isinstance(e, StorageError)]
    results = [m for m in outcomes if isinstance(m, Message)]
    if errors and not results:
        raise errors[0]
    return results


def claim_safely(
    claimant: Claimant, topic: str, key: str, mid: str
) -> Message | StorageError | None:
    """The claimed message, None when a rival holds it, or the store's error."""
    try:
        return claim(claimant, topic, key, mid)
    except StorageError as exc:
        log.warning("claim of %s failed: %s", key, exc)
        return exc


def claim(claimant: Claimant, topic: str, key: str, mid: str) -> Message | None:
    """Claim the lease of message ``mid`` (at ``key``), then read it."""
    ctx = claimant.ctx
    lease_key = layout.lease_key(topic, mid)
    body = leases.LeaseBody.new(claimant.id, mid, ctx.clock.now(), ctx.visibility,
                                message_key=key)
    started = ctx.clock.monotonic()
    token = run(
        leases.claim(ctx.caps, lease_key, body, ctx.csprng, claimant.rng),
        ctx.store,
        ctx.clock,
    )
    if token is None:
        return None
    return fetch(claimant, topic, Won(key, mid, lease_key, token, started))


def claim_batch(
    claimant: Claimant,
    topic: str,
    candidates: Sequence[Candidate],
    listed_at: float,
    ranges: leases.KeyRange,
) -> list[Message | None]:
    """Claim all candidates' leases in one csprng batch (``listed_at``: when the lease
    LIST that found them free was sent; ``ranges``: the lister of the topic's lease
    ranges). The messages of the leases written are read on the claim pool while
    verification waits out its jitter; those of the claims won are kept (a read needs
    no lease, and no one else may change a message while we prove ours: see
    docs/guarantees.md)."""
    ctx = claimant.ctx
    claims = [
        (layout.lease_key(topic, mid),
         leases.LeaseBody.new(claimant.id, mid, ctx.clock.now(), ctx.visibility,
                              message_key=key))
        for key, mid in candidates
    ]
    message_of: dict[str, str] = {}  # as claim_csprng_batch: a key's first claim
    for (key, _mid), (lease_key, _body) in zip(candidates, claims):
        message_of.setdefault(lease_key, key)
    started = ctx.clock.monotonic()
    threads = ctx.config.polling.claim_threads
    pool = ctx.pool("claim", threads)
    reads: dict[str, Future[GetResult]] = {}
    write_errors: list[StorageError] = []

    def read_ahead(lease_keys: list[str]) -> None:
        for lease_key in lease_keys:
            reads[lease_key] = pool.submit(ctx.store.get, message_of[lease_key])

    try:
        tokens = run(
            leases.claim_csprng_batch(
                layout.leases_prefix(topic), claims, listed_at, ctx.csprng, claimant.rng,
                group=min(threads, _CSPRNG_GROUP),
                relist_after=leases.listing_fresh_for(ctx.csprng) / 2,
                ranges=ranges,
                on_written=read_ahead,
                errors=write_errors,
            ),
            ctx.store, ctx.clock, pool,
        )
    except StorageError as exc:  # leases we wrote go stale and are reaped
        log.warning("claim of %d message(s) on %s failed: %s", len(claims), topic, exc)
        raise
    except BaseException:  # Ctrl-C mid-batch: give back what we wrote, then stop
        withdraw(claimant, claims)
        raise
    if write_errors and not any(tokens):
        # every lease write that did not meet a rival failed (a full disk, a store
        # refusing writes): say so, rather than look like an empty topic
        raise write_errors[0]
    won = [
        Won(key, mid, lease_key, token, started)
        for (key, mid), (lease_key, _body), token in zip(candidates, claims, tokens)
        if token is not None
    ]
    return [fetch_safely(claimant, topic, w, reads.get(w.lease_key)) for w in won]


def withdraw(claimant: Claimant, claims: Sequence[tuple[str, leases.LeaseBody]]) -> None:
    """Delete the leases of an interrupted batch claim that still hold our bytes
    (a lease body is unique: its nonce), so their messages are not left invisible
    for a visibility timeout and then counted as abandoned deliveries. Best effort:
    one GET per claim; what fails goes stale and is reaped as before."""
    store, if_match = claimant.ctx.store, claimant.ctx.caps.if_match
    for lease_key, body in claims:
        try:
            got = store.get(lease_key)
            if got.body == body.encode():
                store.delete(lease_key, if_match=got.etag if if_match else None)
        except StorageError:
            continue


def fetch_safely(
    claimant: Claimant, topic: str, won: Won, read: Future[GetResult] | None
) -> Message | None:
    """:func:`fetch`, a store error logged (and the lease given back) as None."""
    try:
        return fetch(claimant, topic, won, read)
    except StorageError as exc:
        log.warning("fetch of %s failed: %s", won.key, exc)
        return None


def fetch(
    claimant: Claimant, topic: str, won: Won, read: Future[GetResult] | None = None
) -> Message | None:
    """Read the message whose lease we won (or take the read already under way);
    give the lease back if it has vanished or cannot be read, and dead-letter it
    if malformed."""
    key, mid, lease_key, token = won.key, won.mid, won.lease_key, won.token
    ctx = claimant.ctx
    try:
        got = read.result() if read is not None else ctx.store.get(key)
    except ObjectNotFound:  # acked by someone else between our listing and our claim
        claimant.drop_lease(lease_key, token)
        return None
    except StorageError:
        claimant.drop_lease(lease_key, token)
        raise
    try:
        doc = decode_message(got.body, mid)
    except ValueError as exc:
        quarantine(claimant, topic, key, got.body, f"malformed message: {exc}", mid)
        claimant.drop_lease(lease_key, token)
        return None
    attempts = attempts_of(doc)
    if attempts >= ctx.config.polling.max_delivery_count:
        dead_letter_claimed(claimant, topic, won, doc, got.etag, attempts)
        return None
    msg = Message(
        id=mid,
        topic=topic,
        producer_id=doc.get("producer_id"),
        created_at=str(doc.get("created_at", "")),
        payload=doc["payload"],
        key=key,
        lease_key=lease_key,
        lease_token=token,
        lease_written_at=won.started,
        delivery_count=attempts + 1,
        body=doc,
        etag=got.etag,
        consumer=claimant.consumer,
    )
    claimant.track(msg)
    return msg


def dead_letter_claimed(
    claimant: Claimant, topic: str, won: Won, doc: dict[str, Any], etag: str, attempts: int
) -> None:
    """Move a message delivered ``attempts`` (>= ``polling.max_delivery_count``)
    times without an ack to the dead-letter prefix instead of handing it out again,
    then give our lease back. Its last deliveries ended without a retry or a nack:
    their consumers died (a handler that kills its process would otherwise be
    delivered forever). On an error the message stays, and our lease is given back."""
    ctx = claimant.ctx
    reason = (f"delivered {attempts} times without an ack (the handler's process may "
              f"have died); polling.max_delivery_count is "
              f"{ctx.config.polling.max_delivery_count}")
    last = doc.get("last_error")
    if isinstance(last, str) and last:
        reason += f"; last error: {last}"
    dead = dict(doc)
    dead["dead_letter"] = {
        "reason": reason,
        "consumer_id": claimant.id,
        "at": layout.iso(ctx.clock.now()),
        "delivery_count": attempts,
        "original_key": won.key,
    }
    try:
        ctx.store.put(layout.dead_letter_key(topic, won.mid), layout.canonical_json(dead))
        claimant.delete_version(won.key, etag, None, doc)
    finally:
        claimant.drop_lease(won.lease_key, won.token)
    log.warning("dead-lettered %s/%s at claim: %s", topic, won.mid, reason)
    claimant.emit("dead_lettered", topic, won.mid, delivery_count=attempts, error=reason)


def quarantine_foreign(claimant: Claimant, topic: str, key: str, size: int) -> None:
    """Move an object that is not a message out of ``messages/``."""
    ctx = claimant.ctx
    try:
        limit = 4 * ctx.config.publishing.max_payload_bytes
        raw = ctx.store.get(key).body if size <= limit else None
        quarantine(claimant, topic, key, raw, "foreign object: not a message key", None)
    except ObjectNotFound:
        pass
    except StorageError as exc:
        log.warning("could not move foreign object %s aside: %s", key, exc)


def quarantine(
    claimant: Claimant, topic: str, key: str, raw: bytes | None, reason: str, mid: str | None
) -> None:
    """Dead-letter an unusable object with the reason, then delete the original."""
    ctx = claimant.ctx
    name = mid or str(uuid.uuid5(NAMESPACE, key))
    dl_key = layout.dead_letter_key(topic, name)
    doc: dict[str, Any] = {
        "id": name,
        "topic": topic,
        "producer_id": None,
        "created_at": layout.iso(ctx.clock.now()),
        "payload": None,
        "dead_letter": {
            "reason": reason,
            "original_key": key,
            "consumer_id": claimant.id,
            "at": layout.iso(ctx.clock.now()),
        },
    }
    if raw is not None:
        doc["dead_letter"]["raw_base64"] = base64.b64encode(raw).decode("ascii")
        ctx.store.put(dl_key, layout.canonical_json(doc))
    else:  # too large to inline: keep the bytes by a server-side copy
        ctx.store.copy(key, dl_key)
    ctx.store.delete(key)
    log.warning("moved %s to %s: %s", key, dl_key, reason)
    claimant.emit("dead_lettered", topic, name, error=reason)


__all__ = [
    "Won",
    "claim",
    "claim_batch",
    "claim_each",
    "dead_letter_claimed",
    "fetch",
    "quarantine",
    "quarantine_foreign",
    "withdraw",
]
