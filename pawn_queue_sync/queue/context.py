"""What every part of a started queue shares: the store, the configuration, the
server's capabilities, the clock, and thread pools (rebuilt after a fork)."""

from __future__ import annotations

import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import attrs

from .. import layout
from ..clock import Clock
from ..config import FENCE_MARGIN_FRACTION, FENCE_MARGIN_MIN_SECONDS, PawnQueueConfig
from ..errors import ObjectNotFound, StorageError, TopicNotFoundError
from ..events import Event, EventBus, EventCallback
from ..protocol.lease import Capabilities, CsprngSettings
from ..storage.base import Store

#: How long a topic found plain (no ``{topic}/.packed``) counts as plain before the
#: manifest is looked up again; a packed topic stays packed (the manifest is never removed).
PACKED_RECHECK_SECONDS = 30.0


@attrs.define(eq=False)
class Context:
    """Shared state of one started :class:`~pawn_queue_sync.PawnQueue`."""

    store: Store
    config: PawnQueueConfig
    caps: Capabilities
    clock: Clock
    #: the queue's event callbacks (``PawnQueue(on_event=...)``): see :meth:`emit`
    events: EventBus = attrs.field(factory=EventBus, repr=False)
    _known_topics: set[str] = attrs.field(factory=set, init=False)
    #: topic -> monotonic time it was found plain; packed ones are in _packed_topics
    _plain_seen: dict[str, float] = attrs.field(factory=dict, init=False)
    _packed_topics: set[str] = attrs.field(factory=set, init=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    #: one manifest lookup at a time: threads starting together send one HEAD, not many
    _packed_check: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _pools: dict[str, ThreadPoolExecutor] = attrs.field(factory=dict, init=False)
    #: name -> the workers its pool was built with
    _sizes: dict[str, int] = attrs.field(factory=dict, init=False)
    #: pools replaced by larger ones: still serving whoever holds them, shut at close()
    _retired: list[ThreadPoolExecutor] = attrs.field(factory=list, init=False)
    _pools_pid: int = attrs.field(factory=os.getpid, init=False)
    _last_ts: datetime = attrs.field(
        factory=lambda: datetime.min.replace(tzinfo=timezone.utc), init=False
    )

    def __attrs_post_init__(self) -> None:
        _CONTEXTS.add(self)

    @property
    def strategy(self) -> str:
        return self.caps.strategy

    @property
    def csprng(self) -> CsprngSettings:
        cv = self.config.concurrency.csprng_verify
        return CsprngSettings(
            jitter_min_ms=cv.jitter_min_ms,
            jitter_max_ms=cv.jitter_max_ms,
            verify_retries=cv.verify_retries,
            verify_retry_delay_ms=cv.verify_retry_delay_ms,
            consistent_list=cv.consistent_list,
        )

    @property
    def visibility(self) -> float:
        return self.config.polling.visibility_timeout_seconds

    def fence_margin(self) -> float:
        """How long before its visibility timeout a lease stops counting as safely
        ours without asking the server again."""
        return max(FENCE_MARGIN_MIN_SECONDS, FENCE_MARGIN_FRACTION * self.visibility)

    def pool(self, name: str, workers: int) -> ThreadPoolExecutor:
        """A named, lazily built thread pool of this process (never one from before a
        fork) with at least ``workers`` threads: the largest ever asked for. A call
        asking for more than the pool has replaces it with a larger one; the old one
        keeps running what it was given (and what a holder still submits to it) and is
        shut down with the context."""
        with self._lock:
            if self._pools_pid != os.getpid():
                self._pools, self._sizes, self._retired = {}, {}, []  # not ours: the
                self._pools_pid = os.getpid()  # parent's threads do not exist here
            pool = self._pools.get(name)
            if pool is None or self._sizes[name] < workers:
                if pool is not None:
                    self._retired.append(pool)
                pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"pawnq-{name}")
                self._pools[name] = pool
                self._sizes[name] = workers
            return pool

    def next_timestamp(self, when: datetime | None = None) -> datetime:
        """Strictly increasing publish times within this process, so keys keep the
        order in which one producer published."""
        with self._lock:
            now = when or self.clock.now()
            if now <= self._last_ts:
                now = self._last_ts + timedelta(microseconds=1)
            self._last_ts = now
            return now

    def emit(self, kind: str, topic: str, message_id: str | None = None, *,
             delivery_count: int | None = None, duration: float | None = None,
             consumer_id: str | None = None, producer_id: str | None = None,
             error: str | None = None, also: EventCallback | None = None) -> None:
        """Queue an :class:`~pawn_queue_sync.events.Event` for the queue's callbacks
        (and ``also``, a consumer's own): nothing is built when no one listens, and
        nothing waits (see :mod:`pawn_queue_sync.events`)."""
        if also is None and not self.events.active:
            return
        self.events.publish(Event(kind, topic, message_id, self.clock.now(), delivery_count,
                                  duration, consumer_id, producer_id, error), also)

    # -- topics -----------------------------------------------------------------------

    def require_topic(self, topic: str) -> None:
        """Raise unless the topic exists; checked against the store once per process."""
        layout.validate_topic(topic)
        if topic in self._known_topics:
            return
        try:
            self.store.head(layout.topic_marker_key(topic))
        except ObjectNotFound:
            raise TopicNotFoundError(topic) from None
        self.remember_topic(topic)

    def remember_topic(self, topic: str) -> None:
        with self._lock:
            self._known_topics.add(topic)

    def forget_topic(self, topic: str) -> None:
        """Drop what this process cached about ``topic`` (deleted: ``delete_topic``)."""
        with self._lock:
            self._known_topics.discard(topic)
            self._packed_topics.discard(topic)
            self._plain_seen.pop(topic, None)

    def topic_packed(self, topic: str) -> bool:
        """Whether ``topic`` is packed (its manifest ``{topic}/.packed`` exists): one HEAD,
        then cached in this process, a True for good (the manifest is never removed), a
        False for :data:`PACKED_RECHECK_SECONDS` (another process may switch the topic)."""
        cached = self._packed_cached(topic)
        if cached is not None:
            return cached
        with self._packed_check:  # others starting together wait for this lookup
            cached = self._packed_cached(topic)
            if cached is not None:
                return cached
            with self._lock:
                seen = self._plain_seen.get(topic)
            now = self.clock.monotonic()
            try:
                self.store.head(layout.packed_manifest_key(topic))
            except ObjectNotFound:
                pass
            except StorageError:
                if seen is None:
                    raise
                # A recheck that failed: keep the answer we had (a message published
                # plain into a packed topic is still consumed), look again later.
            else:
                self.remember_packed(topic)
                return True
            with self._lock:
                if topic in self._packed_topics:  # marked meanwhile by create_topic
                    return True
                self._plain_seen[topic] = now
            return False

    def _packed_cached(self, topic: str) -> bool | None:
        """The cached answer of :meth:`topic_packed`, or None when it must look."""
        with self._lock:
            if topic in self._packed_topics:
                return True
            seen = self._plain_seen.get(topic)
            if seen is not None and self.clock.monotonic() - seen < PACKED_RECHECK_SECONDS:
                return False
            return None

    def remember_packed(self, topic: str) -> None:
        """Cache that ``topic`` is packed (its manifest exists)."""
        with self._lock:
            self._packed_topics.add(topic)
            self._plain_seen.pop(topic, None)

    def close(self) -> None:
        with self._lock:
            pools = [*self._pools.values(), *self._retired]
            self._pools, self._sizes, self._retired = {}, {}, []
            same_process = self._pools_pid == os.getpid()
        if same_process:
            for pool in pools:
                pool.shutdown(wait=True, cancel_futures=True)


#: Every live context, so a forked child can give them fresh locks.
_CONTEXTS: weakref.WeakSet[Context] = weakref.WeakSet()


def _reset_locks_after_fork() -> None:
    """In a forked child only the forking thread exists: a lock another thread held at
    the fork would stay held forever, so every context gets a fresh one."""
    for ctx in list(_CONTEXTS):
        ctx._lock = threading.Lock()
        ctx._packed_check = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_locks_after_fork)
