"""Consumers: find pending messages, claim them under a lease, and settle them.

A poll makes one LIST of the topic's leases (LIST metadata is enough to judge them by
the server's clock), removes stale ones only if unchanged, makes one LIST of pending
messages, then claims candidates in parallel on a thread pool: lease first, then the
message body. With csprng_verify the candidates' leases are claimed as one batch (the
lease LIST is the "is it free" check, listings verify), then the bodies are fetched in
parallel. A claim whose message has vanished (acked meanwhile) gives its lease back.
Malformed or foreign objects are moved to the dead-letter prefix with a reason and
never break a poll.
"""

from __future__ import annotations

import base64
import bisect
import json
import logging
import os
import random
import threading
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import contextmanager
from typing import Any, TypeVar

import attrs

from .. import layout
from ..errors import ConditionFailed, LeaseLostError, ObjectNotFound, StorageError
from ..protocol import lease as leases
from ..protocol.effects import run
from ..storage.base import DELETE_BATCH, GetResult, ObjectInfo
from . import registry
from .context import Context
from .message import Message
from .registry import NAMESPACE, RegistryEntry

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")

_REQUIRED_FIELDS = ("id", "payload")
#: What a message is, as a producer wrote it (delivery records added later aside; the
#: producer aside too: the same payload re-published by another producer is handled).
_CONTENT_FIELDS = ("id", "topic", "created_at", "payload")
#: How many stale leases one poll removes at most (the rest wait for the next poll).
_REAP_PER_POLL = 200
#: With rivals about, a poll picks its claims at random among this many times more
#: candidates than it wants, so consumers polling together rarely race for one key.
_CONTENDED_WINDOW = 16
#: Keys a message listing reaches beyond the window and the held ones (foreign objects,
#: messages published meanwhile before the held ones).
_LIST_SLACK = 8
#: A consumer's share of scarce candidates (see Consumer._run_of) is at least this many:
#: each poll waits out the jitter, so a backlog's last messages drained a few at a time
#: would take many polls.
_MIN_SHARE = 32
#: csprng_verify batch claims send their PUTs this many at a time at most: a group must
#: leave while the lease listing is fresh (jitter_min), and sending 64 costs ~60 ms of
#: client CPU on a busy machine; a re-listing before a group costs one request.
_CSPRNG_GROUP = 32
#: An ack re-proves a message's lease at most this many times before giving up on it
#: for now (it stays leased): each proof must be followed by its delete within the fence.
_ACK_ROUNDS = 3
#: Seconds an ack batch keeps in hand before the fence of its oldest lease (at most a
#: quarter of the fence window): a lease closer to its fence is re-proven first.
_ACK_ROOM_SECONDS = 1.0
#: Every live consumer, so a forked child can give them fresh locks.
_CONSUMERS: weakref.WeakSet[Consumer] = weakref.WeakSet()


