"""Producers: publish JSON messages, one object per message on plain topics, many per
segment on packed ones (queue/batcher.py)."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from .. import layout
from ..errors import PayloadError, PublishError, StorageError
from . import dedup, delayed
from .batcher import Batcher, SegmentWriter, new_ids
from .context import Context
from .registry import RegistryEntry

log = logging.getLogger(__name__)


class Producer:
    """Publishes to topics under a registered, stable producer id."""

    def __init__(self, ctx: Context, entry: RegistryEntry) -> None:
        self._ctx = ctx
        self._entry = entry
        #: (pid, topic) -> the topic's group commit: a forked child never uses (nor
        #: waits on) its parent's, whose threads do not exist there
        self._batchers: dict[tuple[int, str], Batcher] = {}
        #: expiry of dedup markers, run by deduplicated publishes (dedup.MarkerJanitor)
        self._markers = dedup.MarkerJanitor(ctx, eager=True)

    @property
    def id(self) -> str:
        return self._entry.entity_id

    @property
    def name(self) -> str:
        return self._entry.name

    def __repr__(self) -> str:
        return f"Producer(name={self.name!r}, id={self.id!r})"

    def publish(
        self,
        topic: str,
        payload: Any,
        *,
        message_id: str | None = None,
        created_at: datetime | None = None,
        delay_seconds: float | None = None,
        dedup_id: str | None = None,
    ) -> str:
        """Publish one JSON-serialisable payload; returns the message id.

        ``delay_seconds``: the message stays invisible to every consumer until then,
        by the server's clock, and is delivered within about a poll interval after
        (see :mod:`~pawn_queue_sync.queue.delayed`; a packed topic stores it alone and
        delivers it as a single message). Up to ``publishing.max_delay_seconds`` (7
        days); a negative, NaN, infinite or longer one is PayloadError. ``dedup_id``: within
        ``publishing.dedup_window_seconds`` a second publish with the same id on the
        same topic writes nothing and returns the first message's id (see
        :mod:`~pawn_queue_sync.queue.dedup`).

        ``message_id`` (a UUID string) and ``created_at`` make the object key
        deterministic, so re-publishing the same message overwrites it instead of
        adding a duplicate (use both, e.g. for a retried Spark task). On a packed topic
        they are kept in the message, but re-publishing writes another segment: it does
        not overwrite (the consumer sees both copies).

        On a packed topic the message joins the topic's open batch (group commit, up to
        ``publishing.linger_ms`` while other threads publish too); the call returns once
        the segment holding it is stored, and raises PublishError if that write failed.
        """
        self._ctx.require_topic(topic)
        delay = delayed.check_delay(delay_seconds,
                                    self._ctx.config.publishing.max_delay_seconds)
        if dedup_id is None:
            return self._publish_one(topic, payload, message_id, created_at, delay)
        dedup_id = dedup.check_dedup_id(dedup_id)
        mid, when = self._message_id(message_id), self._created_at(created_at)
        self._check_payload(topic, payload, mid, when, delay)  # before the marker
        published = dedup.publish_once(
            self._ctx, topic, dedup_id, mid, when,
            lambda mid, when, wait: self._publish_one(topic, payload, mid, when, wait),
            delay,
        )
        self._markers.run_due(topic)  # after: a failure there only logs
        return published

    def _check_payload(self, topic: str, payload: Any, message_id: str,
                       created_at: datetime, delay: float | None) -> None:
        """PayloadError for a payload :meth:`_publish_one` would refuse, so a
        deduplicated publish of it writes no marker either."""
        if delay is None and self._ctx.topic_packed(topic):
            self._batcher(topic).writer.line(message_id, layout.iso(created_at), payload)
        else:
            self._encode(topic, payload, message_id, created_at)

    def _publish_one(self, topic: str, payload: Any, message_id: str | None,
                     created_at: datetime | None, delay: float | None) -> str:
        """One message: delayed, into the topic's open segment, or as its own object."""
        started = self._ctx.clock.monotonic()
        if delay is not None:
            key, body, mid = self._encode(topic, payload, message_id, created_at)
            delayed.write_delayed(self._ctx, topic, key, body, delay)
            return self._published(topic, mid, started)
        if self._ctx.topic_packed(topic):
            mid = new_ids(1)[0] if message_id is None else self._message_id(message_id)
            when = self._created_at(created_at)
            batcher = self._batcher(topic)
            batcher.publish(batcher.writer.line(mid, layout.iso(when), payload), mid)
            return self._published(topic, mid, started)
        key, body, mid = self._encode(topic, payload, message_id, created_at)
        self._write(topic, key, body)
        return self._published(topic, mid, started)

    def _published(self, topic: str, mid: str, started: float | None) -> str:
        """``mid``, after a ``published`` event (its duration since ``started``)."""
        ctx = self._ctx
        if ctx.events.active:
            took = None if started is None else ctx.clock.monotonic() - started
            ctx.emit("published", topic, mid, duration=took, producer_id=self.id)
        return mid

    def _reported(self, topic: str, ids: list[str],
                  errors: list[BaseException | None]) -> list[str]:
        """:func:`_report`, with a ``published`` event for each id written (no
        duration: one call wrote them all)."""
        try:
            published = _report(topic, ids, errors)
        except PublishError as exc:
            for mid in getattr(exc, "published_ids", []):
                self._published(topic, mid, None)
            raise
        for mid in published:
            self._published(topic, mid, None)
        return published

    def publish_batch(
        self,
        topic: str,
        payloads: Iterable[Any],
        *,
        threads: int | None = None,
    ) -> list[str]:
        """Publish many payloads concurrently; ids come back in input order.

        Every payload is encoded and checked before anything is written, so a bad
        payload publishes nothing. If writes fail, PublishError says how many; its
        ``failed_indices`` lists the positions (0-based, input order) of the payloads
        not published and ``published_ids`` the ids that were written, in input order.
        On a packed topic the messages are cut into full segments (in input order),
        written in parallel; a failed segment fails all of its messages.
        """
        self._ctx.require_topic(topic)
        items: Sequence[Any] = list(payloads)
        if self._ctx.topic_packed(topic):
            return self._publish_segments(topic, items, threads)
        encoded: list[tuple[str, bytes, str]] = []
        for index, payload in enumerate(items):
            try:
                encoded.append(self._encode(topic, payload, None, None))
            except PayloadError as exc:
                raise PayloadError(f"payload #{index}: {exc}") from None
        if not encoded:
            return []
        pool = self._ctx.pool("publish", self._workers(threads))
        futures = [pool.submit(self._write, topic, key, body) for key, body, _ in encoded]
        errors = [fut.exception() for fut in futures]
        return self._reported(topic, [mid for _, _, mid in encoded], errors)

    # -- internals -----------------------------------------------------------------------

    def _workers(self, threads: int | None) -> int:
        return threads or self._ctx.config.publishing.batch_threads

    def _batcher(self, topic: str) -> Batcher:
        key = (os.getpid(), topic)
        batcher = self._batchers.get(key)
        if batcher is None:  # setdefault: two racing threads end up with the same one
            fresh = Batcher(SegmentWriter(self._ctx, topic, self.id))
            batcher = self._batchers.setdefault(key, fresh)
        return batcher

    def _publish_segments(
        self, topic: str, items: Sequence[Any], threads: int | None
    ) -> list[str]:
        """publish_batch on a packed topic: encode and check all, then full segments."""
        writer = self._batcher(topic).writer
        ids, lines = writer.lines(layout.iso(self._ctx.next_timestamp()), items)
        if not lines:
            return []
        pool = self._ctx.pool("publish", self._workers(threads))
        cuts, seg_errors = writer.write_all(lines, pool)
        errors: list[BaseException | None] = []
        for (start, stop), error in zip(cuts, seg_errors, strict=True):
            errors.extend([error] * (stop - start))
        return self._reported(topic, ids, errors)

    @staticmethod
    def _message_id(message_id: str | None) -> str:
        if message_id is None:
            return str(uuid.uuid4())
        try:
            return str(uuid.UUID(str(message_id)))
        except ValueError:
            raise PayloadError(f"message_id {message_id!r} is not a UUID") from None

    def _created_at(self, created_at: datetime | None) -> datetime:
        """The message's time: ``created_at`` (a datetime), else now."""
        if created_at is None:
            return self._ctx.next_timestamp()
        if not isinstance(created_at, datetime):
            raise PayloadError(
                f"created_at must be a datetime, not {type(created_at).__name__}"
            )
        return created_at

    def _encode(
        self, topic: str, payload: Any, message_id: str | None, created_at: datetime | None
    ) -> tuple[str, bytes, str]:
        mid = self._message_id(message_id)
        when = self._created_at(created_at)
        doc = {
            "id": mid,
            "topic": topic,
            "producer_id": self.id,
            "created_at": layout.iso(when),
            "payload": payload,
        }
        try:
            body = layout.canonical_json(doc)
        except (TypeError, ValueError) as exc:
            raise PayloadError(f"payload is not JSON-serialisable: {exc}") from None
        limit = self._ctx.config.publishing.max_payload_bytes
        if len(body) > limit:
            raise PayloadError(
                f"message is {len(body)} bytes encoded; the limit is {limit} "
                "(publishing.max_payload_bytes)"
            )
        return layout.message_key(topic, layout.sortable_timestamp(when), mid), body, mid

    def _write(self, topic: str, key: str, body: bytes) -> None:
        try:
            self._ctx.store.put(key, body)
        except StorageError as exc:
            raise PublishError(f"could not publish to {topic!r}: {exc}") from exc
        log.debug("published %s", key)



def _report(topic: str, ids: list[str], errors: list[BaseException | None]) -> list[str]:
    """The ids of a batch, or PublishError listing what failed: one pass sorts each
    message into published or failed, in input order (O(n) however many failed)."""
    published: list[str] = []
    failed: list[int] = []
    first_error: BaseException | None = None
    for index, (mid, exc) in enumerate(zip(ids, errors, strict=True)):
        if exc is None:
            published.append(mid)
        else:
            failed.append(index)
            first_error = first_error or exc
    if failed:
        err = PublishError(
            f"{len(failed)} of {len(ids)} messages to {topic!r} were not published "
            f"(first error: {first_error})"
        )
        err.failed_indices = failed  # type: ignore[attr-defined]
        err.published_ids = published  # type: ignore[attr-defined]
        raise err
    return published
