"""The seam between a consumer and how its topics store messages.

A :class:`~pawn_queue_sync.queue.consumer.Consumer` keeps the public poll/ack API,
its registry entry and what it holds; it asks a :class:`MessageSource` per topic to
plan and claim a poll's messages there, and hands each message back to the source of
its topic to settle. Today's format, one object per message
(:class:`~pawn_queue_sync.queue.objects.ObjectSource`), is the first source; another
format (packed segments: many messages per object) is a second class next to it, with
its own planning, claims and settlement, and neither knows about the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..storage.base import Listing
from .message import Message


class MessageSource(Protocol):
    """Where a consumer's messages of some topics come from, and how they settle.

    Every method may raise :class:`~pawn_queue_sync.errors.StorageError`; settling
    ones raise :class:`~pawn_queue_sync.errors.LeaseLostError` as the consumer's
    methods of the same names document."""

    def poll(self, topic: str, want: int, listed: Listing | None = None) -> list[Message]:
        """Plan and claim up to ``want`` (> 0) messages of ``topic``, each bound to the
        consumer and counted in flight. ``listed``: the topic's pending single messages
        as an idle poll's listing (:mod:`.idle`) just showed them, None if not known."""
        ...

    def idle(self, topic: str) -> bool:
        """Our last poll of ``topic`` found nothing to claim (or there was none yet),
        and nothing is held there to hand out without a listing: the next poll may
        first look with one LIST of the whole topic (:mod:`.idle`). Optional: a source
        without it is polled as it was (its ``poll`` never gets ``listed``)."""
        ...

    def janitor(self, topic: str) -> int:
        """Remove stale leases of ``topic`` now; how many are live afterwards."""
        ...

    def ack_many(self, msgs: Sequence[Message]) -> None:
        """Remove messages this source delivered, for good."""
        ...

    def nack(self, msg: Message, reason: str | None) -> None:
        """Dead-letter ``msg`` with ``reason``, then remove it."""
        ...

    def retry(self, msg: Message, error: str | None, delay: float | None = None) -> None:
        """Record a failed delivery of ``msg``, then give it back; with ``delay``
        (seconds), as a delayed message written before ``msg`` is removed."""
        ...

    def release(self, msg: Message) -> None:
        """Give ``msg`` back at once."""
        ...

    def refresh(self, msg: Message) -> None:
        """Extend the lease of ``msg``, proving it is still ours."""
        ...


__all__ = ["MessageSource"]
