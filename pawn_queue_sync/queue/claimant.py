"""Who claims: a consumer's id, its randomness, and the messages it holds, shared by
the modules that claim (claims, reaping, objects) and settle (settle), and the
store operations both sides use (giving a lease back, deleting one version of a
message) with the reading of message documents."""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from ..errors import ConditionFailed, ObjectNotFound, StorageError
from ..events import EventCallback
from ..protocol import lease as leases
from ..protocol.effects import run
from .context import Context
from .message import Message, State

if TYPE_CHECKING:
    from .consumer import Consumer

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")

_REQUIRED_FIELDS = ("id", "payload")
#: What a message is, as a producer wrote it (delivery records added later aside; the
#: producer aside too: the same payload re-published by another producer is handled).
_CONTENT_FIELDS = ("id", "topic", "created_at", "payload")


@attrs.define(eq=False)
class Claimant:
    """A consumer as its claims and settlements see it: the queue's context, the id
    leases name, the consumer messages are bound to, and what it holds (messages in
    flight by id; ids of messages acked whose leases are being deleted, still ours
    meanwhile), under one lock."""

    ctx: Context
    id: str
    consumer: Consumer = attrs.field(repr=False)
    rng: random.Random = attrs.field(factory=random.SystemRandom, repr=False)
    #: the consumer's own event callback (``register_consumer(on_event=...)``)
    on_event: EventCallback | None = attrs.field(default=None, repr=False)
    lock: threading.Lock = attrs.field(factory=threading.Lock, repr=False, init=False)
    _inflight: dict[str, Message] = attrs.field(factory=dict, repr=False, init=False)
    _releasing: set[str] = attrs.field(factory=set, repr=False, init=False)

    def __attrs_post_init__(self) -> None:
        _CLAIMANTS.add(self)

    # -- what we hold -------------------------------------------------------------------

    def held(self) -> list[Message]:
        """Messages we hold a lease on and have not settled yet."""
        with self.lock:
            return list(self._inflight.values())

    def track(self, msg: Message) -> None:
        """Count ``msg`` in flight (a later claim of its id replaces an earlier one);
        a ``claimed`` event."""
        msg.delivered_at = self.ctx.clock.monotonic()
        with self.lock:
            self._inflight[msg.id] = msg
        self.emit("claimed", msg.topic, msg.id, delivery_count=msg.delivery_count)

    def settled(self, msg: Message, state: State) -> None:
        """Record how ``msg`` ended and stop counting it in flight (only this very
        object: a later claim of the same id may be in flight under it). An ``acked``
        or ``lease_lost`` event (nacks and retries are the consumer's: they know why)."""
        msg.state = state
        with self.lock:
            if self._inflight.get(msg.id) is msg:
                del self._inflight[msg.id]
        kind = _EVENT_OF.get(state)
        if kind is not None:
            self.emit(kind, msg.topic, msg.id, delivery_count=msg.delivery_count,
                      duration=self.held_for(msg) if kind == "acked" else None)

    def held_for(self, msg: Message) -> float | None:
        """The handler's run time (under a listener), else the seconds since ``msg``
        was handed out: the duration events report for its settlement."""
        if msg.handler_seconds is not None:
            return msg.handler_seconds
        if msg.delivered_at is None:
            return None
        return self.ctx.clock.monotonic() - msg.delivered_at

    def emit(self, kind: str, topic: str, message_id: str | None, **fields: Any) -> None:
        """An event of this consumer, for the queue's callbacks and its own."""
        self.ctx.emit(kind, topic, message_id, consumer_id=self.id, also=self.on_event,
                      **fields)

    def ours(self, topic: str) -> set[str]:
        """Ids of the messages of ``topic`` whose leases are ours: in flight, or
        acked with their leases being deleted."""
        with self.lock:
            ids = {m.id for m in self._inflight.values() if m.topic == topic}
            return ids | self._releasing

    @contextmanager
    def releasing(self, ids: Sequence[str]) -> Iterator[None]:
        """While the block deletes the leases of acked messages ``ids``, they still
        count as ours (see :meth:`ours`)."""
        with self.lock:
            self._releasing.update(ids)
        try:
            yield
        finally:
            with self.lock:
                self._releasing.difference_update(ids)

    # -- work shared by claims and settlement ------------------------------------------

    def in_parallel(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """``fn`` of every item, on the claim pool when there is more than one."""
        if len(items) == 1:
            return [fn(items[0])]
        pool = self.ctx.pool("claim", self.ctx.config.polling.claim_threads)
        futures = [pool.submit(fn, item) for item in items]
        return [f.result() for f in futures]

    def drop_lease(self, lease_key: str, token: str) -> None:
        """Give a lease back (only while it is ``token``); a failure only logs."""
        try:
            run(leases.release(lease_key, token, self.ctx.caps, self.ctx.csprng),
                self.ctx.store, self.ctx.clock)
        except StorageError as exc:  # it will go stale and be reaped
            log.warning("could not give back lease %s: %s", lease_key, exc)

    def delete_version(
        self, key: str, etag: str, deadline: float | None, doc: dict[str, Any] | None = None
    ) -> bool:
        """Delete the message object at ``key`` only while it is the version we read
        (If-Match ``etag``, where the server honours it). On a mismatch the object is
        read again: if it is the same message (``doc``'s id, topic, created_at and
        payload; only a janitor's record of an abandoned delivery, or a re-publish of
        identical content, changed it), that version is deleted instead. False when
        our version is gone: replaced by another message under the same key (a
        re-publish while we held it: it stays and is delivered) or already deleted."""
        if_match = etag if self.ctx.caps.if_match and etag else None
        store = self.ctx.store
        try:
            store.delete(key, if_match=if_match, deadline=deadline)
            return True
        except ObjectNotFound:
            return False
        except ConditionFailed:
            pass
        try:
            now = store.get(key)
            same = doc is not None and same_message(doc, now.body)
            if same:
                store.delete(key, if_match=now.etag, deadline=deadline)
                return True
        except (ConditionFailed, ObjectNotFound):
            pass
        log.info("%s was replaced or removed while we held it: left as it is", key)
        return False


#: The events :meth:`Claimant.settled` reports, by the state a message ends in.
_EVENT_OF: dict[str, str] = {"acked": "acked", "lost": "lease_lost"}

#: Every live claimant, so a forked child can give them fresh locks.
_CLAIMANTS: weakref.WeakSet[Claimant] = weakref.WeakSet()


def _reset_locks_after_fork() -> None:
    """In a forked child only the forking thread exists, so a lock another thread held
    at the fork would stay held forever: every claimant, and each message it holds,
    gets fresh locks."""
    for claimant in list(_CLAIMANTS):
        claimant.lock = threading.Lock()
        for msg in claimant._inflight.values():
            msg._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_locks_after_fork)


