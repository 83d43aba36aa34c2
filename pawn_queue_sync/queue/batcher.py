"""Publishing on packed topics: many messages per segment object.

:class:`SegmentWriter` encodes messages (each line checked against
``publishing.max_payload_bytes``), cuts them into segments within
``publishing.max_segment_messages`` / ``max_segment_bytes`` and PUTs a segment.
:class:`Batcher` is the group commit of ``publish()``: callers from any number of
threads join the topic's open batch; it is sealed when full, when ``linger_ms`` has
passed since it opened, or at once when every thread that published to the topic in
the last :data:`RECENT_SECONDS` is waiting in it (so a lone caller never lingers). The
thread that opened a batch writes it after sealing; meanwhile the next batch opens, so
several may be in flight. Every caller returns only after its segment's PUT succeeded,
and every caller of a failed segment gets :class:`~pawn_queue_sync.errors.PublishError`.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Sequence
from concurrent.futures import Executor, Future
from datetime import datetime
from typing import Any

from .. import layout, packing
from ..errors import PayloadError, PublishError
from .context import Context

log = logging.getLogger(__name__)

#: A thread that published to a topic within this many seconds counts as a publisher
#: the open batch waits for (up to linger_ms) before it is sealed early.
RECENT_SECONDS = 0.1
#: A timestamp as long as ``layout.iso`` makes them, to size the header.
_LONGEST_ISO = "2000-01-01T00:00:00.000000+00:00"


_VARIANT = {d: "89ab"[int(d, 16) & 3] for d in "0123456789abcdef"}


def new_ids(count: int) -> list[str]:
    """``count`` random (version 4) UUID strings, as ``str(uuid.uuid4())`` makes them,
    from one ``os.urandom`` call: about 2.5 times cheaper per id."""
    raw = os.urandom(16 * count).hex()
    return [
        f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"
        for h in (raw[i : i + 32] for i in range(0, 32 * count, 32))
    ]


class SegmentWriter:
    """Encodes, cuts and writes the segments of one producer on one topic."""

    def __init__(self, ctx: Context, topic: str, producer_id: str) -> None:
        self.ctx = ctx
        self.topic = topic
        self.producer_id = producer_id
        pub = ctx.config.publishing
        self.max_line = pub.max_payload_bytes
        self.max_messages = pub.max_segment_messages
        # What the lines may take: the segment less its (longest) header line.
        header = packing.encode_header(
            topic, str(uuid.UUID(int=0)), producer_id, _LONGEST_ISO, self.max_messages
        )
        self.max_lines_bytes = pub.max_segment_bytes - len(header) - 1

    def line(self, message_id: str, created_at: str, payload: Any) -> bytes:
        """One message's line, checked against ``publishing.max_payload_bytes``."""
        line = packing.encode_line(message_id, self.producer_id, created_at, payload)
        if len(line) > self.max_line:
            raise PayloadError(packing.too_large(len(line), self.max_line))
        return line

    def lines(self, created_at: str, payloads: Sequence[Any]) -> tuple[list[str], list[bytes]]:
        """New message ids and the checked lines of ``payloads`` (PayloadError names
        the first bad one, ``payload #i``)."""
        ids = new_ids(len(payloads))
        lines = packing.encode_lines(
            ids, self.producer_id, created_at, payloads, self.max_line
        )
        return ids, lines

    def cut(self, lines: Sequence[bytes]) -> list[tuple[int, int]]:
        """``[start, stop)`` ranges of ``lines``: full segments, in order."""
        cuts: list[tuple[int, int]] = []
        start, size = 0, 0
        for index, line in enumerate(lines):
            grown = size + len(line) + 1
            if index > start and (
                index - start >= self.max_messages or grown > self.max_lines_bytes
            ):
                cuts.append((start, index))
                start, grown = index, len(line) + 1
            size = grown
        if start < len(lines):
            cuts.append((start, len(lines)))
        return cuts

    def write(self, lines: Sequence[bytes], when: datetime | None = None) -> str:
        """PUT one segment of ``lines`` (publish order), sealed ``when`` (now if None);
        its key. PublishError if the PUT failed (then nothing of it counts as
        published)."""
        when = self.ctx.next_timestamp() if when is None else when
        segment_id = new_ids(1)[0]
        body = packing.encode_segment(
            self.topic, segment_id, self.producer_id, layout.iso(when), lines
        )
        key = layout.segment_key(
            self.topic, layout.sortable_timestamp(when), segment_id, len(lines)
        )
        try:
            self.ctx.store.put(key, body)
        except Exception as exc:
            raise PublishError(f"could not publish to {self.topic!r}: {exc}") from exc
        log.debug("published segment %s", key)
        return key

    def write_all(
        self, lines: Sequence[bytes], pool: Executor
    ) -> tuple[list[tuple[int, int]], list[BaseException | None]]:
        """Cut ``lines`` into segments and PUT them in parallel on ``pool``: the cuts
        and, for each, None or its error. Their times are taken here, in order, so
        their keys sort in input order however the PUTs interleave."""
        cuts = self.cut(lines)
        futures: list[Future[str]] = [
            pool.submit(self.write, lines[a:b], self.ctx.next_timestamp()) for a, b in cuts
        ]
        return cuts, [f.exception() for f in futures]


