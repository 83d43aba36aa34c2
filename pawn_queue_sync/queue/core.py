"""PawnQueue: the entry point. Builds the store, probes what the server honours,
and hands out topics, producers and consumers."""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from ..clock import SYSTEM_CLOCK, Clock
from ..config import PawnQueueConfig, load_config
from ..errors import ConfigError, NotStartedError, RegistrationError
from ..events import DRAIN_TIMEOUT_S, EventBus, EventCallback
from ..protocol.probe import capabilities, probe  # noqa: F401  (probe: re-exported)
from ..storage.base import Store
from ..storage.factory import build_store, check_session_client
from . import deadletters, registry, stats, topics
from . import peek as peeking
from . import purge as purging
from . import topic_stats as counting
from .consumer import Consumer
from .context import Context
from .producer import Producer

log = logging.getLogger(__name__)


class PawnQueue:
    """A queue over one bucket (or local directory).

    ``with PawnQueue.from_config(...) as pq:`` runs :meth:`setup` on enter and
    :meth:`teardown` on exit; both may also be called directly.
    """

    def __init__(
        self,
        config: str | os.PathLike[str] | Mapping[str, Any] | PawnQueueConfig | None = None,
        *,
        store: Store | None = None,
        clock: Clock = SYSTEM_CLOCK,
        session: Any = None,
        client: Any = None,
        on_event: EventCallback | None = None,
    ) -> None:
        """``config``: whatever :meth:`from_config` takes (a YAML path, a dict, a
        :class:`PawnQueueConfig` or None); anything else is a ConfigError. ``session``
        (a ``boto3.Session``) or ``client`` (a boto3 S3 client): what the S3 store's
        requests use instead of the settings' credentials (see
        :func:`~pawn_queue_sync.storage.factory.build_store`); not with ``store``.
        ``on_event``: called with every :class:`~pawn_queue_sync.events.Event` of this
        queue (published, claimed, acked, ...), on a dispatcher thread, never blocking
        the caller (see :attr:`events`)."""
        if store is not None and (session is not None or client is not None):
            raise ConfigError("store", "give a store, or a boto3 session or client, not both")
        check_session_client(session, client)
        if not isinstance(config, PawnQueueConfig):
            if config is not None and not isinstance(config, (str, os.PathLike, Mapping)):
                raise ConfigError(
                    "config", f"expected a YAML path, a dict or a PawnQueueConfig, not "
                    f"{type(config).__name__}"
                )
            config = load_config(config)
        self._config = config
        self._given_store = store
        self._session = session
        self._client = client
        self._clock = clock
        self._ctx: Context | None = None
        self._consumers: weakref.WeakSet[Consumer] = weakref.WeakSet()
        self._events = EventBus([on_event] if on_event is not None else [])

    @classmethod
    def from_config(
        cls,
        source: str | os.PathLike[str] | dict[str, Any] | PawnQueueConfig | None = None,
        *,
        session: Any = None,
        client: Any = None,
        on_event: EventCallback | None = None,
    ) -> PawnQueue:
        """A queue from a YAML path, a dict or a config object (env fills the gaps);
        ``session``/``client``: the caller's boto3 session or S3 client for its store;
        ``on_event``: as for the constructor."""
        return cls(load_config(source), session=session, client=client, on_event=on_event)

    @property
    def config(self) -> PawnQueueConfig:
        return self._config

    def __repr__(self) -> str:
        where = self._ctx.store.describe() if self._ctx else self._config.backend
        return f"PawnQueue({where}, started={self._ctx is not None})"

    # -- lifecycle ---------------------------------------------------------------------

    def setup(self) -> PawnQueue:
        """Connect, check the bucket, and probe conditional-request support. Idempotent."""
        if self._ctx is not None:
            return self
        store = self._given_store or build_store(
            self._config, session=self._session, client=self._client
        )
        try:  # a racing probe, once per store and process (see protocol.probe)
            caps = capabilities(store, self._config.concurrency.strategy)
        except BaseException:
            if self._given_store is None:
                store.close()
            raise
        self._events.open()
        self._ctx = Context(store=store, config=self._config, caps=caps, clock=self._clock,
                            events=self._events)
        log.info("pawn-queue-sync ready on %s (strategy=%s, if_match=%s)",
                 store.describe(), caps.strategy, caps.if_match)
        return self

    def teardown(self) -> None:
        """Stop running listeners (graceful: handlers finish, acks are flushed, every
        thread is joined), then thread pools, then close the store. Idempotent."""
        ctx, self._ctx = self._ctx, None
        if ctx is None:
            return
        consumers, self._consumers = list(self._consumers), weakref.WeakSet()
        for consumer in consumers:
            if not consumer.close():
                log.warning("a listener of %r did not stop", consumer)
        ctx.close()
        if self._given_store is None:
            ctx.store.close()
        dropped = self._events.dropped
        if not self._events.close():
            log.warning("teardown: %d queued event(s) not handed to on_event callbacks "
                        "within %g s: dropped", self._events.dropped - dropped,
                        DRAIN_TIMEOUT_S)

    close = teardown

    def __enter__(self) -> PawnQueue:
        return self.setup()

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    @property
    def context(self) -> Context:
        if self._ctx is None:
            raise NotStartedError(
                "PawnQueue is not set up, or was closed: call setup() or use `with`"
            )
        return self._ctx

    @property
    def events(self) -> EventBus:
        """The queue's event callbacks: ``subscribe``/``unsubscribe`` more,
        ``dropped`` (events dropped because the callbacks fell behind), ``flush()``."""
        return self._events

    @property
    def strategy(self) -> str:
        return self.context.caps.strategy

    @property
    def store(self) -> Store:
        return self.context.store

    # -- topics ---------------------------------------------------------------------------

    def create_topic(self, topic: str, packed: bool = False) -> bool:
        """Create a topic; idempotent. True if this call created it.

        ``packed=True`` makes it a packed topic (or switches an existing plain one):
        publishing writes many messages per object (segments, group-committed), and
        consumers claim a segment with one lease and ack its messages one by one. The
        switch is for good; single messages already there still drain. pawn-queue 0.1.x
        consumers do not see packed messages: switch a topic only once every consumer
        of it runs this library.
        """
        return topics.create_topic(self.context, topic, packed=packed)

    def list_topics(self) -> list[str]:
        return topics.list_topics(self.context)

    def topic_exists(self, topic: str) -> bool:
        return topics.topic_exists(self.context, topic)

    def topic_stats(self, topic: str) -> dict[str, int | bool]:
        """Counts of pending messages, leases and dead letters (three listings); a
        packed topic adds ``packed``, ``segments``, ``segment_messages`` and
        ``segments_leased`` (see :func:`~pawn_queue_sync.queue.stats.topic_stats`)."""
        return stats.topic_stats(self.context, topic)

    def stats(self, topic: str, *, max_keys: int | None = counting.MAX_KEYS
              ) -> counting.TopicStats:
        """What ``topic`` holds (pending, in flight, dead-lettered, delayed, the age of
        the oldest pending message) and the registered consumers, alive or not, from
        listings (no message is read): each stops at ``max_keys`` keys (``exact`` False
        then). ``requests`` says what it cost. See
        :func:`~pawn_queue_sync.queue.topic_stats.stats`."""
        return counting.stats(self.context, topic, max_keys)

    def stats_all(self, *, max_keys: int | None = counting.MAX_KEYS
                  ) -> list[counting.TopicStats]:
        """:meth:`stats` of every topic, by name (the registry read once)."""
        return counting.stats_all(self.context, max_keys)

    def consumers(self, *, max_keys: int | None = counting.MAX_KEYS
                  ) -> tuple[list[counting.ConsumerStatus], bool]:
        """The queue's registered consumers, alive or not, and whether the list is whole
        (False: cut at ``max_keys`` registry entries). Apart from any topic: a queue
        with no topic lists its consumers too. See
        :func:`~pawn_queue_sync.queue.topic_stats.consumers`."""
        return counting.consumers(self.context, max_keys)

    def delete_topic(self, name: str, force: bool = False) -> int:
        """Delete a topic; the number of objects deleted. Refuses
        (:class:`~pawn_queue_sync.errors.TopicNotEmptyError`) while it holds messages,
        segments, dead letters or live leases, unless ``force=True`` (see
        :func:`~pawn_queue_sync.queue.purge.delete_topic`)."""
        return purging.delete_topic(self.context, name, force=force)

    def peek(self, topic: str, n: int = 10, dead_letter: bool = False
             ) -> list[peeking.PeekedMessage] | list[deadletters.DeadLetter]:
        """Up to ``n`` of the oldest pending messages (or, with ``dead_letter``, dead
        letters), read without leasing or changing anything (LISTs and GETs only)."""
        return peeking.peek(self.context, topic, n, dead_letter=dead_letter)

    # -- dead letters ---------------------------------------------------------------------------

    def dead_letters(self, topic: str, limit: int | None = None
                     ) -> Iterator[deadletters.DeadLetter]:
        """The topic's dead letters with their reasons and delivery history, in key
        order, read a listing page at a time (a LIST per 1,000 and a GET each); an
        unreadable one comes with ``payload`` None and a reason, never an exception."""
        return deadletters.dead_letters(self.context, topic, limit)

    def redrive(self, topic: str, max: int | None = None, rate: float | None = None,
                progress: Callable[[int], None] | None = None) -> deadletters.RedriveResult:
        """Move dead letters back to the topic (at most ``max``, at most ``rate`` a
        second): id and created_at kept, delivery count reset, each message written
        before its dead letter is deleted (a crash repeats one, never loses one). See
        :func:`~pawn_queue_sync.queue.deadletters.redrive`."""
        return deadletters.redrive(self.context, topic, max=max, rate=rate, progress=progress)

    def purge(self, topic: str, section: str = "dead-letter",
              progress: Callable[[int], None] | None = None) -> int:
        """Delete the topic's dead letters (``"dead-letter"``) or its pending messages
        (``"messages"``; leased ones are kept); the number deleted. See
        :func:`~pawn_queue_sync.queue.purge.purge`."""
        return purging.purge(self.context, topic, section, progress=progress)

    # -- producers and consumers --------------------------------------------------------------

    def register_producer(self, name: str) -> Producer:
        """A producer with a stable id for ``name`` (the same id every time)."""
        return Producer(self.context, registry.register(self.context, "producers", name))

    def register_consumer(self, name: str, topics: Sequence[str],
                          on_event: EventCallback | None = None) -> Consumer:
        """A consumer with a stable id for ``name``, subscribed to existing ``topics``;
        ``on_event`` is called with this consumer's events (claimed, acked, ...,
        poll_error) besides the queue's callbacks."""
        if on_event is not None and not callable(on_event):
            raise TypeError(f"on_event must be callable, not {type(on_event).__name__}")
        if isinstance(topics, str):
            topics = [topics]
        if not topics:  # checked before anything is written to the registry
            raise RegistrationError(f"consumer {name!r} needs at least one topic")
        for topic in topics:
            self.context.require_topic(topic)
        consumer = Consumer(
            self.context, registry.register(self.context, "consumers", name), topics,
            on_event=on_event,
        )
        self._consumers.add(consumer)
        return consumer

    def list_registrations(self, role: registry.Role | None = None) -> list[registry.RegistryEntry]:
        return registry.list_entries(self.context, role)
