"""Settling messages stored one object each: acks (batched, fenced, re-proven when
old), nacks, retries, releases and refreshes. Every action on a message is fenced by
its lease: sent while the lease is certainly ours by the local monotonic clock, or
after a conditional refresh proved it (docs/guarantees.md, Fencing)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, wait
from typing import Any

from .. import layout
from ..errors import ConditionFailed, LeaseLostError, StorageError
from ..protocol import lease as leases
from ..protocol.effects import run
from . import delayed
from .claimant import Claimant
from .message import Message

log = logging.getLogger(__name__)

#: An ack re-proves a message's lease at most this many times before giving up on it
#: for now (it stays leased): each proof must be followed by its delete within the fence.
_ACK_ROUNDS = 3
#: Seconds an ack batch keeps in hand before the fence of its oldest lease (at most a
#: quarter of the fence window): a lease closer to its fence is re-proven first.
_ACK_ROOM_SECONDS = 1.0


# -- fences ----------------------------------------------------------------------------------


def fence_ends(claimant: Claimant, msg: Message) -> float:
    """When (monotonic) our lease stops being certainly ours without asking: the
    deadline of the requests that act on it (the store sends no attempt after it)."""
    ctx = claimant.ctx
    return msg.lease_written_at + ctx.visibility - ctx.fence_margin()


def fresh(claimant: Claimant, msg: Message) -> bool:
    """True while our lease is certainly ours: nobody removes a lease before it is
    stale, and this one was written well within a visibility timeout ago."""
    return claimant.ctx.clock.monotonic() < fence_ends(claimant, msg)


def fresh_to_ack(claimant: Claimant, msg: Message) -> bool:
    """Fresh, with time left to send the deletes: a batch's requests must leave
    before the fence of its oldest lease, so one about to reach its fence is
    re-proven first rather than fail the whole batch by its deadline."""
    ctx = claimant.ctx
    window = ctx.visibility - ctx.fence_margin()
    room = min(_ACK_ROOM_SECONDS, window / 4)
    return ctx.clock.monotonic() + room < fence_ends(claimant, msg)


def fence(claimant: Claimant, msg: Message) -> None:
    """Make sure the lease is ours before acting: recent enough by the local
    monotonic clock, or re-proven with a conditional refresh."""
    if not fresh(claimant, msg):
        renew(claimant, msg)


def renew(claimant: Claimant, msg: Message) -> None:
    """Rewrite our lease, ``msg`` held exclusively: a new token, and the fence counts
    from now. A lease found taken makes the message lost."""
    ctx = claimant.ctx
    body = leases.LeaseBody.new(
        claimant.id, msg.id, ctx.clock.now(), ctx.visibility, claimed_at=None,
        message_key=msg.key,
    )
    started = ctx.clock.monotonic()
    try:
        token = run(
            leases.refresh(msg.lease_key, msg.lease_token, body, ctx.caps, ctx.csprng),
            ctx.store,
            ctx.clock,
        )
    except LeaseLostError:
        claimant.settled(msg, "lost")
        raise
    msg.lease_token = token
    msg.lease_written_at = started


# -- acks ------------------------------------------------------------------------------------


def ack_many(claimant: Claimant, msgs: Iterable[Message]) -> None:
    """See :meth:`Consumer.ack_many <pawn_queue_sync.queue.consumer.Consumer.ack_many>`."""
    # others: being acked by another call, whose outcome is ours (begin_ack waits for
    # a refresh under way)
    todo, lost, others = Message.begin_acks(msgs)
    errors: list[StorageError] = []
    try:
        _ack_fenced(claimant, todo, lost, errors)
    finally:
        for msg in todo:
            msg.end_ack()
    others_error: StorageError | LeaseLostError | None = None
    if others:  # wait for the other ack; where it failed, ack again ourselves
        for msg in others:
            msg.wait_for_ack()
        try:
            ack_many(claimant, others)
        except (StorageError, LeaseLostError) as exc:
            others_error = exc  # reported after our own (a StorageError first)
    unacked = [m for m in todo if m.state == "leased"]
    if unacked:
        cause = errors[0] if errors else None
        why = cause or "their leases could not be re-proven within the fence"
        also = f" ({len(lost)} lost)" if lost else ""
        raise StorageError(
            f"{len(unacked)} message(s) not acked, still leased{also}: {why}",
            key=unacked[0].key,
        ) from cause
    if isinstance(others_error, StorageError):
        raise others_error
    if lost:
        raise LeaseLostError(lost[0].id, f"{len(lost)} message(s) not acked")
    if others_error is not None:
        raise others_error


def _ack_fenced(
    claimant: Claimant, todo: list[Message], lost: list[Message], errors: list[StorageError]
) -> None:
    """Ack ``todo``: fresh leases at once, old ones as their proofs come in; a proof
    that has aged past the fence by the time it is acted on is made again (at most
    _ACK_ROUNDS times). Lost messages go to ``lost``, store errors to ``errors``."""
    pending = todo
    for _ in range(_ACK_ROUNDS):
        ready: list[Message] = []
        old: list[Message] = []
        for msg in pending:
            (ready if fresh_to_ack(claimant, msg) else old).append(msg)
        _delete_acked(claimant, ready, errors)
        pending = []
        for proven in _reproven(claimant, old, lost, errors):
            ready = [m for m in proven if fresh_to_ack(claimant, m)]
            _delete_acked(claimant, ready, errors)
            aged = set(proven).difference(ready)  # proven too long ago: again
            pending.extend(m for m in proven if m in aged)
        if not pending:
            return


def _reproven(
    claimant: Claimant, msgs: list[Message], lost: list[Message], errors: list[StorageError]
) -> Iterator[list[Message]]:
    """Refresh every lease of ``msgs`` in parallel on the claim pool, yielding the
    proven ones in groups as the refreshes finish (not all at the end)."""
    if not msgs:
        return
    ctx = claimant.ctx
    pool = ctx.pool("claim", ctx.config.polling.claim_threads)
    futures = {pool.submit(_reprove, claimant, msg): msg for msg in msgs}
    waiting = set(futures)
    while waiting:
        done, waiting = wait(waiting, return_when=FIRST_COMPLETED)
        proven: list[Message] = []
        for fut in done:
            exc = fut.exception()
            if exc is None:
                proven.append(futures[fut])
            elif isinstance(exc, LeaseLostError):
                lost.append(futures[fut])
            elif isinstance(exc, StorageError):
                errors.append(exc)
            else:
                raise exc
        if proven:
            yield proven


def _reprove(claimant: Claimant, msg: Message) -> None:
    """Refresh the lease of a message being acked (the ack holds it: no one else
    refreshes it meanwhile)."""
    with msg.exclusive():
        renew(claimant, msg)


def _delete_acked(claimant: Claimant, msgs: list[Message], errors: list[StorageError]) -> None:
    """Delete the messages (their fence just checked), mark them acked, then delete
    their leases; a failed message delete leaves them leased (in ``errors``)."""
    if not msgs:
        return
    # No attempt (retries included) leaves after the fence of the oldest: each one
    # is sent while the leases are certainly ours (docs/guarantees.md, Fencing).
    deadline = min(fence_ends(claimant, m) for m in msgs)
    try:
        _delete_messages(claimant, msgs, deadline)
    except StorageError as exc:  # DeadlineExceeded too: they stay leased
        errors.append(exc)
        return
    with claimant.releasing([m.id for m in msgs]):  # still ours until deleted
        for msg in msgs:
            claimant.settled(msg, "acked")
        try:  # by the same deadline: a late one could remove a new holder's lease
            _delete(claimant, [m.lease_key for m in msgs], deadline)
        except StorageError as exc:  # harmless: orphan leases go stale and are reaped
            log.warning("acked, but could not delete %d lease(s): %s", len(msgs), exc)


def _delete_messages(claimant: Claimant, msgs: list[Message], deadline: float) -> None:
    """Delete the message objects of ``msgs``, each only while it is the version
    we were handed (its ETag): a single conditional DELETE, or DeleteObjects
    naming each key's ETag (one request per 1,000, as unconditional). A version
    replaced meanwhile (re-published under its key) stays, to be delivered; its
    ack is done all the same. Where the server ignores If-Match, or ETags in
    DeleteObjects (moto), the delete is unconditional (docs/guarantees.md)."""
    if len(msgs) == 1:
        claimant.delete_version(msgs[0].key, msgs[0].etag, deadline, msgs[0].body)
        return
    store = claimant.ctx.store
    etags = ({m.key: m.etag for m in msgs if m.etag}
             if claimant.ctx.caps.if_match else None)
    failed = set(store.delete_many(
        [m.key for m in msgs], deadline=deadline, **({"etags": etags} if etags else {})
    ))
    # a key not deleted (another version, or an error): once more on its own, which
    # tells a re-published message from ours with a recorded count, or raises
    for msg in msgs:
        if msg.key in failed:
            claimant.delete_version(msg.key, msg.etag, deadline, msg.body)


def _delete(claimant: Claimant, keys: list[str], deadline: float | None = None) -> None:
    store = claimant.ctx.store
    if len(keys) == 1:
        store.delete(keys[0], deadline=deadline)
        return
    failed = store.delete_many(keys, deadline=deadline)
    if failed:
        raise StorageError(f"could not delete {len(failed)} object(s)", key=failed[0])


# -- nack, release, retry, refresh -------------------------------------------------------------


def nack(claimant: Claimant, msg: Message, reason: str | None = None) -> None:
    """See :meth:`Consumer.nack <pawn_queue_sync.queue.consumer.Consumer.nack>`."""
    ctx = claimant.ctx
    with msg.exclusive_unsettled():
        if msg.state in ("acked", "nacked"):
            return  # done (by an ack that just finished, too)
        if msg.state != "leased":
            raise LeaseLostError(msg.id, f"message was {msg.state}")
        fence(claimant, msg)
        doc = dict(msg.body)
        doc["dead_letter"] = {
            "reason": reason or "nacked",
            "consumer_id": claimant.id,
            "at": layout.iso(ctx.clock.now()),
            "delivery_count": msg.delivery_count,
            "original_key": msg.key,
        }
        ctx.store.put(layout.dead_letter_key(msg.topic, msg.id), layout.canonical_json(doc))
        fence(claimant, msg)  # the dead-letter write took time
        # only the version we were handed: a re-published one stays, delivered anew
        claimant.delete_version(msg.key, msg.etag, fence_ends(claimant, msg), msg.body)
        claimant.settled(msg, "nacked")
    claimant.drop_lease(msg.lease_key, msg.lease_token)


def release(claimant: Claimant, msg: Message) -> None:
    """See :meth:`Consumer.release <pawn_queue_sync.queue.consumer.Consumer.release>`."""
    with msg.exclusive():
        if msg.state != "leased" or msg.settling:
            return
        claimant.settled(msg, "released")
    claimant.drop_lease(msg.lease_key, msg.lease_token)


def retry(claimant: Claimant, msg: Message, error: str | None = None,
          delay: float | None = None) -> None:
    """See :meth:`Consumer.retry <pawn_queue_sync.queue.consumer.Consumer.retry>`."""
    with msg.exclusive():
        if msg.state != "leased" or msg.settling:
            return
        fence(claimant, msg)
        doc = delayed.retry_doc(msg.body, msg.delivery_count, error)
        if delay is not None:
            _retry_later(claimant, msg, doc, delay)
        else:
            _record_retry(claimant, msg, doc)
        claimant.settled(msg, "released")
    claimant.drop_lease(msg.lease_key, msg.lease_token)


def _retry_later(claimant: Claimant, msg: Message, doc: dict[str, Any], delay: float
                 ) -> None:
    """The delayed copy first (within our lease's fence), then the message deleted
    (fenced, as a nack deletes it): a crash in between leaves both (delivered again),
    never neither. A failure before the delete was sent (the lease lost, found taken
    by the fence after a slow write; a failed request) removes the copy again: the
    message stays, and whoever takes it next settles it."""
    written = delayed.write_retry(claimant.ctx, msg.topic, msg.id, doc, delay,
                                  deadline=fence_ends(claimant, msg))
    try:
        fence(claimant, msg)  # the delayed write took time
    except BaseException:
        delayed.discard_retry(claimant.ctx, msg.topic, *written)
        raise
    claimant.delete_version(msg.key, msg.etag, fence_ends(claimant, msg), msg.body)


def _record_retry(claimant: Claimant, msg: Message, doc: dict[str, Any]) -> None:
    """Write the failed delivery onto the message itself (only the version we hold)."""
    ctx = claimant.ctx
    if_match = msg.etag if ctx.caps.if_match and msg.etag else None
    try:
        ctx.store.put(msg.key, layout.canonical_json(doc), if_match=if_match,
                      deadline=fence_ends(claimant, msg))
    except ConditionFailed:  # re-published meanwhile: the new version starts at 1
        log.info("%s was replaced while we held it: its retry is not recorded", msg.key)


def refresh(claimant: Claimant, msg: Message) -> None:
    """See :meth:`Consumer.refresh <pawn_queue_sync.queue.consumer.Consumer.refresh>`."""
    with msg.exclusive():
        if msg.settling or msg.state in ("acked", "nacked"):
            return
        if msg.state != "leased":
            raise LeaseLostError(msg.id, f"message was {msg.state}")
        renew(claimant, msg)


__all__ = ["ack_many", "fence", "fence_ends", "nack", "refresh", "release", "renew", "retry"]