# -- message documents ---------------------------------------------------------------------


def same_message(doc: dict[str, Any], raw: bytes) -> bool:
    """True when ``raw`` is the message ``doc`` was read from, whatever delivery
    records (``attempts``, ``last_error``, ...) were written on it since."""
    try:
        now = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(now, dict) and all(now.get(f) == doc.get(f) for f in _CONTENT_FIELDS)


def attempts_of(doc: dict[str, Any]) -> int:
    """Deliveries of a message that ended without an ack, as recorded on it (failed
    handler calls and abandoned deliveries); 0 when unrecorded or unreadable."""
    attempts = doc.get("attempts", 0)
    if isinstance(attempts, bool) or not isinstance(attempts, int):
        return 0
    return max(attempts, 0)


def decode_message(raw: bytes, mid: str) -> dict[str, Any]:
    """Parse and check a message body; ValueError says what is wrong."""
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON ({exc.__class__.__name__})") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    missing = [f for f in _REQUIRED_FIELDS if f not in doc]
    if missing:
        raise ValueError(f"missing field(s) {', '.join(missing)}")
    if doc["id"] != mid:
        raise ValueError(f"id {doc['id']!r} does not match its key")
    return doc


__all__ = ["Claimant", "attempts_of", "decode_message", "same_message"]