class _Batch:
    """Lines collected for one segment, and who waits for them."""

    __slots__ = ("deadline", "done", "error", "ids", "lines", "sealed", "size", "threads",
                 "when")

    def __init__(self, deadline: float) -> None:
        self.lines: list[bytes] = []
        #: message id -> its line's index (a segment holds each id once)
        self.ids: dict[str, int] = {}
        self.threads: set[threading.Thread] = set()
        self.size = 0
        self.deadline = deadline
        self.sealed = False
        self.done = threading.Event()
        self.error: BaseException | None = None
        #: when it was sealed: its segment's time (keys sort in sealing order)
        self.when: datetime | None = None


class Batcher:
    """The group commit of ``publish()`` for one producer and topic (see the module
    docstring). Thread-safe; one process's: a producer keys its batchers by pid, so a
    forked child never uses its parent's (whose threads do not exist there)."""

    def __init__(self, writer: SegmentWriter) -> None:
        self.writer = writer
        self._clock = writer.ctx.clock
        self._linger = writer.ctx.config.publishing.linger_ms / 1000.0
        self._cond = threading.Condition(threading.Lock())
        self._open: _Batch | None = None
        #: thread -> monotonic time of its last publish to this topic
        self._recent: dict[threading.Thread, float] = {}

    def publish(self, line: bytes, message_id: str) -> None:
        """Add one encoded line (of ``message_id``); returns once its segment is stored,
        else PublishError. A message id already in the open batch (the same message
        published again, e.g. a retry while the first call is in flight) replaces its
        line there, as a later PUT of a plain message overwrites its key: a segment
        never holds an id twice, and both calls return once it is stored."""
        me = threading.current_thread()
        writer = self.writer
        with self._cond:
            now = self._clock.monotonic()
            self._recent[me] = now
            batch = self._open
            opener = False
            if batch is not None and message_id in batch.ids:
                index = batch.ids[message_id]
                batch.size += len(line) - len(batch.lines[index])
                batch.lines[index] = line
            else:
                opener = (
                    batch is None
                    or batch.size + len(line) + 1 > writer.max_lines_bytes
                    or len(batch.lines) >= writer.max_messages
                )
                if opener:
                    if batch is not None:
                        self._seal(batch)
                    batch = self._open = _Batch(now + self._linger)
                assert batch is not None
                batch.ids[message_id] = len(batch.lines)
                batch.lines.append(line)
                batch.size += len(line) + 1
            batch.threads.add(me)
            if len(batch.lines) >= writer.max_messages or self._everyone_in(batch, now):
                self._seal(batch)
            if opener:
                try:
                    self._linger_on(batch)
                except BaseException as exc:  # interrupted: fail the batch, free the others
                    self._seal(batch)
                    batch.error = exc
                    batch.done.set()
                    raise
        if opener:
            try:
                writer.write(batch.lines, batch.when)
            except BaseException as exc:
                batch.error = exc
            finally:
                batch.done.set()
        else:
            batch.done.wait()
        error = batch.error
        if error is not None:
            if isinstance(error, PublishError):
                raise PublishError(str(error)) from error.__cause__
            if not isinstance(error, Exception) and opener:
                raise error  # KeyboardInterrupt, SystemExit: the opener's own
            raise PublishError(f"could not publish to {writer.topic!r}: {error!r}") from error

    # -- under the lock ----------------------------------------------------------------

    def _seal(self, batch: _Batch) -> None:
        if not batch.sealed:
            batch.when = self.writer.ctx.next_timestamp()
        batch.sealed = True
        if self._open is batch:
            self._open = None
        self._cond.notify_all()

    def _everyone_in(self, batch: _Batch, now: float) -> bool:
        """Whether every recent publisher (one that published within
        :data:`RECENT_SECONDS`) is waiting in ``batch``. Cheap: the opener's wait also
        drops the threads that ended (:meth:`_forget`)."""
        recent = self._recent
        if recent.keys() <= batch.threads:
            return True
        return all(recent[t] + RECENT_SECONDS <= now for t in recent.keys() - batch.threads)

    def _forget(self, now: float) -> None:
        """Drop the publishers no longer recent: quiet for RECENT_SECONDS, or ended."""
        gone = [
            t for t, seen in self._recent.items()
            if seen + RECENT_SECONDS <= now or not t.is_alive()
        ]
        for t in gone:
            del self._recent[t]

    def _linger_on(self, batch: _Batch) -> None:
        """The opener waits until the batch is sealed: by a joiner (full, or everyone
        in), at its deadline, or when the publishers it waits for stop being recent."""
        while not batch.sealed:
            now = self._clock.monotonic()
            self._forget(now)
            if now >= batch.deadline or self._recent.keys() <= batch.threads:
                self._seal(batch)
                return
            absent = [s for t, s in self._recent.items() if t not in batch.threads]
            wake = min(batch.deadline, min(absent) + RECENT_SECONDS)
            self._clock.wait(self._cond, wake - now)
