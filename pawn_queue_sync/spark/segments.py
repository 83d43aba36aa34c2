"""Packed topics on the Spark side: segments a task writes with deterministic ids (so a
retried task rewrites the same segments instead of adding new ones), and the rows of a
segment the data source reads.

A segment's id is ``uuid5`` of its topic and its messages' ids and times, its key's time
and header ``created_at`` are its first message's: the same rows in the same order
give byte-identical segments under the same keys.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from datetime import datetime
from typing import Any

from .. import layout, packing
from ..errors import ObjectNotFound, PayloadError, PublishError, SegmentError, StorageError
from ..protocol.segments import Progress, SegmentLease
from ..storage.base import Store
from .rows import ID_NAMESPACE, parse_time, payload_text

__all__ = [
    "SEGMENT_HEADER_RESERVE",
    "is_segment",
    "pending_segments",
    "segment_id_for",
    "segment_rows",
    "write_segments",
]

#: Bytes kept free in each segment for its header line (a topic name is at most 128
#: characters: the header is under 400 bytes).
SEGMENT_HEADER_RESERVE = 512

#: (payload, message id, created_at) of one row, as :class:`~.publish.Publisher` makes it
Item = tuple[Any, str, datetime]


def segment_id_for(topic: str, messages: Sequence[tuple[str, datetime]]) -> str:
    """The id of the segment holding ``messages`` (id, created_at), in that order, in
    ``topic``: two segments differ in id whenever they differ in what they hold (one id
    may be in two segments with different times)."""
    name = ",".join(f"{mid}@{layout.iso(when)}" for mid, when in messages)
    return str(uuid.uuid5(ID_NAMESPACE, f"{topic}/segment:{name}"))


def cut(lines: Sequence[bytes], ids: Sequence[str], max_messages: int, max_bytes: int
        ) -> Iterator[range]:
    """Consecutive index ranges of ``lines``, each a segment within both limits and
    without a repeated message id (rows with the same id column value: a segment
    repeating an id is corrupt, so the repeat opens the next segment)."""
    start, size, seen = 0, SEGMENT_HEADER_RESERVE, set()
    for i, line in enumerate(lines):
        if i > start and (i - start >= max_messages or size + len(line) + 1 > max_bytes
                          or ids[i] in seen):
            yield range(start, i)
            start, size, seen = i, SEGMENT_HEADER_RESERVE, set()
        size += len(line) + 1
        seen.add(ids[i])
    if start < len(lines):
        yield range(start, len(lines))


def write_segments(
    store: Store,
    submit: Callable[..., Future[None]],
    topic: str,
    producer_id: str,
    items: Sequence[Item],
    *,
    max_line_bytes: int,
    max_messages: int,
    max_bytes: int,
) -> int:
    """Encode ``items`` into full segments with deterministic ids and PUT them through
    ``submit`` (a thread pool's); returns how many rows were published (as the plain
    path counts them: a row overwritten by a later one with the same id and time
    counts). Every line is encoded and checked first (a bad payload writes nothing);
    raises PublishError after every started PUT finished if any failed."""
    rows = len(items)
    # A row whose (id, time) repeats later is overwritten on a plain topic (same key):
    # keep only the last, so both kinds of topic deliver the same messages.
    last = {(mid, when): i for i, (_, mid, when) in enumerate(items)}
    items = [item for i, item in enumerate(items) if last[item[1], item[2]] == i]
    lines: list[bytes] = []
    for index, (payload, mid, when) in enumerate(items):
        line = packing.encode_line(mid, producer_id, layout.iso(when), payload)
        if len(line) > max_line_bytes:
            raise PayloadError(
                f"row #{index}: message is {len(line)} bytes encoded; the limit is "
                f"{max_line_bytes} (publishing.max_payload_bytes)"
            )
        lines.append(line)
    futures = []
    for span in cut(lines, [mid for _, mid, _ in items], max_messages, max_bytes):
        first = items[span[0]][2]
        sid = segment_id_for(topic, [(items[i][1], items[i][2]) for i in span])
        key = layout.segment_key(topic, layout.sortable_timestamp(first), sid, len(span))
        body = packing.encode_segment(topic, sid, producer_id, layout.iso(first),
                                      [lines[i] for i in span])
        futures.append((len(span), submit(_put, store, topic, key, body)))
    errors = [(n, e) for n, e in ((n, f.exception()) for n, f in futures) if e is not None]
    if errors:
        raise PublishError(
            f"{sum(n for n, _ in errors)} of {len(items)} messages to {topic!r} were not "
            f"published ({len(errors)} of {len(futures)} segments failed; first error: "
            f"{errors[0][1]})"
        ) from errors[0][1]
    return rows


def _put(store: Store, topic: str, key: str, body: bytes) -> None:
    try:
        store.put(key, body)
    except StorageError as exc:
        raise PublishError(f"could not publish to {topic!r}: {exc}") from exc


# -- reading ---------------------------------------------------------------------------------


def is_segment(topic: str, key: str) -> bool:
    return layout.parse_segment_key(topic, key) is not None


def pending_segments(store: Store, topic: str, limit: int | None = None
                     ) -> list[tuple[str, int]]:
    """(key, message count) of ``topic``'s segments, oldest first, from one listing
    (foreign objects under ``segments/`` left out)."""
    found = []
    for obj in store.list(layout.segments_prefix(topic), limit=limit).objects:
        parsed = layout.parse_segment_key(topic, obj.key)
        if parsed is not None:
            found.append((obj.key, parsed[1]))
    return found


def segment_rows(
    store: Store | None, topic: str, key: str, body: bytes
) -> Iterator[tuple[Any, ...]]:
    """The rows (:data:`~.rows.SNAPSHOT_SCHEMA`) of the segment at ``key``: one per
    message, in order, ``key`` being the segment's. With ``store``, messages that the
    segment's lease recorded settled are left out, ``attempts`` is the deliveries it
    recorded and ``last_error`` its last retry error. A segment that cannot be read gives
    one row of its key and the problem."""
    parsed = layout.parse_segment_key(topic, key)
    if parsed is None:
        return
    try:
        docs = packing.decode_segment(body, topic, parsed[0])
    except SegmentError as exc:
        yield (None, topic, None, None, None, key, None, f"malformed segment: {exc}")
        return
    progress = _progress(store, topic, parsed[0]) if store is not None else None
    unsettled = set(range(len(docs))) if progress is None else set(
        progress.unsettled(len(docs)))
    for i, doc in enumerate(docs):
        if i not in unsettled:
            continue
        yield (
            doc["id"], topic, doc["producer_id"], parse_time(doc["created_at"]),
            payload_text(doc["payload"]), key,
            0 if progress is None else progress.deliveries_of(i),
            None if progress is None else progress.error_of(i),
        )


def _progress(store: Store, topic: str, segment_id: str) -> Progress | None:
    """The progress recorded in the segment's lease; None without a (readable) lease."""
    try:
        raw = store.get(layout.segment_lease_key(topic, segment_id)).body
        return SegmentLease.decode(raw).progress
    except (ObjectNotFound, SegmentError):
        return None

