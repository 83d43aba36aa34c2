"""Streaming reads of the ``pawnqueue`` data source: :class:`QueueStreamReader`, whose
offsets are message keys and which deletes a batch's messages once Spark has recorded a
later batch (see its docstring and ``docs/spark.md``)."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from .. import layout
from ..errors import StorageError
from .queues import require_topic, store_for
from .rows import decode_doc, snapshot_row
from .segments import is_segment, pending_segments, segment_rows
from .settings import Settings
from .snapshot import KeysPartition, fetch
from .tasks import split_evenly

try:  # the admission-control streaming API (pyspark >= 4.2)
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    HAS_READ_LIMITS = True
except ImportError:  # pragma: no cover - older pyspark: no streaming source
    HAS_READ_LIMITS = False
    ReadLimit = Any  # type: ignore[misc,assignment]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Placeholder on pyspark < 4.2."""


#: The data source's logger (docs/spark.md names it).
log = logging.getLogger("pawn_queue_sync.spark.datasource")

__all__ = ["DEFAULT_MAX_PER_BATCH", "HAS_READ_LIMITS", "QueueStreamReader"]

#: Messages per streaming batch unless ``maxMessagesPerBatch`` says otherwise. Every
#: batch's keys are recorded in Spark's offset log, so this also bounds its entries.
DEFAULT_MAX_PER_BATCH = 1000


#: A segment's name (``{ts}-{uuid}-n{count}``) against a message's (``{ts}-{uuid}``)
_SEGMENT_NAME = re.compile(r"-n(\d+)$")


def _name(topic: str, key: str) -> str:
    """``{topic}/messages/{name}.json`` or ``{topic}/segments/{name}.seg`` -> ``name``
    (what offsets record: names of both kinds sort by age together)."""
    if is_segment(topic, key):
        return key[len(layout.segments_prefix(topic)) : -len(".seg")]
    return key[len(layout.messages_prefix(topic)) : -len(".json")]


def _key(topic: str, name: str) -> str:
    if _SEGMENT_NAME.search(name):
        return f"{layout.segments_prefix(topic)}{name}.seg"
    return f"{layout.messages_prefix(topic)}{name}.json"


