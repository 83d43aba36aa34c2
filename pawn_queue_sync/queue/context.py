"""What every part of a started queue shares: the store, the configuration, the
server's capabilities, the clock, and thread pools (rebuilt after a fork)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import attrs

from ..clock import Clock
from ..config import PawnQueueConfig
from ..errors import ObjectNotFound, TopicNotFoundError
from ..protocol.lease import Capabilities, CsprngSettings
from ..storage.base import Store
from . import layout


@attrs.define(eq=False)
class Context:
    """Shared state of one started :class:`~pawn_queue_sync.PawnQueue`."""

    store: Store
    config: PawnQueueConfig
    caps: Capabilities
    clock: Clock
    _known_topics: set[str] = attrs.field(factory=set, init=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _pools: dict[str, ThreadPoolExecutor] = attrs.field(factory=dict, init=False)
    _pools_pid: int = attrs.field(factory=os.getpid, init=False)
    _last_ts: datetime = attrs.field(
        factory=lambda: datetime.min.replace(tzinfo=timezone.utc), init=False
    )

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
        return max(2.0, 0.2 * self.visibility)

    def pool(self, name: str, workers: int) -> ThreadPoolExecutor:
        """A named, lazily built thread pool of this process (never one from before a fork)."""
        with self._lock:
            if self._pools_pid != os.getpid():
                self._pools = {}  # the parent's threads do not exist here
                self._pools_pid = os.getpid()
            pool = self._pools.get(name)
            if pool is None:
                pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"pawnq-{name}")
                self._pools[name] = pool
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
        with self._lock:
            self._known_topics.discard(topic)

    def close(self) -> None:
        with self._lock:
            pools, self._pools = self._pools, {}
            same_process = self._pools_pid == os.getpid()
        if same_process:
            for pool in pools.values():
                pool.shutdown(wait=True, cancel_futures=True)
