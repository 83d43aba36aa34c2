"""Deduplicated publishing: a conditional create of a marker per dedup id and topic.

``publish(topic, payload, dedup_id=K)`` first creates ``{topic}/dedup/{sha256(K)}.json``
with If-None-Match (one creator wins, across threads and processes), holding
``{"dedup_id", "message_id", "created_at", "state", "nonce"}`` with state
``"writing"``; then writes the message; then marks the marker ``"written"`` (If-Match
its ETag). A publish that finds the marker:

* ``"written"`` and younger than ``publishing.dedup_window_seconds`` (the server's clock:
  the GET's Date minus the marker's LastModified) returns its message id and writes
  nothing;
* ``"writing"`` and young waits for it (bounded, backing off); when its writer seems
  dead (the marker unchanged for :data:`WRITER_DEAD_SECONDS`) or its write failed
  (``"failed"``), it takes the marker over (If-Match: one taker) and completes the
  publish with the marker's message id and ``created_at``: on a plain topic the same
  key, an overwrite, not a second message;
* expired (or not a marker) replaces it with its own (If-Match its ETag: one winner; a
  loser reads again) and publishes a new message.

A failed write marks the marker ``"failed"`` (a retry completes it at once, with the
same message id, so a write that failed but landed is overwritten rather than doubled);
a refused payload (:class:`~pawn_queue_sync.errors.PayloadError`) deletes it.

Every marker write carries a fresh random ``nonce``, so each version has its own ETag
(S3's ETag is the MD5 of the bytes) and an If-Match names exactly one version.

Servers without If-None-Match (the ``csprng_verify`` strategy) cannot make the create
race-free: a deduplicated publish there is refused with PublishError before anything is
written (docs/operations.md says why).

A marker records the first writer's delay (``delay_seconds``), so a completion writes
the very key it did, whatever delay the completing call asks for.

Expired markers are removed by producers (from their first deduplicated publish on a
topic) and consumers (:class:`MarkerJanitor`): one LIST of the topic's ``dedup/``
prefix (at most :data:`EXPIRE_PER_RUN` keys, carrying on from the last run's key), one
DeleteObjects of the expired ones, each If-Match the listed ETag.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import secrets
from collections.abc import Callable
from datetime import datetime
from typing import Any

import attrs

from .. import layout
from ..errors import (
    ConditionFailed,
    ObjectNotFound,
    PayloadError,
    PublishError,
    StorageError,
)
from ..storage.base import GetResult
from .context import Context

__all__ = [
    "EXPIRE_PER_RUN",
    "MAX_DEDUP_ID_CHARS",
    "WRITER_DEAD_SECONDS",
    "MarkerJanitor",
    "check_dedup_id",
    "expire_markers",
    "marker_key",
    "publish_once",
]

log = logging.getLogger(__name__)

#: Longest dedup id, in characters (SQS's MessageDeduplicationId allows 128 too).
MAX_DEDUP_ID_CHARS = 128
#: A "writing" marker unchanged this long (by the server's clock, or watched this long
#: by a waiter) is taken to belong to a dead writer, and another publish completes it.
WRITER_DEAD_SECONDS = 30.0
#: How long a publish waits at most for another's "writing" marker before it gives up
#: (PublishError): the writer-dead bound, then time for a take-over to finish.
WAIT_SECONDS = 2 * WRITER_DEAD_SECONDS + 10.0
#: Most markers one janitor run lists (one LIST page) and may delete (one DeleteObjects).
EXPIRE_PER_RUN = 1000
#: Seconds a marker must be past the window before a janitor deletes it: LastModified
#: and Date have one-second resolution.
EXPIRE_GRACE_SECONDS = 1.0
#: Least time between two janitor runs of one consumer on one topic during polls.
MIN_EXPIRE_INTERVAL_SECONDS = 60.0

_FIRST_BACKOFF, _MAX_BACKOFF = 0.05, 1.0


def check_dedup_id(dedup_id: object) -> str:
    """``dedup_id`` if it is a usable dedup id, else PayloadError: a str of 1 to
    :data:`MAX_DEDUP_ID_CHARS` printable characters (no control, separator other than
    the space, or lone surrogate characters)."""
    if not isinstance(dedup_id, str):
        raise PayloadError(f"dedup_id must be a str, not {type(dedup_id).__name__}")
    if not 1 <= len(dedup_id) <= MAX_DEDUP_ID_CHARS:
        raise PayloadError(
            f"dedup_id must be 1 to {MAX_DEDUP_ID_CHARS} characters, got {len(dedup_id)}"
        )
    if not dedup_id.isprintable():
        raise PayloadError("dedup_id must be printable: no control characters, line "
                           "breaks, tabs or lone surrogates")
    return dedup_id


def marker_key(topic: str, dedup_id: str) -> str:
    """``{topic}/dedup/{sha256 of the dedup id}.json``: any id gives a safe key."""
    digest = hashlib.sha256(dedup_id.encode("utf-8")).hexdigest()
    return f"{layout.dedup_prefix(topic)}{digest}.json"


@attrs.frozen
class _Marker:
    """A marker's content; each write gets a fresh nonce (its own ETag). ``delay`` is
    the first writer's delay in seconds (None: none), so a publish that completes it
    writes the very key the first writer did (a delayed key depends on the delay);
    ``delay_known`` is False for a marker of a version that did not record it (the
    completing publish's own delay is used then)."""

    dedup_id: str
    message_id: str
    created_at: str
    state: str
    nonce: str = attrs.field(factory=lambda: secrets.token_hex(16))
    delay: float | None = None
    delay_known: bool = True

    def encode(self) -> bytes:
        doc = attrs.asdict(self)
        del doc["delay_known"]
        doc["delay_seconds"] = doc.pop("delay")
        if not self.delay_known:
            del doc["delay_seconds"]
        return layout.canonical_json(doc)

    def now(self, state: str) -> _Marker:
        """This marker in ``state``, with a fresh nonce."""
        return _Marker(self.dedup_id, self.message_id, self.created_at, state,
                       delay=self.delay, delay_known=self.delay_known)

    def write_delay(self, asked: float | None) -> float | None:
        """The delay a write of this marker's message uses: the recorded one, else
        ``asked`` (the caller's)."""
        return self.delay if self.delay_known else asked

    @classmethod
    def decode(cls, body: bytes) -> _Marker | None:
        """The marker in ``body``, or None when it is not one: a foreign object of any
        shape (nested past the recursion limit, a delay no float holds, ...), which
        the caller handles as such (replaced, as an expired marker is)."""
        try:
            return cls._parse(body)
        except Exception:  # whatever a foreign body makes the parser raise
            return None

    @classmethod
    def _parse(cls, body: bytes) -> _Marker | None:
        doc: Any = json.loads(body)
        fields = {f: doc[f] for f in ("dedup_id", "message_id", "created_at",
                                      "state", "nonce")}
        if not all(isinstance(v, str) for v in fields.values()):
            return None
        datetime.fromisoformat(fields["created_at"])
        if fields["state"] not in ("writing", "written", "failed"):
            return None
        known = "delay_seconds" in doc
        delay = doc.get("delay_seconds")
        if delay is not None and (isinstance(delay, bool)
                                  or not isinstance(delay, (int, float)) or not delay > 0):
            return None
        return cls(**fields, delay=None if delay is None else float(delay),
                   delay_known=known)


def _age(got: GetResult) -> float | None:
    """Seconds since the object was last written, by the server's clock; None when the
    server did not give both times."""
    if got.server_time is None or got.last_modified is None:
        return None
    return (got.server_time - got.last_modified).total_seconds()


def _require_conditional(ctx: Context, topic: str) -> None:
    """PublishError unless the server's conditional creates are trusted."""
    if not ctx.caps.if_none_match:
        raise PublishError(
            f"cannot publish to {topic!r} with a dedup_id: deduplication needs "
            "conditional creates (If-None-Match), which this store does not honour or "
            f"the configuration does not trust (strategy {ctx.caps.strategy}); nothing "
            "was written"
        )


#: ``write(message_id, created_at, delay)``: store the message, its id back.
Write = Callable[[str, datetime, "float | None"], str]


def publish_once(ctx: Context, topic: str, dedup_id: str, message_id: str,
                 created_at: datetime, write: Write, delay: float | None = None) -> str:
    """Publish through ``write(message_id, created_at, delay)`` unless ``dedup_id`` was
    published on ``topic`` within the window; the message id either way (the first
    publish's, for every caller that shares its dedup id within the window). A
    publish that completes another's (failed, or its writer dead) writes with that
    one's id, ``created_at`` and delay, as recorded in the marker: the same key."""
    _require_conditional(ctx, topic)
    key = marker_key(topic, dedup_id)
    mine = _Marker(dedup_id, message_id, layout.iso(created_at), "writing", delay=delay)
    clock = ctx.clock
    give_up = clock.monotonic() + WAIT_SECONDS
    backoff = _FIRST_BACKOFF
    watch = _Watch()
    while True:
        mid = _attempt(ctx, topic, key, mine, write, watch)
        if mid is not None:
            return mid
        if clock.monotonic() >= give_up:
            raise PublishError(
                f"could not publish to {topic!r}: another publish of the same dedup_id "
                f"kept its marker {key} from being written or read as done for over "
                f"{WAIT_SECONDS:g} s; nothing was written"
            )
        clock.sleep(backoff)
        backoff = min(2 * backoff, _MAX_BACKOFF)


@attrs.define
class _Watch:
    """The "writing" marker version a publish waits on, and since when (monotonic) it
    has seen it unchanged."""

    etag: str | None = None
    since: float = 0.0

    def unchanged_for(self, etag: str, now: float) -> float:
        if etag != self.etag:
            self.etag, self.since = etag, now
        return now - self.since


def _attempt(ctx: Context, topic: str, key: str, mine: _Marker,
             write: Write, watch: _Watch) -> str | None:
    """One round of :func:`publish_once`: the message id, or None to wait and look
    again (another writes it, or the marker changed under us)."""
    etag = _create(ctx, topic, key, mine)
    if etag is not None:
        return _write_and_mark(ctx, topic, key, mine, etag, write, mine.delay)
    try:
        got = ctx.store.get(key)
    except ObjectNotFound:
        return None  # removed meanwhile (a refused payload, the janitor): create again
    except StorageError as exc:
        raise PublishError(f"could not publish to {topic!r}: {exc}") from exc
    if got.body == mine.encode():  # our create landed, its answer was lost
        return _write_and_mark(ctx, topic, key, mine, got.etag, write, mine.delay)
    theirs = _Marker.decode(got.body)
    age = _age(got)
    window = ctx.config.publishing.dedup_window_seconds
    if theirs is None or (age is not None and age >= window):
        taken = _replace(ctx, topic, key, mine, got.etag)  # expired: one replacer wins
        if taken is None:
            return None
        return _write_and_mark(ctx, topic, key, mine, taken, write, mine.delay)
    if theirs.state == "written":
        log.debug("%s: dedup id already published as %s", topic, theirs.message_id)
        return theirs.message_id
    watched = watch.unchanged_for(got.etag, ctx.clock.monotonic())
    dead = (age is not None and age >= WRITER_DEAD_SECONDS) or watched >= WRITER_DEAD_SECONDS
    if theirs.state != "failed" and not dead:
        return None
    took = theirs.now("writing")
    taken = _replace(ctx, topic, key, took, got.etag)  # one taker completes it
    if taken is None:
        return None
    log.info("%s: completing the publish of %s (dedup marker %s, writer %s)", topic,
             theirs.message_id, key, "failed" if theirs.state == "failed" else "presumed dead")
    return _write_and_mark(ctx, topic, key, took, taken, write, mine.delay)


def _create(ctx: Context, topic: str, key: str, marker: _Marker) -> str | None:
    """Create the marker If-None-Match; its ETag, or None when one exists."""
    try:
        return ctx.store.put(key, marker.encode(), if_none_match=True).etag
    except ConditionFailed:
        return None
    except StorageError as exc:
        raise PublishError(f"could not publish to {topic!r}: {exc}") from exc


def _replace(ctx: Context, topic: str, key: str, marker: _Marker, etag: str) -> str | None:
    """Write ``marker`` over the version ``etag`` (If-Match); its ETag, or None when
    that version is gone (another replaced or removed it)."""
    try:
        return ctx.store.put(key, marker.encode(),
                             if_match=etag if ctx.caps.if_match else None).etag
    except (ConditionFailed, ObjectNotFound):
        return None
    except StorageError as exc:
        raise PublishError(f"could not publish to {topic!r}: {exc}") from exc


def _write_and_mark(ctx: Context, topic: str, key: str, marker: _Marker, etag: str,
                    write: Write, asked: float | None) -> str:
    """Write the message the marker (version ``etag``, ours) names, then mark it
    written. A refused payload deletes the marker; any other failure marks it failed
    (a retry completes it with the same id); both re-raise."""
    if_match = etag if ctx.caps.if_match else None
    try:
        mid = write(marker.message_id, datetime.fromisoformat(marker.created_at),
                    marker.write_delay(asked))
    except PayloadError:
        _quietly(lambda: ctx.store.delete(key, if_match=if_match), key)
        raise
    except Exception:
        _quietly(lambda: ctx.store.put(key, marker.now("failed").encode(), if_match=if_match),
                 key)
        raise
    try:
        ctx.store.put(key, marker.now("written").encode(), if_match=if_match)
    except ConditionFailed:
        # taken over (we looked dead) or replaced (expired): the message is written
        # either way; the marker is someone else's now
        log.info("%s: dedup marker %s changed while %s was written", topic, key, mid)
    except StorageError as exc:
        # The message is stored: report it published. The marker stays "writing"; a
        # publish of the same id within the window waits, then completes it (on a plain
        # topic an overwrite of this very message).
        log.warning("%s: published %s but could not mark %s written: %s",
                    topic, mid, key, exc)
    return mid


def _quietly(action: Callable[[], object], key: str) -> None:
    """Run a clean-up write; a failure leaves the marker to the writer-dead bound."""
    try:
        action()
    except StorageError as exc:
        log.warning("could not update dedup marker %s after a failed publish: %s", key, exc)


# -- expiry -----------------------------------------------------------------------------


def expire_markers(ctx: Context, topic: str, *, start_after: str | None = None,
                   limit: int = EXPIRE_PER_RUN) -> tuple[int, str | None]:
    """Delete ``topic``'s markers older than the window (LastModified against the
    listing's Date, plus :data:`EXPIRE_GRACE_SECONDS`): one LIST of at most ``limit``
    keys after ``start_after``, then one DeleteObjects per 1,000 expired keys, each
    If-Match its listed ETag (a marker rewritten since stays). No marker body is read;
    none is judged without the server's time. Returns how many were deleted and the
    key to carry on after (None: the listing reached the end)."""
    window = ctx.config.publishing.dedup_window_seconds
    listing = ctx.store.list(layout.dedup_prefix(topic), limit=limit,
                             start_after=start_after)
    now = listing.server_time or ctx.store.server_time()
    expired: dict[str, str] = {}
    if now is not None:
        for info in listing.objects:
            if info.last_modified is None:
                continue
            if (now - info.last_modified).total_seconds() > window + EXPIRE_GRACE_SECONDS:
                expired[info.key] = info.etag
    failed = ctx.store.delete_many(list(expired), etags=expired) if expired else []
    if expired:
        log.info("%s: %d expired dedup marker(s) removed", topic, len(expired) - len(failed))
    cursor = listing.objects[-1].key if listing.truncated and listing.objects else None
    return len(expired) - len(failed), cursor


@attrs.define
class MarkerJanitor:
    """One consumer's (or producer's) expiry of dedup markers: at most once per
    ``max(dedup_window_seconds, MIN_EXPIRE_INTERVAL_SECONDS)`` per topic, each run
    carrying on from where the last one stopped, so a topic with more markers than
    one run lists is covered over several runs. A consumer's polls run it, the first
    time an interval after its first poll of the topic (an idle poll costs what it
    did); a producer's deduplicated publishes run it with ``eager``, the first time at
    its first deduplicated publish on the topic, so markers expire however briefly
    each process lives (a cron job, ``pawnq publish``): whoever adds markers removes
    the expired ones."""

    ctx: Context
    eager: bool = False
    _cursor: dict[str, str | None] = attrs.field(factory=dict, init=False)
    _last_run: dict[str, float] = attrs.field(factory=dict, init=False)

    def run(self, topic: str) -> int:
        """One run on ``topic`` now; how many markers it deleted."""
        self._last_run[topic] = self.ctx.clock.monotonic()
        deleted, self._cursor[topic] = expire_markers(
            self.ctx, topic, start_after=self._cursor.get(topic))
        return deleted

    def run_due(self, topic: str) -> None:
        """A run on ``topic`` if one is due; a failure only logs (the next is due an
        interval later)."""
        every = max(self.ctx.config.publishing.dedup_window_seconds,
                    MIN_EXPIRE_INTERVAL_SECONDS)
        now = self.ctx.clock.monotonic()
        last = self._last_run.setdefault(topic, -math.inf if self.eager else now)
        if now - last < every:
            return
        try:
            self.run(topic)
        except StorageError as exc:
            log.warning("%s: could not expire dedup markers: %s", topic, exc)