def _size(name: str) -> int:
    """How many messages the object of ``name`` holds (a segment's count is in it)."""
    match = _SEGMENT_NAME.search(name)
    return int(match.group(1)) if match else 1


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A streaming source over one topic: the stream is the topic's only consumer.

    An offset is ``{"key": K, "keys": [...]}``: ``K`` is the highest message key (name)
    read so far, and ``keys`` the exact names of the batch that ends there, so a batch
    replayed after a failure reads the same messages, and deleting a batch never
    touches a message nobody read. Each batch takes, in key order, at most
    ``maxMessagesPerBatch`` messages that are pending and not in the previous batch:
    new keys above ``K`` and *stragglers* below it (a message whose publish finished
    after a later key had been read: concurrent producers, slow writes).

    Messages are deleted only once Spark has durably recorded a later batch: in
    ``commit(end)``, which Spark calls after writing the next batch's offsets (so one
    batch late), and, for a query restarted in between, when the next batch is planned
    (``partitions(start, end)`` deletes ``start``'s messages: its offsets were committed
    before ``end`` was written). The last batch of a query therefore stays in the topic
    until the query next runs a batch; a replay never sees a deleted message.

    On a packed topic offsets name segments too (``{ts}-{uuid}-n{count}``), in the same
    key order as messages; a batch takes whole segments, counting their messages
    towards ``maxMessagesPerBatch`` (but at least one segment, however many it holds),
    and deletes them as it deletes messages.
    """

    def __init__(
        self,
        settings: Settings,
        topic: str,
        *,
        max_per_batch: int,
        partitions: int,
        threads: int,
    ) -> None:
        self.settings = settings
        self.topic = topic
        self.max_per_batch = max_per_batch
        self.num_partitions = partitions
        self.threads = threads
        self._target: set[str] | None = None
        #: digests of the offsets whose messages this process deleted (oldest first, a
        #: few kept; see _mark)
        self._deleted: dict[str, None] = {}
        require_topic(store_for(settings), topic)

    def __repr__(self) -> str:
        return f"QueueStreamReader(topic={self.topic!r}, {self.settings.describe()})"

    def __getstate__(self) -> dict[str, Any]:
        # Shipped to every read task: leave the driver-side bookkeeping behind.
        state = dict(self.__dict__)
        state["_target"] = None
        state["_deleted"] = {}
        return state

    # -- offsets ------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        return {"key": "", "keys": []}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix what "available now" means: the messages pending at this moment."""
        self._target = set(self._pending(None))
        log.info("pawnqueue stream %r: available now: %d messages", self.topic,
                 len(self._target))

    def latestOffset(self, start: dict[str, Any] | None = None,
                     limit: ReadLimit | None = None) -> dict[str, Any]:
        if start is None:  # pre-4.2 call shape; never used with the API we require
            raise RuntimeError("the pawnqueue streaming source needs pyspark >= 4.2")
        cap = self.max_per_batch
        if HAS_READ_LIMITS and isinstance(limit, ReadMaxRows):
            cap = max(1, min(cap, limit.max_rows))
        elif HAS_READ_LIMITS and not isinstance(limit, (ReadAllAvailable, type(None))):
            log.debug("pawnqueue stream: read limit %r treated as %d rows", limit, cap)
        previous = set(start["keys"])
        high = start["key"]
        listed = self._pending(len(previous) + cap + 1000)
        fresh = [n for n in listed if n > high or n not in previous]
        if self._target is not None:
            fresh = [n for n in fresh if n in self._target]
        take = []
        for name in sorted(fresh):  # whole segments: at least one object, then up to cap
            cap -= _size(name)
            if take and cap < 0:
                break
            take.append(name)
        if not take:
            return start
        late = sum(1 for n in take if n <= high)
        if late:
            log.info("pawnqueue stream %r: %d straggler(s) below the offset", self.topic, late)
        return {"key": max(high, take[-1]), "keys": take}

    def _pending(self, limit: int | None) -> list[str]:
        """Names of pending messages and segments (each listing up to ``limit``)."""
        store = store_for(self.settings)
        listing = store.list(layout.messages_prefix(self.topic), limit=limit)
        names = [
            _name(self.topic, o.key)
            for o in listing.objects
            if layout.parse_message_key(self.topic, o.key) is not None
        ]
        return names + [_name(self.topic, k) for k, _ in pending_segments(store, self.topic,
                                                                          limit)]

    # -- batches ------------------------------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        self._delete(start)  # committed before `end` was written: see the class docstring
        if start == end or not end["keys"]:
            return []
        keys = [_key(self.topic, n) for n in end["keys"]]
        return [KeysPartition(c) for c in split_evenly(keys, self.num_partitions)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, KeysPartition)
        for key, body in fetch(store_for(self.settings), partition.keys, self.threads):
            if body is not None and is_segment(self.topic, key):
                yield from segment_rows(None, self.topic, key, body)
            elif body is not None:
                yield snapshot_row(self.topic, key, decode_doc(body))
            else:  # only another consumer of the topic could have removed it
                log.warning("pawnqueue stream %r: %s vanished before it was read",
                            self.topic, key)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark has recorded the batch after ``end``: ``end``'s messages are done."""
        self._delete(end)

    @staticmethod
    def _mark(offset: dict[str, Any]) -> str:
        """What identifies a batch whose messages were deleted: a digest of the offset's
        whole content, its high key and every key it holds. (The high key and a count
        would not do: a batch of stragglers below the high mark, as many as the batch
        before, ends at the same mark, and its delete would be skipped.)"""
        content = {"key": str(offset.get("key")), "keys": sorted(offset.get("keys") or [])}
        return hashlib.sha256(json.dumps(content, separators=(",", ":")).encode()).hexdigest()

    def _delete(self, offset: dict[str, Any]) -> None:
        """Delete ``offset``'s messages unless this process already did: Spark hands the
        same offset to commit(end) and then to partitions(start, ...), and deleting it
        twice could remove a message republished under the same key in between."""
        names = offset.get("keys") or []
        if not names:
            return
        mark = self._mark(offset)
        if mark in self._deleted:
            return
        try:
            failed = store_for(self.settings).delete_many([_key(self.topic, n) for n in names])
        except StorageError as exc:
            log.warning("pawnqueue stream %r: could not delete consumed messages: %s",
                        self.topic, exc)
            return
        if failed:  # they will be read again as stragglers: at-least-once
            log.warning("pawnqueue stream %r: could not delete %d consumed message(s)",
                        self.topic, len(failed))
            return
        self._deleted[mark] = None
        while len(self._deleted) > 64:
            del self._deleted[next(iter(self._deleted))]
        log.debug("pawnqueue stream %r: deleted %d consumed messages", self.topic, len(names))

    def stop(self) -> None:
        self._target = None
