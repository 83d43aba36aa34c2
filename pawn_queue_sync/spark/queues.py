"""The queues and stores the Spark side works through: one started
:class:`~pawn_queue_sync.PawnQueue` per process (keyed by ``os.getpid()``, reused by
later tasks when Spark reuses its Python workers, ``spark.python.worker.reuse``, the
default), one bare store per process for reads and stream bookkeeping, and a queue for
one call on the driver.

Nothing here holds a client across a process boundary: executors receive a plain
configuration (:class:`~pawn_queue_sync.spark.settings.Settings`) and build their own.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Generic, TypeVar

from .. import layout
from ..encoding import canonical_json
from ..errors import ObjectNotFound, TopicNotFoundError
from ..queue.core import PawnQueue
from ..storage.base import Store
from ..storage.factory import build_store
from .settings import ConfigSource, Settings

__all__ = [
    "executor_queue",
    "is_packed",
    "queue_for",
    "queue_for_driver",
    "require_topic",
    "store_for",
]

T = TypeVar("T")


class PerProcess(Generic[T]):
    """One ``T`` per (process, settings), built on first use by ``build``: keyed by
    ``os.getpid()`` so a forked child never uses its parent's clients."""

    def __init__(self, build: Callable[[Settings], T]) -> None:
        self._build = build
        self._items: dict[tuple[int, str], T] = {}
        self._lock = threading.Lock()

    def get(self, settings: Settings) -> T:
        key = (os.getpid(), settings.fingerprint)
        with self._lock:
            item = self._items.get(key)
            if item is None:
                for stale in [k for k in self._items if k[0] != key[0]]:
                    del self._items[stale]  # inherited across a fork: never used here
                item = self._items[key] = self._build(settings)
            return item


_queues: PerProcess[PawnQueue] = PerProcess(lambda s: PawnQueue(s.config()).setup())


def queue_for(settings: Settings) -> PawnQueue:
    """The started queue of this process for ``settings`` (built on first use).

    Kept for the life of the process so a reused Python worker pays the client build
    and capability probe once; its thread pools are idle between tasks, so nothing is
    lost when a non-reused worker exits.
    """
    return _queues.get(settings)


_settings_cache: dict[str, Settings] = {}


def executor_queue(config: ConfigSource | Settings) -> PawnQueue:
    """The started queue of this process for ``config``, for use inside Spark tasks
    (handlers, ``mapPartitions``): built once per process, shared, never to be closed
    by the caller. Pass the same plain configuration you gave the driver-side call."""
    if isinstance(config, Settings):
        return queue_for(config)
    if isinstance(config, Mapping):  # cache by content: handlers call this per message
        try:
            digest = hashlib.sha256(canonical_json(dict(config))).hexdigest()
        except (TypeError, ValueError):  # not plain JSON data: no caching
            return queue_for(Settings(config))
        settings = _settings_cache.get(digest)
        if settings is None:
            settings = _settings_cache[digest] = Settings(config)
        return queue_for(settings)
    return queue_for(Settings(config))


@contextmanager
def queue_for_driver(settings: Settings) -> Iterator[PawnQueue]:
    """A queue started for one call on the driver, closed after it."""
    with PawnQueue(settings.config()) as pq:
        yield pq


_stores: PerProcess[Store] = PerProcess(lambda s: build_store(s.config()))


def store_for(settings: Settings) -> Store:
    """A store of this process for ``settings``: no capability probe, so a snapshot
    read works with read-only credentials."""
    return _stores.get(settings)


def require_topic(store: Store, topic: str) -> None:
    """Fail with TopicNotFoundError (on the driver, before any task) unless ``topic``
    exists."""
    layout.validate_topic(topic)
    try:
        store.head(layout.topic_marker_key(topic))
    except ObjectNotFound:
        raise TopicNotFoundError(topic) from None


def is_packed(store: Store, topic: str) -> bool:
    """Whether ``topic`` is packed (its manifest exists: one HEAD)."""
    try:
        store.head(layout.packed_manifest_key(topic))
    except ObjectNotFound:
        return False
    return True
