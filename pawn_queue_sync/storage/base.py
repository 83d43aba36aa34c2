"""The storage protocol: the only thing the queue logic knows about an object store.

Three stores implement it: :class:`~pawn_queue_sync.storage.s3.S3Store` (boto3),
:class:`~pawn_queue_sync.storage.local.LocalStore` (a directory on disk) and
:class:`~pawn_queue_sync.storage.memory.MemoryStore` (tests). Every method raises only
:class:`~pawn_queue_sync.errors.StorageError` subclasses:

* :class:`ObjectNotFound` -- the key does not exist (get, head, copy source);
* :class:`ConditionFailed` -- If-None-Match / If-Match did not hold (including an
  If-Match on a missing key, whatever status the server used for it);
* :class:`StoreUnavailable` -- unreachable endpoint, bad credentials, missing bucket;
* :class:`DeadlineExceeded` -- a write or delete given a ``deadline`` could not finish
  by then (no attempt is sent after it);
* :class:`StoreClosed` -- the store was used after ``close()`` (S3Store);
* :class:`StorageError` -- anything else.

ETags are normalised: no quotes, lower case. Times are timezone-aware UTC, and always
the *server's*: a store never stands in its client's clock for a time the server did
not give. ``last_modified`` and ``server_time`` are None when the server did not say
(no LastModified, no Date header); a caller judging leases must then treat them as
live (:func:`~pawn_queue_sync.protocol.lease.is_stale` does).

Deadlines: ``put``, ``delete`` and ``delete_many`` take ``deadline``, a
:func:`time.monotonic` instant (the memory store: its clock's ``monotonic()``). No
attempt (retries included) is sent after it, each attempt's read timeout is capped by
the time left, and once it has passed the call raises :class:`DeadlineExceeded`. An
attempt sent before the deadline may still be applied by the server after it.

``put`` and ``delete`` also take ``retry_by`` (a :func:`time.monotonic` instant for every
store: the protocol runner converts it from its own clock): the first attempt is sent
at once, whatever the time, but no retry is sent after ``retry_by`` -- one whose backoff
would end past it is not made (DeadlineExceeded) -- and each attempt waits for its
answer as usual. A csprng_verify claim needs exactly this: its lease write, made right
after the check that found the key free, must not be sent again later (a retry landing
late could overwrite a rival's verified lease), while how long an answer takes back
does not matter (docs/guarantees.md). The local and memory stores make one attempt.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Protocol, runtime_checkable

import attrs

from ..errors import (
    ConditionFailed,
    DeadlineExceeded,
    ObjectNotFound,
    StorageError,
    StoreClosed,
    StoreUnavailable,
)

__all__ = [
    "ObjectInfo",
    "GetResult",
    "PutResult",
    "Listing",
    "Store",
    "normalize_etag",
    "ObjectNotFound",
    "ConditionFailed",
    "StorageError",
    "StoreUnavailable",
    "StoreClosed",
    "DeadlineExceeded",
    "DELETE_BATCH",
    "last_send",
    "time_left",
]

#: Most keys one DeleteObjects request may carry (SeaweedFS rejects 1,001).
DELETE_BATCH = 1000


def normalize_etag(etag: str | None) -> str:
    """``'"ABC"'`` -> ``'abc'``: servers differ in quoting and case."""
    return (etag or "").strip().strip('"').lower()


def last_send(deadline: float | None, retry_by: float | None) -> float | None:
    """The last instant a retry may be sent under a ``deadline`` and a ``retry_by``
    (either may be None: no bound)."""
    bounds = [t for t in (deadline, retry_by) if t is not None]
    return min(bounds) if bounds else None


def time_left(deadline: float | None, now: float, op: str, key: str | None = None) -> float:
    """Seconds from ``now`` to ``deadline`` (infinite without one); raises
    DeadlineExceeded when none are left, so nothing is sent past a deadline."""
    if deadline is None:
        return float("inf")
    left = deadline - now
    if left <= 0:
        raise DeadlineExceeded(f"{op}: the deadline passed before it could be sent", key=key)
    return left


@attrs.frozen
class ObjectInfo:
    """Metadata of one object, as a listing or a HEAD reports it; ``last_modified`` is
    None when the server did not give it (never judge a lease's age from that)."""

    key: str
    etag: str
    size: int
    last_modified: datetime | None


@attrs.frozen
class GetResult:
    """An object's body and metadata, and the server's clock when it answered (None
    for what the server did not say)."""

    key: str
    body: bytes
    etag: str
    last_modified: datetime | None
    server_time: datetime | None = None


@attrs.frozen
class PutResult:
    """What a successful write returns: the new ETag (the lease token for leases)."""

    key: str
    etag: str
    server_time: datetime | None = None


@attrs.frozen
class Listing:
    """Objects under a prefix and (with a delimiter) the common prefixes, in the order
    the server returned them: byte order of keys for flat names under the prefix (all
    the queue relies on); SeaweedFS orders nested keys by directory instead.
    ``server_time`` is the HTTP Date of the last page; None when the server sent none
    (then no lease in it can be judged stale)."""

    objects: list[ObjectInfo]
    prefixes: list[str] = attrs.field(factory=list)
    server_time: datetime | None = None
    truncated: bool = False


@runtime_checkable
class Store(Protocol):
    """One bucket (or directory) of objects. Thread-safe; usable after fork."""

    def put(
        self,
        key: str,
        body: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
        deadline: float | None = None,
        retry_by: float | None = None,
    ) -> PutResult:
        """Write ``body``. ``if_none_match`` creates only; ``if_match`` replaces only
        the version with that ETag. Raises ConditionFailed otherwise (and
        DeadlineExceeded: see the module docstring for ``deadline`` and ``retry_by``)."""

    def get(self, key: str) -> GetResult:
        """Read a whole object. Raises ObjectNotFound."""

    def head(self, key: str) -> ObjectInfo:
        """Read an object's metadata. Raises ObjectNotFound."""

    def delete(
        self, key: str, *, if_match: str | None = None, deadline: float | None = None,
        retry_by: float | None = None,
    ) -> None:
        """Delete; a missing key is fine without ``if_match`` and ConditionFailed with it.
        With ``deadline``, nothing is sent after it; with ``retry_by``, no retry
        (DeadlineExceeded)."""

    def delete_many(
        self, keys: Iterable[str], *, deadline: float | None = None,
        etags: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Delete in batches; returns the keys that could not be deleted. A key in
        ``etags`` is deleted only while its ETag is that one (DeleteObjects names it
        per key: AWS S3 and SeaweedFS honour it, moto ignores it); a key that has another
        version is not deleted and is among the keys returned, a missing key is not a
        failure. Keys without an ETag are deleted unconditionally. With ``deadline``,
        no batch is sent after it (DeadlineExceeded; the batches before it may have
        been deleted)."""

    def copy(self, src: str, dst: str, *, if_none_match: bool = False) -> PutResult:
        """Server-side copy. Raises ObjectNotFound for a missing source, and
        ConditionFailed with ``if_none_match`` when ``dst`` exists (moto ignores that
        condition and overwrites)."""

    def list(
        self,
        prefix: str,
        *,
        limit: int | None = None,
        delimiter: str | None = None,
        start_after: str | None = None,
    ) -> Listing:
        """Keys under ``prefix`` (see :class:`Listing` on order) that sort after
        ``start_after`` (which need not exist), following pagination, stopping after
        ``limit`` objects -- common prefixes do not count towards it -- with
        ``truncated`` saying whether more remain."""

    def server_time(self) -> datetime | None:
        """The store's current time (S3: the Date header of a cheap request); None when
        the server did not say: never the client's clock."""

    def close(self) -> None:
        """Release connections. Idempotent. An S3Store used after it raises StoreClosed."""

    def describe(self) -> str:
        """A one-line, secret-free description for logs and the CLI."""
