"""Producers: publish JSON messages, one object per message."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from .. import layout
from ..errors import PayloadError, PublishError, StorageError
from .context import Context
from .registry import RegistryEntry

log = logging.getLogger(__name__)


class Producer:
    """Publishes to topics under a registered, stable producer id."""

    def __init__(self, ctx: Context, entry: RegistryEntry) -> None:
        self._ctx = ctx
        self._entry = entry

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
    ) -> str:
        """Publish one JSON-serialisable payload; returns the message id.

        ``message_id`` (a UUID string) and ``created_at`` make the object key
        deterministic, so re-publishing the same message overwrites it instead of
        adding a duplicate (use both, e.g. for a retried Spark task).
        """
        self._ctx.require_topic(topic)
        key, body, mid = self._encode(topic, payload, message_id, created_at)
        self._write(topic, key, body)
        return mid

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
        """
        self._ctx.require_topic(topic)
        items: Sequence[Any] = list(payloads)
        encoded: list[tuple[str, bytes, str]] = []
        for index, payload in enumerate(items):
            try:
                encoded.append(self._encode(topic, payload, None, None))
            except PayloadError as exc:
                raise PayloadError(f"payload #{index}: {exc}") from None
        if not encoded:
            return []
        workers = threads or self._ctx.config.publishing.batch_threads
        pool = self._ctx.pool("publish", workers)
        futures = [pool.submit(self._write, topic, key, body) for key, body, _ in encoded]
        # One pass sorts each message into published or failed, in input order: the
        # report costs O(n) however many writes failed.
        published: list[str] = []
        failed: list[int] = []
        first_error: BaseException | None = None
        for index, (fut, (_, _, mid)) in enumerate(zip(futures, encoded, strict=True)):
            exc = fut.exception()
            if exc is None:
                published.append(mid)
            else:
                failed.append(index)
                first_error = first_error or exc
        if failed:
            err = PublishError(
                f"{len(failed)} of {len(encoded)} messages to {topic!r} were not published "
                f"(first error: {first_error})"
            )
            err.failed_indices = failed  # type: ignore[attr-defined]
            err.published_ids = published  # type: ignore[attr-defined]
            raise err
        return published

    # -- internals -----------------------------------------------------------------------

    def _encode(
        self, topic: str, payload: Any, message_id: str | None, created_at: datetime | None
    ) -> tuple[str, bytes, str]:
        if message_id is None:
            mid = str(uuid.uuid4())
        else:
            try:
                mid = str(uuid.UUID(str(message_id)))
            except ValueError:
                raise PayloadError(f"message_id {message_id!r} is not a UUID") from None
        when = self._ctx.next_timestamp() if created_at is None else created_at
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

