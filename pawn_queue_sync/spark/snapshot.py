"""Batch reads of the ``pawnqueue`` data source: a non-destructive snapshot of a topic's
pending messages or dead letters (:class:`SnapshotReader`), and the Spark partition of
message keys, with its parallel fetch, that the streaming reader reads too."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition

from .. import layout
from ..errors import ObjectNotFound
from ..storage.base import Store
from .queues import require_topic, store_for
from .rows import dead_letter_row, decode_doc, snapshot_row
from .segments import is_segment, pending_segments, segment_rows
from .settings import Settings
from .tasks import split_evenly

__all__ = ["READ_CHUNK", "KeysPartition", "SnapshotReader", "fetch"]

#: Keys fetched per read chunk (a partition's reads are done in chunks of this size).
READ_CHUNK = 256


class KeysPartition(InputPartition):
    """One Spark partition: the message keys it reads."""

    def __init__(self, keys: list[str]) -> None:
        super().__init__(len(keys))
        self.keys = keys

    def __repr__(self) -> str:
        return f"KeysPartition({len(self.keys)} keys)"


def fetch(store: Store, keys: list[str], threads: int) -> Iterator[tuple[str, bytes | None]]:
    """(key, body) for each key, fetched ``threads`` at a time; None if it is gone.
    The pool is shut down (joined) before this generator finishes or is closed."""

    def get(key: str) -> tuple[str, bytes | None]:
        try:
            return key, store.get(key).body
        except ObjectNotFound:
            return key, None

    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="pawnq-spark-read") as pool:
        for i in range(0, len(keys), READ_CHUNK):
            yield from pool.map(get, keys[i : i + READ_CHUNK])


class SnapshotReader(DataSourceReader):
    """Lists the topic's pending messages (or dead letters) when the query is planned
    and reads them in the executors. Nothing is claimed, acked or deleted: a snapshot
    for inspection and analytics. A message acked between listing and reading is
    skipped. A packed topic's segments are read whole; the messages their leases
    recorded settled are left out."""

    def __init__(
        self, settings: Settings, topic: str, section: str, *, partitions: int, threads: int
    ) -> None:
        self.settings = settings
        self.topic = topic
        self.section = section
        self.num_partitions = partitions
        self.threads = threads

    def __repr__(self) -> str:
        return (f"SnapshotReader(topic={self.topic!r}, section={self.section!r}, "
                f"{self.settings.describe()})")

    def partitions(self) -> Sequence[InputPartition]:
        store = store_for(self.settings)
        require_topic(store, self.topic)
        prefix = (layout.dead_letter_prefix(self.topic) if self.section == "dead-letter"
                  else layout.messages_prefix(self.topic))
        keys = [o.key for o in store.list(prefix).objects]
        weight = len(keys)
        if self.section == "messages":
            keys = [k for k in keys if layout.parse_message_key(self.topic, k) is not None]
            segments = pending_segments(store, self.topic)
            keys += [k for k, _ in segments]
            weight = len(keys) + sum(n for _, n in segments)
        if not keys:
            return [KeysPartition([])]
        parts = self.num_partitions or min(16, math.ceil(weight / 500), len(keys))
        return [KeysPartition(chunk) for chunk in split_evenly(keys, parts)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, KeysPartition)
        if not partition.keys:
            return
        to_row = dead_letter_row if self.section == "dead-letter" else snapshot_row
        store = store_for(self.settings)
        for key, body in fetch(store, partition.keys, self.threads):
            if body is None:
                continue
            if self.section == "messages" and is_segment(self.topic, key):
                yield from segment_rows(store, self.topic, key, body)
            else:
                yield to_row(self.topic, key, decode_doc(body))
