"""Consumers: poll pending messages of their topics, and settle them.

A consumer keeps the public poll/ack API, its registry entry (heartbeat, rank among
the registered consumers) and what it holds; how a topic's messages are planned,
claimed and settled is its :class:`~pawn_queue_sync.queue.source.MessageSource`'s
(one object per message, :mod:`.objects`; a packed topic's segments first,
:mod:`.packed`). ``listen`` and
``leased`` run the :mod:`~pawn_queue_sync.runtime` on it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from ..errors import InvalidArgument, LeaseLostError, StorageError
from ..events import EventCallback
from ..runtime.listen import Listener
from ..runtime.options import ListenOptions, resolve_options
from ..runtime.refresher import LeaseRefresher
from . import dedup, delayed, idle, promotion, registry
from .claimant import Claimant
from .context import Context
from .message import Message
from .objects import ObjectSource
from .packed import PackedSource
from .registry import RegistryEntry
from .source import MessageSource

log = logging.getLogger(__name__)


class Consumer:
    """Consumes one or more topics under a registered, stable consumer id."""

    def __init__(self, ctx: Context, entry: RegistryEntry, topics: Sequence[str],
                 on_event: EventCallback | None = None) -> None:
        if isinstance(topics, str):
            topics = [topics]
        if not topics:
            raise ValueError("a consumer needs at least one topic")
        for topic in topics:
            ctx.require_topic(topic)
        self._ctx = ctx
        self._entry = entry
        self._topics = list(dict.fromkeys(topics))
        self._rr = 0
        #: our id, randomness and what we hold, as claims and settlements see them
        self._claimant = Claimant(ctx, entry.entity_id, self, on_event=on_event)
        #: our rank among the registered consumers and their number (None: not asked
        #: yet), and when (monotonic) we asked
        self._peers: tuple[int, int] | None = None
        self._peers_at = 0.0
        #: when (monotonic) our registry entry was last written: registration just did
        self._beat_at = ctx.clock.monotonic()
        #: messages stored one object each (every plain topic's, and a packed topic's
        #: single messages)
        self._objects = ObjectSource(self._claimant, self._registered_peers)
        #: packed topics' segments (their single messages through ``_objects``)
        self._packed = PackedSource(self._claimant, self._registered_peers, self._objects)
        #: topic -> the source its messages come from and are settled by (a packed
        #: topic's segments excepted: see _polled and _source)
        self._sources: dict[str, MessageSource] = dict.fromkeys(self._topics, self._objects)
        for topic in self._topics:  # asked now, so a first poll costs what it did
            with suppress(StorageError):  # a poll asks again
                ctx.topic_packed(topic)
        #: the listeners running :meth:`listen` now: :meth:`stop` and :meth:`close`
        #: stop them
        self._listeners: set[Listener] = set()
        #: expiry of the topics' dedup markers, now and then during polls
        self._markers = dedup.MarkerJanitor(ctx)
        #: moves due delayed messages to messages/, at most once a poll interval a topic
        self._promoter = promotion.Promoter(
            ctx, lambda topic, _n: self._packed.singles_arrived(topic))

    @property
    def _lock(self) -> threading.Lock:
        """The lock of what this consumer holds and runs (renewed in a forked child)."""
        return self._claimant.lock

    # -- identity ---------------------------------------------------------------------

    @property
    def id(self) -> str:
        return self._entry.entity_id

    @property
    def name(self) -> str:
        return self._entry.name

    @property
    def topics(self) -> list[str]:
        return list(self._topics)

    @property
    def context(self) -> Context:
        return self._ctx

    def __repr__(self) -> str:
        return f"Consumer(name={self.name!r}, id={self.id!r}, topics={self._topics!r})"

    def inflight(self) -> list[Message]:
        """Messages this consumer holds a lease on and has not settled yet."""
        return self._claimant.held()

    # -- polling --------------------------------------------------------------------------

    def poll(self, max_messages: int | None = None) -> list[Message]:
        """Claim up to ``max_messages`` (default ``polling.max_messages_per_poll``)
        messages, oldest first within a topic (at random among the oldest when other
        consumers hold leases there or took keys from us); topics take turns first.
        ``0`` claims nothing; a negative number is a ValueError.

        A topic whose requests fail does not cost the others: the poll goes on and
        returns what it claimed, logging a warning that names the failed topic. A poll
        that claimed nothing raises the (first) failure, the topic named in it."""
        want = self._wanted(max_messages)
        if want == 0:
            return []
        self._heartbeat()
        got: list[Message] = []
        failed: list[tuple[str, StorageError]] = []
        start = self._rr
        self._rr = (self._rr + 1) % len(self._topics)
        for i in range(len(self._topics)):
            if len(got) >= want:
                break
            topic = self._topics[(start + i) % len(self._topics)]
            self._markers.run_due(topic)
            try:
                got.extend(idle.poll_topic(self._ctx, topic, want - len(got),
                                           self._polled(topic), self._promoter, self._packed))
            except StorageError as exc:  # claims made elsewhere are kept, never dropped
                failed.append((topic, exc))
                self._claimant.emit("poll_error", topic, None, error=str(exc))
            except Exception as exc:
                self._claimant.emit("poll_error", topic, None,
                                    error=f"{type(exc).__name__}: {exc}")
                if not got:
                    raise
                # raising would strand what this poll claimed on other topics (leased,
                # never handed out): return it, and log as a failed topic is logged
                log.error("poll of topic %r failed (returning %d message(s) claimed on "
                          "other topics): %s: %s", topic, len(got), type(exc).__name__, exc)
                break
        if failed and not got:
            topic, exc = failed[0]
            for other, error in failed[1:]:
                log.warning("poll of topic %r failed: %s", other, error)
            raise _naming(topic, exc) from exc
        for topic, exc in failed:
            log.warning("poll of topic %r failed (returning %d message(s) claimed on "
                        "other topics): %s", topic, len(got), exc)
        return got

    def _wanted(self, max_messages: int | None) -> int:
        """How many messages a poll asks for: ``max_messages``, or the configured
        default when None."""
        if max_messages is None:
            return self._ctx.config.polling.max_messages_per_poll
        if isinstance(max_messages, bool) or not isinstance(max_messages, int):
            raise TypeError(
                f"max_messages must be an int or None, got {type(max_messages).__name__}"
            )
        if max_messages < 0:
            raise ValueError(f"max_messages must be >= 0, got {max_messages}")
        return max_messages

    def _polled(self, topic: str) -> MessageSource:
        """The source a poll of ``topic`` asks: segments first for a packed topic (whose
        manifest the context looks up at most every PACKED_RECHECK_SECONDS)."""
        source = self._sources.get(topic, self._objects)
        if source is self._objects and self._ctx.topic_packed(topic):
            return self._packed
        return source

    def _source(self, msg: Message) -> MessageSource:
        """The source that settles ``msg``: a message of a segment, the packed source;
        any other, its topic's (a packed topic's single messages settle as plain ones;
        one object each for a topic not ours)."""
        if msg.segment is not None:
            return self._packed
        return self._sources.get(msg.topic, self._objects)

    def _registered_peers(self) -> tuple[int, int]:
        """Our rank among the live registered consumers (see :func:`registry.rank`:
        written within a few heartbeat intervals, by the server's clock) and their
        number, asked again at most every ``registry.heartbeat_interval_seconds`` (one
        LIST of keys); an error counts as one peer besides us. Our own entry is kept
        alive by :meth:`_heartbeat`, which every poll runs."""
        now = self._ctx.clock.monotonic()
        every = self._ctx.config.registry.heartbeat_interval_seconds
        if self._peers is None or now - self._peers_at >= every:
            self._peers_at = now
            try:
                self._peers = registry.rank(self._ctx, "consumers", self.id)
            except StorageError as exc:
                log.warning("could not list registered consumers: %s", exc)
                self._peers = self._peers or (self._claimant.rng.randrange(2), 2)
        return self._peers

    def _heartbeat(self) -> None:
        """Rewrite our registry entry's ``last_seen`` once a heartbeat interval has
        passed since it was last written (one PUT an interval, not a request per poll),
        so peers' :func:`registry.rank` counts us as alive. A failure only logs; the
        next try is an interval later."""
        now = self._ctx.clock.monotonic()
        if now - self._beat_at < self._ctx.config.registry.heartbeat_interval_seconds:
            return
        self._beat_at = now
        try:
            self._entry = registry.heartbeat(self._ctx, self._entry)
        except StorageError as exc:
            log.warning("consumer %r: registry heartbeat failed: %s", self.name, exc)

    # -- settling ---------------------------------------------------------------------------

    def ack(self, msg: Message) -> None:
        """Delete a message we hold (then its lease). See :meth:`ack_many`."""
        self.ack_many([msg])

    def ack_many(self, msgs: Iterable[Message]) -> None:
        """Delete messages we hold, in as few requests as fencing allows: messages first,
        then their leases, so nobody can claim a message whose ack is under way.

        A lease still well inside its visibility timeout is ours by construction (no one
        removes a lease before it is stale), so its message is deleted without asking.
        Older ones are re-proven with conditional refreshes, in parallel on the claim
        pool, and each group is deleted as soon as it is proven: proof and delete stay
        within the fence however many there are. An ack waits for a refresh of its
        message under way; refreshes that start later do nothing (see :meth:`refresh`).

        Raises LeaseLostError (after acking the others) if a refresh found another
        lease on some message: only that makes a message lost. Raises StorageError if
        some could not be acked for another reason (the store failed, or it was too
        slow to prove a lease within the fence): those stay leased, ack them again.
        """
        groups: dict[int, tuple[MessageSource, list[Message]]] = {}
        for msg in msgs:
            source = self._source(msg)
            groups.setdefault(id(source), (source, []))[1].append(msg)
        failures: list[StorageError | LeaseLostError] = []
        for source, group in groups.values():  # each source acks its own
            try:
                source.ack_many(group)
            except (StorageError, LeaseLostError) as exc:
                failures.append(exc)
        if failures:  # a StorageError first: those messages are to be acked again
            raise next((e for e in failures if isinstance(e, StorageError)), failures[0])

    def nack(self, msg: Message, reason: str | None = None) -> None:
        """Write the message to the dead-letter prefix with ``reason``, then delete it
        and its lease. If the dead-letter write fails, nothing is deleted."""
        _check_text("reason", reason)
        leased = msg.state == "leased"
        self._source(msg).nack(msg, reason)
        if leased and msg.state == "nacked":
            self._claimant.emit("nacked", msg.topic, msg.id, delivery_count=msg.delivery_count,
                                duration=self._claimant.held_for(msg),
                                error=reason or "nacked")

    def release(self, msg: Message) -> None:
        """Give the lease back so the message is delivered again at once."""
        self._source(msg).release(msg)

    def retry(self, msg: Message, error: str | None = None,
              delay_seconds: float | None = None) -> None:
        """Record a failed attempt on the message itself, then release it.

        The count travels with the message (an ``attempts`` field), so any consumer
        that takes it next knows its ``delivery_count``.

        With ``delay_seconds`` (up to ``publishing.max_delay_seconds``, else
        InvalidArgument) it comes back no sooner than that by the server's clock, as a
        delayed message written before this one is removed (:mod:`.delayed`).
        """
        _check_text("error", error)
        delay = delayed.check_delay(delay_seconds,
                                    self._ctx.config.publishing.max_delay_seconds,
                                    error=InvalidArgument)
        leased = msg.state == "leased" and not msg.settling
        if delay is None:
            self._source(msg).retry(msg, error)  # the call every source takes
        else:
            self._source(msg).retry(msg, error, delay)
        if leased and msg.state not in ("leased", "lost"):
            self._claimant.emit("retried", msg.topic, msg.id, delivery_count=msg.delivery_count,
                                duration=self._claimant.held_for(msg), error=error)

    def refresh(self, msg: Message) -> None:
        """Extend our lease by a visibility timeout, proving it is still ours.

        Refresh and settlement exclude each other per message: an ack waits for a
        refresh under way, and a refresh while an ack is under way, or after the
        message was acked or nacked, does nothing (there is nothing left to renew, and
        the ack deleting the lease is no loss). Raises LeaseLostError if another
        lease was found (the message is then ``lost``) or the message was given back.
        """
        self._source(msg).refresh(msg)

    def lease_age(self, msg: Message) -> float:
        """Seconds since our current lease version was written (by the local clock;
        for a message of a segment, the segment's lease)."""
        if msg.segment is not None:
            return msg.segment.age()
        return self._ctx.clock.monotonic() - msg.lease_written_at

    # -- the runtime ------------------------------------------------------------------------

    @contextmanager
    def leased(self, msg: Message) -> Iterator[Message]:
        """Keep ``msg``'s lease refreshed while the block runs (for long work in pull
        mode); the refresher thread is stopped and joined when the block ends."""
        interval = self._ctx.config.polling.lease_refresh_interval_seconds
        refresher = LeaseRefresher(self, interval)
        refresher.track(msg)
        refresher.start()
        try:
            yield msg
        finally:
            refresher.stop()

    def listen(
        self,
        handler: Callable[[Message], Any],
        options: ListenOptions | None = None,
        *,
        stop_event: threading.Event | None = None,
        **kwargs: Any,
    ) -> None:
        """Block, handing each message to ``handler`` on a thread pool, until
        :meth:`stop`, ``stop_event`` or an error.

        ``options`` (a :class:`~pawn_queue_sync.runtime.ListenOptions`) and/or its
        fields as keywords, which win over it: ``max_workers`` (default 4),
        ``max_messages``, ``idle_timeout_seconds``, ``shutdown_timeout_seconds``,
        ``handler_timeout_seconds``, ``install_signal_handlers``, ...; every duration
        in seconds. The older names without ``_seconds`` (``idle_timeout``,
        ``shutdown_timeout``, ...) are deprecated aliases (a DeprecationWarning); an
        unknown name is a TypeError. Runs a
        :class:`~pawn_queue_sync.runtime.Listener`: see :mod:`pawn_queue_sync.runtime`."""
        opts = resolve_options(options, kwargs)  # here, so a warning names the caller
        listener = Listener(self, handler, opts, stop_event=stop_event)
        with self._lock:
            self._listeners.add(listener)
        try:
            listener.run()  # ends with give_back()
        finally:
            with self._lock:
                self._listeners.discard(listener)

    def give_back(self) -> None:
        """Give back the segments of packed topics we hold with no message out
        (``released``, their progress kept), so other consumers take them at once
        rather than after a visibility timeout. :meth:`close` and the end of
        :meth:`listen` and of :func:`~pawn_queue_sync.drain` (any listener) do it; a
        segment with messages out stays ours."""
        try:
            self._packed.give_back()
        except StorageError as exc:  # they go stale instead
            log.warning("consumer %r: could not give back segments: %s", self.name, exc)

    def stop(self) -> None:
        """Ask a running :meth:`listen` to stop gracefully."""
        for listener in self._running():
            listener.stop()

    def close(self, timeout: float | None = None) -> bool:
        """Stop a running :meth:`listen` and wait up to ``timeout`` seconds for it to
        finish (handlers, acks, refresher: every thread joined). True when it has.
        Then gives back the packed topics' segments held with no message out
        (:meth:`give_back`)."""
        listeners = self._running()
        for listener in listeners:
            listener.stop()
        clock = self._ctx.clock  # as Listener.join measures its timeout
        ends = None if timeout is None else clock.monotonic() + timeout
        joined = all([
            bool(listener.join(None if ends is None else max(0.0, ends - clock.monotonic())))
            for listener in listeners
        ])
        self.give_back()
        return joined

    def _running(self) -> list[Listener]:
        with self._lock:
            return list(self._listeners)

    def janitor(self, topic: str | None = None) -> int:
        """Remove stale leases and expired dedup markers (up to
        :data:`~pawn_queue_sync.queue.dedup.EXPIRE_PER_RUN` per topic) now; returns how
        many leases are live afterwards."""
        topics = [topic] if topic else self._topics
        live = sum(self._polled(t).janitor(t) for t in topics)
        for t in topics:  # after the leases: a failure here leaves them reaped
            self._markers.run(t)
        return live


def _check_text(name: str, value: object) -> None:
    """A settlement's reason is text (it is written into the message): anything else is
    a TypeError before any request, rather than a failure half-way."""
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name} must be a str or None, not {type(value).__name__} "
                        f"(pass str(exc) or describe_error(exc) for an exception)")


def _naming(topic: str, exc: StorageError) -> StorageError:
    """``exc`` again (its class where it can), its message naming the topic whose poll
    failed."""
    text = f"poll of topic {topic!r} failed: {exc}"
    try:
        named = type(exc)(text)
    except TypeError:  # a subclass with another signature
        named = StorageError(text)
    named.key = exc.key
    return named


__all__ = ["Consumer"]
