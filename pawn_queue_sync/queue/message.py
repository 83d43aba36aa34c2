"""A delivered message and the lease that lets us act on it."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import attrs

if TYPE_CHECKING:
    from .consumer import Consumer
    from .held import HeldSegment

State = Literal["leased", "acked", "nacked", "released", "lost"]
#: What :meth:`Message.begin_ack` found: ``ours`` (this ack settles it), ``settled``
#: (acked or nacked already), ``other`` (another ack is under way), ``lost``.
AckStart = Literal["ours", "settled", "other", "lost"]


def _set_event() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


@attrs.define(eq=False)
class Message:
    """One message, claimed by a consumer: read its fields, then ``ack()`` or ``nack()``.

    ``lease_token`` is the ETag of our lease object: every action on the message is
    fenced by it, so a consumer whose lease was taken over can never delete the
    message from under its new holder.
    """

    id: str
    topic: str
    producer_id: str | None
    created_at: str
    payload: Any
    key: str = attrs.field(repr=False)
    lease_key: str = attrs.field(repr=False)
    lease_token: str = attrs.field(repr=False)
    #: monotonic time just before the request that wrote our current lease version
    lease_written_at: float = attrs.field(repr=False)
    #: the number of this delivery: 1 on the first, plus one for each earlier delivery
    #: that ended without an ack or nack (a failed handler call recorded by ``retry``, or
    #: a delivery abandoned with its lease, recorded by the poll that reaped it)
    delivery_count: int = 1
    body: dict[str, Any] = attrs.field(factory=dict, repr=False)
    etag: str = attrs.field(default="", repr=False)
    state: State = "leased"
    #: packed topics: the held segment this message came from (None: a message stored
    #: on its own), and its index there
    segment: HeldSegment | None = attrs.field(default=None, repr=False)
    index: int = attrs.field(default=-1, repr=False)
    #: monotonic time this delivery was handed out (events' durations count from it)
    delivered_at: float | None = attrs.field(default=None, repr=False)
    #: the handler's run time, set by the listener's runtime once the handler returned
    #: or raised (events report it as the duration of the settlement)
    handler_seconds: float | None = attrs.field(default=None, repr=False)
    _consumer: Consumer | None = attrs.field(default=None, repr=False, alias="consumer")
    _lock: threading.RLock = attrs.field(factory=threading.RLock, repr=False, init=False)
    #: an ack of this message is under way: refreshes, nacks and releases stand aside
    _settling: bool = attrs.field(default=False, repr=False, init=False)
    #: set while no ack is under way: a second ack or a nack waits on it, then looks
    #: again at what the first one did
    _unsettled: threading.Event = attrs.field(factory=_set_event, repr=False, init=False)

    @property
    def created_at_datetime(self) -> datetime | None:
        try:
            return datetime.fromisoformat(self.created_at)
        except (TypeError, ValueError):
            return None

    @property
    def settling(self) -> bool:
        """True while an ack of this message is under way (it is still ``leased``):
        a refresh then does nothing, so a lease refresher should leave it alone."""
        return self._settling

    @property
    def done(self) -> bool:
        """True once the message was acked, nacked, released, or its lease lost."""
        return self.state != "leased"

    def ack(self) -> None:
        """Remove the message for good. Idempotent; raises LeaseLostError if the lease
        is no longer ours (then the message is left to its new holder)."""
        self._require_consumer().ack(self)

    def nack(self, reason: str | None = None) -> None:
        """Move the message to the dead-letter prefix (with ``reason``), then remove it.
        Idempotent. If the dead-letter write fails the message stays where it was."""
        self._require_consumer().nack(self, reason)

    def retry(self, *, delay_seconds: float | None = None, error: str | None = None) -> None:
        """Record a failed delivery (``error``, kept as ``last_error``) and give the
        message back: at once, or with ``delay_seconds`` no sooner than that by the
        server's clock (written as a delayed message before it is removed here). See
        :meth:`Consumer.retry <pawn_queue_sync.queue.consumer.Consumer.retry>`."""
        self._require_consumer().retry(self, error, delay_seconds=delay_seconds)

    def release(self) -> None:
        """Give the message back at once, so any consumer may take it again."""
        self._require_consumer().release(self)

    def refresh(self) -> None:
        """Extend our lease by a visibility timeout; raises LeaseLostError if lost."""
        self._require_consumer().refresh(self)

    # -- exclusion between the calls that settle or renew this message ------------------

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold this message alone: refreshes, retries, releases and the re-proofs of
        an ack run under it, so they exclude each other (an ack waits for a refresh
        under way). Reentrant."""
        with self._lock:
            yield

    @contextmanager
    def exclusive_unsettled(self) -> Iterator[None]:
        """:meth:`exclusive`, taken once no ack of this message is under way (waiting
        for one outside the lock, which the ack needs to finish): a nack looks at
        what the ack did."""
        while True:
            if self.state in ("acked", "nacked"):  # settled (maybe before a fork)
                self._lock.acquire()
                break
            self._unsettled.wait()
            self._lock.acquire()
            if not self._settling:
                break
            self._lock.release()  # another ack began meanwhile: wait for it too
        try:
            yield
        finally:
            self._lock.release()

    def begin_ack(self) -> AckStart:
        """Start an ack of this message unless it is settled, lost, or being acked by
        another call (waiting for a refresh under way); ``ours``: the caller acks it
        and must call :meth:`end_ack`."""
        with self._lock:
            if self.state in ("acked", "nacked"):
                return "settled"
            if self._settling:
                return "other"
            if self.state != "leased":
                return "lost"
            self._settling = True
            self._unsettled.clear()
            return "ours"

    @staticmethod
    def begin_acks(msgs: Iterable[Message]) -> tuple[list[Message], list[Message], list[Message]]:
        """:meth:`begin_ack` of each message (once each): those this ack settles (call
        :meth:`end_ack` on each), those lost, and those another ack is settling."""
        ours: list[Message] = []
        lost: list[Message] = []
        others: list[Message] = []
        for msg in dict.fromkeys(msgs):
            start = msg.begin_ack()
            if start == "other":
                others.append(msg)
            elif start == "lost":
                lost.append(msg)
            elif start == "ours":
                ours.append(msg)
        return ours, lost, others

    def end_ack(self) -> None:
        """The ack begun by :meth:`begin_ack` is over (whatever became of it)."""
        with self._lock:
            self._settling = False
            self._unsettled.set()

    def wait_for_ack(self) -> None:
        """Block until no ack of this message is under way."""
        self._unsettled.wait()

    def _after_fork(self) -> None:
        """In a forked child: fresh locks (a thread that held one is not there), and no
        ack under way (the acking thread is not in the child either)."""
        self._lock = threading.RLock()
        self._settling = False
        self._unsettled = _set_event()

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "topic": self.topic,
            "producer_id": self.producer_id,
            "created_at": self.created_at,
            "payload": self.payload,
        }

    def _require_consumer(self) -> Consumer:
        if self._consumer is None:
            raise RuntimeError("this message is not bound to a consumer")
        return self._consumer
