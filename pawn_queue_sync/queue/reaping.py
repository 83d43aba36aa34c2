"""The leases of a topic as a poll judges them: one LIST, stale leases (by the
server's clock) removed only if unchanged, each abandoned delivery first counted on
its message."""

from __future__ import annotations

import json
import logging

from .. import layout
from ..errors import ConditionFailed, ObjectNotFound, StorageError
from ..protocol import lease as leases
from ..protocol.effects import run
from ..storage.base import ObjectInfo
from .claimant import Claimant, attempts_of, decode_message

log = logging.getLogger(__name__)

#: How many stale leases one poll removes at most (the rest wait for the next poll).
_REAP_PER_POLL = 200


def live_leases(claimant: Claimant, topic: str) -> tuple[set[str], float]:
    """Ids of messages under a live lease, and when (monotonic) the LIST that found
    them was sent; stale leases are reaped if unchanged (at most _REAP_PER_POLL, in
    parallel on the claim pool), each abandoned delivery first recorded on its
    message (see :func:`reap`). A lease we cannot judge counts as live: an error
    never frees a message."""
    ctx = claimant.ctx
    listed_at = ctx.clock.monotonic()
    listing = ctx.store.list(layout.leases_prefix(topic))
    now = listing.server_time or ctx.store.server_time()
    live: set[str] = set()
    stale: list[tuple[str, ObjectInfo]] = []
    for info in listing.objects:
        mid = layout.lease_message_id(topic, info.key)
        if mid is None:
            continue
        if (not leases.is_stale(info.last_modified, now, ctx.visibility)
                or len(stale) >= _REAP_PER_POLL):
            live.add(mid)
        else:
            stale.append((mid, info))
    if stale:
        reaped = claimant.in_parallel(lambda s: reap(claimant, topic, *s), stale)
        live.update(mid for (mid, _info), done in zip(stale, reaped) if not done)
    return live, listed_at


def reap(claimant: Claimant, topic: str, mid: str, info: ObjectInfo) -> bool:
    """Record the abandoned delivery on the message, then remove the stale lease
    ``info`` if it is still the version judged stale; True when removed. A lease
    refreshed meanwhile stays (the delivery was then counted once too often: the
    count is one too high at worst). A failure to record leaves the lease for a
    later poll: the delivery is never uncounted for a transient error."""
    ctx = claimant.ctx
    try:
        record_abandoned(claimant, topic, mid, info)
        if run(leases.reap(info.key, info.etag, ctx.caps, ctx.csprng), ctx.store, ctx.clock):
            log.info("reaped stale lease on %s/%s", topic, mid)
            claimant.emit("reaped", topic, mid)
            return True
        return False  # refreshed or replaced meanwhile
    except StorageError as exc:
        log.warning("could not reap lease %s: %s", info.key, exc)
        return False


def record_abandoned(claimant: Claimant, topic: str, mid: str, info: ObjectInfo) -> None:
    """Count the delivery whose lease ``info`` went stale on the message itself, as a
    retry counts a failed one: ``attempts`` + 1 and a ``last_error`` saying so,
    written If-Match the message's ETag where the server honours it. The lease names
    the message's key (``message_key``); a lease without it (pawn-queue's, or an
    older version's) is reaped uncounted. The message records the lease version it
    counted (``abandoned_lease``), so a second janitor reaping the same lease does
    not count it again."""
    store = claimant.ctx.store
    try:
        lease = store.get(info.key)
    except ObjectNotFound:
        return  # gone already: nothing to reap
    if lease.etag != info.etag:
        return  # refreshed or replaced since the listing: the reap will leave it
    try:
        lease_doc = json.loads(lease.body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return
    key = lease_doc.get("message_key") if isinstance(lease_doc, dict) else None
    if not isinstance(key, str) or layout.parse_message_key(topic, key) != mid:
        return
    try:
        got = store.get(key)
        doc = decode_message(got.body, mid)
    except (ObjectNotFound, ValueError):
        return  # acked (the lease is an orphan), or malformed: the claim moves it
    if doc.get("abandoned_lease") == info.etag:
        return  # counted by another janitor
    count = attempts_of(doc) + 1
    doc["attempts"] = count
    doc["abandoned_lease"] = info.etag
    doc["last_error"] = (
        f"delivery {count} abandoned: consumer {lease_doc.get('consumer_id')} held "
        "it past the visibility timeout without an ack, retry or nack (its "
        "handler's process may have died)"
    )
    if_match = got.etag if claimant.ctx.caps.if_match and got.etag else None
    try:
        store.put(key, layout.canonical_json(doc), if_match=if_match)
    except ConditionFailed:
        return  # re-published, or counted by another janitor, since our read
    log.warning("%s/%s: delivery %d abandoned (lease not renewed)", topic, mid, count)


__all__ = ["live_leases", "reap", "record_abandoned"]