class Consumer:
    """Consumes one or more topics under a registered, stable consumer id."""

    def __init__(self, ctx: Context, entry: RegistryEntry, topics: Sequence[str]) -> None:
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
        self._rng = random.SystemRandom()
        self._lock = threading.Lock()
        self._inflight: dict[str, Message] = {}
        self._leases_seen: dict[str, int] = {}
        #: topic -> our last poll there saw rivals: lost claims, or leases not ours
        self._contended: dict[str, bool] = {}
        #: ids of messages acked whose leases are being deleted (still ours meanwhile)
        self._releasing: set[str] = set()
        #: topic -> our last poll there found no pending message
        self._idle: dict[str, bool] = {}
        #: topic -> the message id our last batch claim's run ended at (see _run_of)
        self._cursor: dict[str, str] = {}
        #: our rank among the registered consumers and their number (None: not asked
        #: yet), and when (monotonic) we asked
        self._peers: tuple[int, int] | None = None
        self._peers_at = 0.0
        #: when (monotonic) our registry entry was last written: registration just did
        self._beat_at = ctx.clock.monotonic()
        #: topic -> the lister of our batch claims' lease ranges (keeps its estimate)
        self._ranges: dict[str, leases.KeyRange] = {}
        _CONSUMERS.add(self)

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
        with self._lock:
            return list(self._inflight.values())

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
            try:
                got.extend(self._poll_topic(topic, want - len(got)))
            except StorageError as exc:  # claims made elsewhere are kept, never dropped
                failed.append((topic, exc))
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

    def _poll_topic(self, topic: str, want: int) -> list[Message]:
        prefix = layout.messages_prefix(topic)
        # With rivals about (a poll lost claims, or saw leases that are not ours), pick
        # at random among the oldest _CONTENDED_WINDOW x want, so consumers polling
        # together seldom race for one key (a lost conditional PUT is a request wasted,
        # and SeaweedFS answers it slowly); alone, oldest first. A wider listing is
        # still one request.
        known = self._contended.get(topic)
        contended = bool(known)
        if self._idle.get(topic, True):
            # Idle (or first) poll: messages first, so an empty topic costs one request.
            # The listing must reach past the messages others hold: last poll's lease
            # count is the estimate. A first poll lists wide: whether to spread is known
            # only once the registry is asked, and a page is not listed twice.
            seen = self._leases_seen.get(topic, 0)
            window = self._window(want, seen, contended or known is None)
            listing = self._ctx.store.list(prefix, limit=window + seen + _LIST_SLACK)
            if not listing.objects:
                return []
            if known is None:
                # First poll with messages: consumers started together would all take
                # the same oldest keys, so spread at once if others are registered.
                contended = self._registered_peers()[1] > 1
                window = self._window(want, seen, contended)
            live, listed_at = self._live_leases(topic)
            rivals = self._rivals_hold(topic, live)
            if listing.truncated and len(listing.objects) < window + len(live) + _LIST_SLACK:
                listing = self._ctx.store.list(prefix, limit=window + len(live) + _LIST_SLACK)
        else:
            # Busy: leases first, so a message acked between the two listings is not
            # mistaken for a free one (that costs a claim, a GET and a release for nothing).
            live, listed_at = self._live_leases(topic)
            rivals = self._rivals_hold(topic, live)
            window = self._window(want, len(live), rivals or contended)
            listing = self._ctx.store.list(prefix, limit=window + len(live) + _LIST_SLACK)
        self._leases_seen[topic] = len(live)
        self._idle[topic] = not listing.objects
        # One candidate per message id, the oldest: two objects with one id (a
        # publish retried without created_at) share one lease key, so one is claimed,
        # and the other once the first is settled and its lease gone.
        candidates: list[tuple[str, str]] = []
        taken = set(live)
        for info in listing.objects:
            mid = layout.parse_message_key(topic, info.key)
            if mid is None:
                self._quarantine_foreign(topic, info.key, info.size)
            elif mid not in taken:
                taken.add(mid)
                candidates.append((info.key, mid))
            if len(candidates) >= window:
                break
        if not candidates:
            return []
        batches = self._claims_in_batches()
        if batches and (rivals or contended):
            candidates = self._run_of(topic, candidates, want)
        elif len(candidates) > want:
            candidates = self._rng.sample(candidates, want)
        if batches:
            results = self._claim_batch(topic, candidates, listed_at)
        else:
            outcomes = self._in_parallel(lambda c: self._claim_safely(topic, *c), candidates)
            errors = [e for e in outcomes if isinstance(e, StorageError)]
            results = [m for m in outcomes if isinstance(m, Message)]
            if errors and not results:
                # every claim that did not lose a race failed (a full disk, a store
                # refusing writes): say so, rather than look like an empty topic
                raise errors[0]
        got = [m for m in results if m is not None]
        self._contended[topic] = rivals or len(got) < len(candidates)
        if len(got) < len(candidates) and topic in self._cursor:
            # we met a rival's run: carry on from a random place
            self._cursor[topic] = _id_at(self._rng.random())
        return got

    @staticmethod
    def _window(want: int, held: int, wide: bool) -> int:
        """How many free candidates to pick ``want`` from: ``want`` (oldest first), or
        with rivals about _CONTENDED_WINDOW times as many, as far as one listing page
        (with the ``held`` keys in it) reaches: a page of 1,000 keys costs the server
        ~40 ms of CPU on SeaweedFS, so more pages would cost more than lost claims."""
        if not wide:
            return want
        return max(want, min(want * _CONTENDED_WINDOW, DELETE_BATCH - held - _LIST_SLACK))

    def _run_of(
        self, topic: str, candidates: list[tuple[str, str]], want: int
    ) -> list[tuple[str, str]]:
        """``want`` candidates adjacent in message id order, so their lease keys are too
        and a batch claim's listings span only their share of the leases (see
        leases.KeyRange). Each run carries on after our last one, so consumers sweeping
        the id space at one pace keep apart: the first starts at our share of the id
        space by rank among the registered consumers, after lost claims a run starts at
        a random place, and one that reached the last id is followed by one from the
        first. None takes more than its share of scarce candidates."""
        ordered = sorted(candidates, key=lambda c: c[1])
        place, peers = self._registered_peers()
        want = min(want, max(-(-len(ordered) // peers), _MIN_SHARE))
        cursor = self._cursor.get(topic)
        if cursor is None:
            cursor = _id_at(place / peers)
        start = bisect.bisect_right([mid for _, mid in ordered], cursor)
        start = max(0, min(start, len(ordered) - want))  # near the end: the last `want`
        run = ordered[start : start + want]
        self._cursor[topic] = run[-1][1] if start + want < len(ordered) else ""
        return run

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
                self._peers = self._peers or (self._rng.randrange(2), 2)
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

    def _rivals_hold(self, topic: str, live: set[str]) -> bool:
        """Whether some live lease on ``topic`` is not ours: others consume here."""
        with self._lock:
            ours = {m.id for m in self._inflight.values() if m.topic == topic}
            ours |= self._releasing
        return not live <= ours

    def _claims_in_batches(self) -> bool:
        """csprng_verify on a server whose LIST is consistent: one batch claim per poll."""
        ctx = self._ctx
        return ctx.caps.strategy == "csprng_verify" and ctx.csprng.consistent_list

    def _in_parallel(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """``fn`` of every item, on the claim pool when there is more than one."""
        if len(items) == 1:
            return [fn(items[0])]
        pool = self._ctx.pool("claim", self._ctx.config.polling.claim_threads)
        futures = [pool.submit(fn, item) for item in items]
        return [f.result() for f in futures]

    def _live_leases(self, topic: str) -> tuple[set[str], float]:
        """Ids of messages under a live lease, and when (monotonic) the LIST that found
        them was sent; stale leases are reaped if unchanged (at most _REAP_PER_POLL, in
        parallel on the claim pool), each abandoned delivery first recorded on its
        message (see :meth:`_reap`). A lease we cannot judge counts as live: an error
        never frees a message."""
        listed_at = self._ctx.clock.monotonic()
        listing = self._ctx.store.list(layout.leases_prefix(topic))
        now = listing.server_time or self._ctx.store.server_time()
        live: set[str] = set()
        stale: list[tuple[str, ObjectInfo]] = []
        for info in listing.objects:
            mid = layout.lease_message_id(topic, info.key)
            if mid is None:
                continue
            if (not leases.is_stale(info.last_modified, now, self._ctx.visibility)
                    or len(stale) >= _REAP_PER_POLL):
                live.add(mid)
            else:
                stale.append((mid, info))
        if stale:
            reaped = self._in_parallel(lambda s: self._reap(topic, *s), stale)
            live.update(mid for (mid, _info), done in zip(stale, reaped) if not done)
        return live, listed_at

    def _reap(self, topic: str, mid: str, info: ObjectInfo) -> bool:
        """Record the abandoned delivery on the message, then remove the stale lease
        ``info`` if it is still the version judged stale; True when removed. A lease
        refreshed meanwhile stays (the delivery was then counted once too often: the
        count is one too high at worst). A failure to record leaves the lease for a
        later poll: the delivery is never uncounted for a transient error."""
        try:
            self._record_abandoned(topic, mid, info)
            if run(leases.reap(info.key, info.etag, self._ctx.caps), self._ctx.store,
                   self._ctx.clock):
                log.info("reaped stale lease on %s/%s", topic, mid)
                return True
            return False  # refreshed or replaced meanwhile
        except StorageError as exc:
            log.warning("could not reap lease %s: %s", info.key, exc)
            return False

    def _record_abandoned(self, topic: str, mid: str, info: ObjectInfo) -> None:
        """Count the delivery whose lease ``info`` went stale on the message itself, as
        :meth:`retry` counts a failed one: ``attempts`` + 1 and a ``last_error`` saying
        so, written If-Match the message's ETag where the server honours it. The lease
        names the message's key (``message_key``); a lease without it (pawn-queue's, or
        an older version's) is reaped uncounted. The message records the lease version
        it counted (``abandoned_lease``), so a second janitor reaping the same lease
        does not count it again."""
        store = self._ctx.store
        try:
            lease = store.get(info.key)
        except ObjectNotFound:
            return  # gone already: nothing to reap
        if lease.etag != info.etag:
            return  # refreshed or replaced since the listing: the reap will leave it
        try:
            lease_doc = json.loads(lease.body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return
        key = lease_doc.get("message_key") if isinstance(lease_doc, dict) else None
        if not isinstance(key, str) or layout.parse_message_key(topic, key) != mid:
            return
        try:
            got = store.get(key)
            doc = _decode_message(got.body, mid)
        except (ObjectNotFound, ValueError):
            return  # acked (the lease is an orphan), or malformed: the claim moves it
        if doc.get("abandoned_lease") == info.etag:
            return  # counted by another janitor
        count = _attempts(doc) + 1
        doc["attempts"] = count
        doc["abandoned_lease"] = info.etag
        doc["last_error"] = (
            f"delivery {count} abandoned: consumer {lease_doc.get('consumer_id')} held "
            "it past the visibility timeout without an ack, retry or nack (its "
            "handler's process may have died)"
        )
        if_match = got.etag if self._ctx.caps.if_match and got.etag else None
        try:
            store.put(key, layout.canonical_json(doc), if_match=if_match)
        except ConditionFailed:
            return  # re-published, or counted by another janitor, since our read
        log.warning("%s/%s: delivery %d abandoned (lease not renewed)", topic, mid, count)

    def _claim_safely(self, topic: str, key: str, mid: str) -> Message | StorageError | None:
        """The claimed message, None when a rival holds it, or the store's error."""
        try:
            return self._claim(topic, key, mid)
        except StorageError as exc:
            log.warning("claim of %s failed: %s", key, exc)
            return exc

    def _claim(self, topic: str, key: str, mid: str) -> Message | None:
        ctx = self._ctx
        lease_key = layout.lease_key(topic, mid)
        body = leases.LeaseBody.new(self.id, mid, ctx.clock.now(), ctx.visibility,
                                    message_key=key)
        started = ctx.clock.monotonic()
        token = run(
            leases.claim(ctx.caps, lease_key, body, ctx.csprng, self._rng),
            ctx.store,
            ctx.clock,
        )
        if token is None:
            return None
        return self._fetch(topic, _Won(key, mid, lease_key, token, started))

    def _claim_batch(
        self, topic: str, candidates: Sequence[tuple[str, str]], listed_at: float
    ) -> list[Message | None]:
        """Claim all candidates' leases in one csprng batch (``listed_at``: when the lease
        LIST that found them free was sent). The messages of the leases written are read
        on the claim pool while verification waits out its jitter; those of the claims
        won are kept (a read needs no lease, and no one else may change a message while
        we prove ours: see docs/guarantees.md)."""
        ctx = self._ctx
        claims = [
            (layout.lease_key(topic, mid),
             leases.LeaseBody.new(self.id, mid, ctx.clock.now(), ctx.visibility,
                                  message_key=key))
            for key, mid in candidates
        ]
        message_of: dict[str, str] = {}  # as claim_csprng_batch: a key's first claim
        for (key, _mid), (lease_key, _body) in zip(candidates, claims):
            message_of.setdefault(lease_key, key)
        started = ctx.clock.monotonic()
        threads = ctx.config.polling.claim_threads
        pool = ctx.pool("claim", threads)
        reads: dict[str, Future[GetResult]] = {}
        write_errors: list[StorageError] = []

        def read_ahead(lease_keys: list[str]) -> None:
            for lease_key in lease_keys:
                reads[lease_key] = pool.submit(ctx.store.get, message_of[lease_key])

        try:
            tokens = run(
                leases.claim_csprng_batch(
                    layout.leases_prefix(topic), claims, listed_at, ctx.csprng, self._rng,
                    group=min(threads, _CSPRNG_GROUP),
                    relist_after=leases.listing_fresh_for(ctx.csprng) / 2,
                    ranges=self._ranges.setdefault(
                        topic, leases.KeyRange(layout.leases_prefix(topic))
                    ),
                    on_written=read_ahead,
                    errors=write_errors,
                ),
                ctx.store, ctx.clock, pool,
            )
        except StorageError as exc:  # leases we wrote go stale and are reaped
            log.warning("claim of %d message(s) on %s failed: %s", len(claims), topic, exc)
            raise
        except BaseException:  # Ctrl-C mid-batch: give back what we wrote, then stop
            self._withdraw(claims)
            raise
        if write_errors and not any(tokens):
            # every lease write that did not meet a rival failed (a full disk, a store
            # refusing writes): say so, rather than look like an empty topic
            raise write_errors[0]
        won = [
            _Won(key, mid, lease_key, token, started)
            for (key, mid), (lease_key, _body), token in zip(candidates, claims, tokens)
            if token is not None
        ]
        return [self._fetch_safely(topic, w, reads.get(w.lease_key)) for w in won]

    def _withdraw(self, claims: Sequence[tuple[str, leases.LeaseBody]]) -> None:
        """Delete the leases of an interrupted batch claim that still hold our bytes
        (a lease body is unique: its nonce), so their messages are not left invisible
        for a visibility timeout and then counted as abandoned deliveries. Best effort:
        one GET per claim; what fails goes stale and is reaped as before."""
        store, if_match = self._ctx.store, self._ctx.caps.if_match
        for lease_key, body in claims:
            try:
                got = store.get(lease_key)
                if got.body == body.encode():
                    store.delete(lease_key, if_match=got.etag if if_match else None)
            except StorageError:
                continue

    def _fetch_safely(
        self, topic: str, won: _Won, read: Future[GetResult] | None
    ) -> Message | None:
        try:
            return self._fetch(topic, won, read)
        except StorageError as exc:
            log.warning("fetch of %s failed: %s", won.key, exc)
            return None

    def _fetch(
        self, topic: str, won: _Won, read: Future[GetResult] | None = None
    ) -> Message | None:
        """Read the message whose lease we won (or take the read already under way);
        give the lease back if it has vanished or cannot be read, and dead-letter it
        if malformed."""
        key, mid, lease_key, token = won.key, won.mid, won.lease_key, won.token
        try:
            got = read.result() if read is not None else self._ctx.store.get(key)
        except ObjectNotFound:  # acked by someone else between our listing and our claim
            self._drop_lease(lease_key, token)
            return None
        except StorageError:
            self._drop_lease(lease_key, token)
            raise
        try:
            doc = _decode_message(got.body, mid)
        except ValueError as exc:
            self._quarantine(topic, key, got.body, f"malformed message: {exc}", mid)
            self._drop_lease(lease_key, token)
            return None
        attempts = _attempts(doc)
        if attempts >= self._ctx.config.polling.max_delivery_count:
            self._dead_letter_claimed(topic, won, doc, got.etag, attempts)
            return None
        msg = Message(
            id=mid,
            topic=topic,
            producer_id=doc.get("producer_id"),
            created_at=str(doc.get("created_at", "")),
            payload=doc["payload"],
            key=key,
            lease_key=lease_key,
            lease_token=token,
            lease_written_at=won.started,
            delivery_count=attempts + 1,
            body=doc,
            etag=got.etag,
            consumer=self,
        )
        with self._lock:
            self._inflight[mid] = msg
        return msg

    def _dead_letter_claimed(
        self, topic: str, won: _Won, doc: dict[str, Any], etag: str, attempts: int
    ) -> None:
        """Move a message delivered ``attempts`` (>= ``polling.max_delivery_count``)
        times without an ack to the dead-letter prefix instead of handing it out again,
        then give our lease back. Its last deliveries ended without a retry or a nack:
        their consumers died (a handler that kills its process would otherwise be
        delivered forever). On an error the message stays, and our lease is given back."""
        reason = (f"delivered {attempts} times without an ack (the handler's process may "
                  f"have died); polling.max_delivery_count is "
                  f"{self._ctx.config.polling.max_delivery_count}")
        last = doc.get("last_error")
        if isinstance(last, str) and last:
            reason += f"; last error: {last}"
        dead = dict(doc)
        dead["dead_letter"] = {
            "reason": reason,
            "consumer_id": self.id,
            "at": layout.iso(self._ctx.clock.now()),
            "delivery_count": attempts,
            "original_key": won.key,
        }
        try:
            self._ctx.store.put(layout.dead_letter_key(topic, won.mid),
                                layout.canonical_json(dead))
            self._delete_version(won.key, etag, None, doc)
        finally:
            self._drop_lease(won.lease_key, won.token)
        log.warning("dead-lettered %s/%s at claim: %s", topic, won.mid, reason)

    def _delete_version(
        self, key: str, etag: str, deadline: float | None, doc: dict[str, Any] | None = None
    ) -> bool:
        """Delete the message object at ``key`` only while it is the version we read
        (If-Match ``etag``, where the server honours it). On a mismatch the object is
        read again: if it is the same message (``doc``'s id, topic, created_at and
        payload; only a janitor's record of an abandoned delivery, or a re-publish of
        identical content, changed it), that version is deleted instead. False when
        our version is gone: replaced by another message under the same key (a
        re-publish while we held it: it stays and is delivered) or already deleted."""
        if_match = etag if self._ctx.caps.if_match and etag else None
        store = self._ctx.store
        try:
            store.delete(key, if_match=if_match, deadline=deadline)
            return True
        except ObjectNotFound:
            return False
        except ConditionFailed:
            pass
        try:
            now = store.get(key)
            same = doc is not None and _same_message(doc, now.body)
            if same:
                store.delete(key, if_match=now.etag, deadline=deadline)
                return True
        except (ConditionFailed, ObjectNotFound):
            pass
        log.info("%s was replaced or removed while we held it: left as it is", key)
        return False

    def _drop_lease(self, lease_key: str, token: str) -> None:
        try:
            run(leases.release(lease_key, token, self._ctx.caps), self._ctx.store,
                self._ctx.clock)
        except StorageError as exc:  # it will go stale and be reaped
            log.warning("could not give back lease %s: %s", lease_key, exc)

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
        todo: list[Message] = []
        lost: list[Message] = []
        others: list[Message] = []  # being acked by another call: its outcome is ours
        for msg in dict.fromkeys(msgs):
            with msg._lock:  # waits for a refresh under way
                if msg.state in ("acked", "nacked"):
                    continue
                if msg._settling:
                    others.append(msg)
                    continue
                if msg.state != "leased":
                    lost.append(msg)
                    continue
                msg._settling = True
                msg._unsettled.clear()
            todo.append(msg)
        errors: list[StorageError] = []
        try:
            self._ack_fenced(todo, lost, errors)
        finally:
            for msg in todo:
                with msg._lock:
                    msg._settling = False
                    msg._unsettled.set()
        others_error: StorageError | LeaseLostError | None = None
        if others:  # wait for the other ack; where it failed, ack again ourselves
            for msg in others:
                msg._unsettled.wait()
            try:
                self.ack_many(others)
            except (StorageError, LeaseLostError) as exc:
                others_error = exc  # reported after our own (a StorageError first)
        unacked = [m for m in todo if m.state == "leased"]
        if unacked:
            cause = errors[0] if errors else None
            why = cause or "their leases could not be re-proven within the fence"
            also = f" ({len(lost)} lost)" if lost else ""
            raise StorageError(
                f"{len(unacked)} message(s) not acked, still leased{also}: {why}",
                key=unacked[0].key,
            ) from cause
        if isinstance(others_error, StorageError):
            raise others_error
        if lost:
            raise LeaseLostError(lost[0].id, f"{len(lost)} message(s) not acked")
        if others_error is not None:
            raise others_error

    def _ack_fenced(
        self, todo: list[Message], lost: list[Message], errors: list[StorageError]
    ) -> None:
        """Ack ``todo``: fresh leases at once, old ones as their proofs come in; a proof
        that has aged past the fence by the time it is acted on is made again (at most
        _ACK_ROUNDS times). Lost messages go to ``lost``, store errors to ``errors``."""
        pending = todo
        for _ in range(_ACK_ROUNDS):
            fresh: list[Message] = []
            old: list[Message] = []
            for msg in pending:
                (fresh if self._fresh_to_ack(msg) else old).append(msg)
            self._delete_acked(fresh, errors)
            pending = []
            for proven in self._reproven(old, lost, errors):
                ready = [m for m in proven if self._fresh_to_ack(m)]
                self._delete_acked(ready, errors)
                aged = set(proven).difference(ready)  # proven too long ago: again
                pending.extend(m for m in proven if m in aged)
            if not pending:
                return

    def _reproven(
        self, msgs: list[Message], lost: list[Message], errors: list[StorageError]
    ) -> Iterator[list[Message]]:
        """Refresh every lease of ``msgs`` in parallel on the claim pool, yielding the
        proven ones in groups as the refreshes finish (not all at the end)."""
        if not msgs:
            return
        pool = self._ctx.pool("claim", self._ctx.config.polling.claim_threads)
        futures = {pool.submit(self._reprove, msg): msg for msg in msgs}
        waiting = set(futures)
        while waiting:
            done, waiting = wait(waiting, return_when=FIRST_COMPLETED)
            proven: list[Message] = []
            for fut in done:
                exc = fut.exception()
                if exc is None:
                    proven.append(futures[fut])
                elif isinstance(exc, LeaseLostError):
                    lost.append(futures[fut])
                elif isinstance(exc, StorageError):
                    errors.append(exc)
                else:
                    raise exc
            if proven:
                yield proven

    def _reprove(self, msg: Message) -> None:
        """Refresh the lease of a message being acked (the ack holds it: no one else
        refreshes it meanwhile)."""
        with msg._lock:
            self._renew(msg)

    def _delete_acked(self, msgs: list[Message], errors: list[StorageError]) -> None:
        """Delete the messages (their fence just checked), mark them acked, then delete
        their leases; a failed message delete leaves them leased (in ``errors``)."""
        if not msgs:
            return
        # No attempt (retries included) leaves after the fence of the oldest: each one
        # is sent while the leases are certainly ours (docs/guarantees.md, Fencing).
        deadline = min(self._fence_ends(m) for m in msgs)
        try:
            self._delete_messages(msgs, deadline)
        except StorageError as exc:  # DeadlineExceeded too: they stay leased
            errors.append(exc)
            return
        with self._lock:  # still our leases until deleted (see _rivals_hold)
            self._releasing.update(m.id for m in msgs)
        for msg in msgs:
            self._settled(msg, "acked")
        try:  # by the same deadline: a late one could remove a new holder's lease
            self._delete([m.lease_key for m in msgs], deadline)
        except StorageError as exc:  # harmless: orphan leases go stale and are reaped
            log.warning("acked, but could not delete %d lease(s): %s", len(msgs), exc)
        finally:
            with self._lock:
                self._releasing.difference_update(m.id for m in msgs)

    def nack(self, msg: Message, reason: str | None = None) -> None:
        """Write the message to the dead-letter prefix with ``reason``, then delete it
        and its lease. If the dead-letter write fails, nothing is deleted."""
        with self._unsettled_lock(msg):
            if msg.state in ("acked", "nacked"):
                return  # done (by an ack that just finished, too)
            if msg.state != "leased":
                raise LeaseLostError(msg.id, f"message was {msg.state}")
            self._fence(msg)
            doc = dict(msg.body)
            doc["dead_letter"] = {
                "reason": reason or "nacked",
                "consumer_id": self.id,
                "at": layout.iso(self._ctx.clock.now()),
                "delivery_count": msg.delivery_count,
                "original_key": msg.key,
            }
            self._ctx.store.put(
                layout.dead_letter_key(msg.topic, msg.id), layout.canonical_json(doc)
            )
            self._fence(msg)  # the dead-letter write took time
            # only the version we were handed: a re-published one stays, delivered anew
            self._delete_version(msg.key, msg.etag, self._fence_ends(msg), msg.body)
            self._settled(msg, "nacked")
        self._drop_lease(msg.lease_key, msg.lease_token)

    @staticmethod
    @contextmanager
    def _unsettled_lock(msg: Message) -> Iterator[None]:
        """``msg``'s lock, taken once no ack of it is under way (waiting for one
        outside the lock, which the ack needs to finish)."""
        while True:
            if msg.state in ("acked", "nacked"):  # settled (maybe before a fork)
                msg._lock.acquire()
                break
            msg._unsettled.wait()
            msg._lock.acquire()
            if not msg._settling:
                break
            msg._lock.release()  # another ack began meanwhile: wait for it too
        try:
            yield
        finally:
            msg._lock.release()

    def release(self, msg: Message) -> None:
        """Give the lease back so the message is delivered again at once."""
        with msg._lock:
            if msg.state != "leased" or msg._settling:
                return
            self._settled(msg, "released")
        self._drop_lease(msg.lease_key, msg.lease_token)

    def retry(self, msg: Message, error: str | None = None) -> None:
        """Record a failed attempt on the message itself, then release it.

        The count travels with the message (an ``attempts`` field), so any consumer
        that takes it next knows its ``delivery_count``.
        """
        with msg._lock:
            if msg.state != "leased" or msg._settling:
                return
            self._fence(msg)
            doc = dict(msg.body)
            doc["attempts"] = msg.delivery_count
            if error is not None:
                doc["last_error"] = error[:2000]
            if_match = msg.etag if self._ctx.caps.if_match and msg.etag else None
            try:
                self._ctx.store.put(msg.key, layout.canonical_json(doc), if_match=if_match,
                                    deadline=self._fence_ends(msg))
            except ConditionFailed:  # re-published meanwhile: the new version starts at 1
                log.info("%s was replaced while we held it: its retry is not recorded",
                         msg.key)
            self._settled(msg, "released")
        self._drop_lease(msg.lease_key, msg.lease_token)

    def refresh(self, msg: Message) -> None:
        """Extend our lease by a visibility timeout, proving it is still ours.

        Refresh and settlement exclude each other per message: an ack waits for a
        refresh under way, and a refresh while an ack is under way, or after the
        message was acked or nacked, does nothing (there is nothing left to renew, and
        the ack deleting the lease is no loss). Raises LeaseLostError if another
        lease was found (the message is then ``lost``) or the message was given back.
        """
        with msg._lock:
            if msg._settling or msg.state in ("acked", "nacked"):
                return
            if msg.state != "leased":
                raise LeaseLostError(msg.id, f"message was {msg.state}")
            self._renew(msg)

    def _renew(self, msg: Message) -> None:
        """Rewrite our lease, ``msg._lock`` held: a new token, and the fence counts
        from now. A lease found taken makes the message lost."""
        ctx = self._ctx
        body = leases.LeaseBody.new(
            self.id, msg.id, ctx.clock.now(), ctx.visibility, claimed_at=None,
            message_key=msg.key,
        )
        started = ctx.clock.monotonic()
        try:
            token = run(
                leases.refresh(msg.lease_key, msg.lease_token, body, ctx.caps, ctx.csprng),
                ctx.store,
                ctx.clock,
            )
        except LeaseLostError:
            self._settled(msg, "lost")
            raise
        msg.lease_token = token
        msg.lease_written_at = started

    def lease_age(self, msg: Message) -> float:
        """Seconds since our current lease version was written (by the local clock)."""
        return self._ctx.clock.monotonic() - msg.lease_written_at

    @contextmanager
    def leased(self, msg: Message) -> Iterator[Message]:
        """Keep ``msg``'s lease refreshed while the block runs (for long work in pull
        mode); the refresher thread is stopped and joined when the block ends."""
        from ..runtime.refresher import LeaseRefresher

        interval = self._ctx.config.polling.lease_refresh_interval_seconds
        refresher = LeaseRefresher(self, interval=interval)
        refresher.track(msg)
        refresher.start()
        try:
            yield msg
        finally:
            refresher.stop()

    def listen(
        self,
        handler: Callable[[Message], Any],
        *,
        max_workers: int = 4,
        stop_event: threading.Event | None = None,
        **options: Any,
    ) -> None:
        """Block, handing each message to ``handler`` on a thread pool, until
        :meth:`stop`, ``stop_event`` or an error. ``options`` are the
        :class:`~pawn_queue_sync.runtime.listen.Listener`'s (``shutdown_timeout``,
        ``max_messages``, ``idle_timeout``, ``install_signal_handlers``, ...); an
        unknown one is a TypeError. See :mod:`pawn_queue_sync.runtime`."""
        from ..runtime.listen import Listener

        listener = Listener(
            self, handler, max_workers=max_workers, stop_event=stop_event, **options
        )
        with self._lock:
            self._listener = listener
        try:
            listener.run()
        finally:
            with self._lock:
                self._listener = None

    def stop(self) -> None:
        """Ask a running :meth:`listen` to stop gracefully."""
        listener = getattr(self, "_listener", None)
        if listener is not None:
            listener.stop()

    def close(self, timeout: float | None = None) -> bool:
        """Stop a running :meth:`listen` and wait up to ``timeout`` seconds for it to
        finish (handlers, acks, refresher: every thread joined). True when it has."""
        listener = getattr(self, "_listener", None)
        if listener is None:
            return True
        listener.stop()
        return bool(listener.join(timeout))

    def janitor(self, topic: str | None = None) -> int:
        """Remove stale leases now; returns how many leases are live afterwards."""
        return sum(len(self._live_leases(t)[0]) for t in ([topic] if topic else self._topics))

    # -- internals -------------------------------------------------------------------------

    def _fresh(self, msg: Message) -> bool:
        """True while our lease is certainly ours: nobody removes a lease before it is
        stale, and this one was written well within a visibility timeout ago."""
        return self._ctx.clock.monotonic() < self._fence_ends(msg)

    def _fresh_to_ack(self, msg: Message) -> bool:
        """Fresh, with time left to send the deletes: a batch's requests must leave
        before the fence of its oldest lease, so one about to reach its fence is
        re-proven first rather than fail the whole batch by its deadline."""
        window = self._ctx.visibility - self._ctx.fence_margin()
        room = min(_ACK_ROOM_SECONDS, window / 4)
        return self._ctx.clock.monotonic() + room < self._fence_ends(msg)

    def _fence_ends(self, msg: Message) -> float:
        """When (monotonic) our lease stops being certainly ours without asking: the
        deadline of the requests that act on it (the store sends no attempt after it)."""
        return msg.lease_written_at + self._ctx.visibility - self._ctx.fence_margin()

    def _fence(self, msg: Message) -> None:
        """Make sure the lease is ours before acting: recent enough by the local
        monotonic clock, or re-proven with a conditional refresh."""
        if not self._fresh(msg):
            self._renew(msg)

    def _settled(self, msg: Message, state: Any) -> None:
        """Record how ``msg`` ended and stop counting it in flight (only this very
        object: a later claim of the same id may be in flight under it)."""
        msg.state = state
        with self._lock:
            if self._inflight.get(msg.id) is msg:
                del self._inflight[msg.id]

    def _delete_messages(self, msgs: list[Message], deadline: float) -> None:
        """Delete the message objects of ``msgs``, each only while it is the version
        we were handed (its ETag): a single conditional DELETE, or DeleteObjects
        naming each key's ETag (one request per 1,000, as unconditional). A version
        replaced meanwhile (re-published under its key) stays, to be delivered; its
        ack is done all the same. Where the server ignores If-Match, or ETags in
        DeleteObjects (moto), the delete is unconditional (docs/guarantees.md)."""
        if len(msgs) == 1:
            self._delete_version(msgs[0].key, msgs[0].etag, deadline, msgs[0].body)
            return
        etags = ({m.key: m.etag for m in msgs if m.etag}
                 if self._ctx.caps.if_match else None)
        failed = set(self._ctx.store.delete_many(
            [m.key for m in msgs], deadline=deadline, **({"etags": etags} if etags else {})
        ))
        # a key not deleted (another version, or an error): once more on its own, which
        # tells a re-published message from ours with a recorded count, or raises
        for msg in msgs:
            if msg.key in failed:
                self._delete_version(msg.key, msg.etag, deadline, msg.body)

    def _delete(self, keys: list[str], deadline: float | None = None) -> None:
        if len(keys) == 1:
            self._ctx.store.delete(keys[0], deadline=deadline)
            return
        failed = self._ctx.store.delete_many(keys, deadline=deadline)
        if failed:
            raise StorageError(f"could not delete {len(failed)} object(s)", key=failed[0])

    def _quarantine_foreign(self, topic: str, key: str, size: int) -> None:
        """Move an object that is not a message out of ``messages/``."""
        try:
            limit = 4 * self._ctx.config.publishing.max_payload_bytes
            raw = self._ctx.store.get(key).body if size <= limit else None
            self._quarantine(topic, key, raw, "foreign object: not a message key", None)
        except ObjectNotFound:
            pass
        except StorageError as exc:
            log.warning("could not move foreign object %s aside: %s", key, exc)

    def _quarantine(
        self, topic: str, key: str, raw: bytes | None, reason: str, mid: str | None
    ) -> None:
        """Dead-letter an unusable object with the reason, then delete the original."""
        name = mid or str(uuid.uuid5(NAMESPACE, key))
        dl_key = layout.dead_letter_key(topic, name)
        doc: dict[str, Any] = {
            "id": name,
            "topic": topic,
            "producer_id": None,
            "created_at": layout.iso(self._ctx.clock.now()),
            "payload": None,
            "dead_letter": {
                "reason": reason,
                "original_key": key,
                "consumer_id": self.id,
                "at": layout.iso(self._ctx.clock.now()),
            },
        }
        if raw is not None:
            doc["dead_letter"]["raw_base64"] = base64.b64encode(raw).decode("ascii")
            self._ctx.store.put(dl_key, layout.canonical_json(doc))
        else:  # too large to inline: keep the bytes by a server-side copy
            self._ctx.store.copy(key, dl_key)
        self._ctx.store.delete(key)
        log.warning("moved %s to %s: %s", key, dl_key, reason)


@attrs.frozen
class _Won:
    """A claim we won: the message key, its id, our lease and when we started writing
    it (monotonic; the time fence counts the lease's age from there)."""

    key: str
    mid: str
    lease_key: str
    token: str
    started: float


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


def _reset_locks_after_fork() -> None:
    """In a forked child only the forking thread exists, so a lock another thread held
    at the fork would stay held forever: every consumer, and each message it holds,
    gets fresh locks."""
    for consumer in list(_CONSUMERS):
        consumer._lock = threading.Lock()
        for msg in consumer._inflight.values():
            msg._lock = threading.RLock()
            msg._settling = False  # the acking thread is not in the child
            msg._unsettled = threading.Event()
            msg._unsettled.set()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_locks_after_fork)


def _id_at(fraction: float) -> str:
    """The message id (a uuid string, as ids compare) at ``fraction`` of the id space."""
    return str(uuid.UUID(int=min(int(fraction * 2**128), 2**128 - 1)))


def _same_message(doc: dict[str, Any], raw: bytes) -> bool:
    """True when ``raw`` is the message ``doc`` was read from, whatever delivery
    records (``attempts``, ``last_error``, ...) were written on it since."""
    try:
        now = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(now, dict) and all(now.get(f) == doc.get(f) for f in _CONTENT_FIELDS)


def _attempts(doc: dict[str, Any]) -> int:
    """Deliveries of a message that ended without an ack, as recorded on it (failed
    handler calls and abandoned deliveries); 0 when unrecorded or unreadable."""
    attempts = doc.get("attempts", 0)
    if isinstance(attempts, bool) or not isinstance(attempts, int):
        return 0
    return max(attempts, 0)


def _decode_message(raw: bytes, mid: str) -> dict[str, Any]:
    """Parse and check a message body; ValueError says what is wrong."""
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON ({exc.__class__.__name__})") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    missing = [f for f in _REQUIRED_FIELDS if f not in doc]
    if missing:
        raise ValueError(f"missing field(s) {', '.join(missing)}")
    if doc["id"] != mid:
        raise ValueError(f"id {doc['id']!r} does not match its key")
    return doc


__all__ = ["Consumer"]
