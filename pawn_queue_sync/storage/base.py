"""The storage protocol: the only thing the queue logic knows about an object store.

Three stores implement it: :class:`~pawn_queue_sync.storage.s3.S3Store` (boto3),
:class:`~pawn_queue_sync.storage.local.LocalStore` (a directory on disk) and
:class:`~pawn_queue_sync.storage.memory.MemoryStore` (tests). Every method raises only
:class:`~pawn_queue_sync.errors.StorageError` subclasses:

* :class:`ObjectNotFound` -- the key does not exist (get, head, copy source);
* :class:`ConditionFailed` -- If-None-Match / If-Match did not hold (including an
  If-Match on a missing key, whatever status the server used for it);
* :class:`StoreUnavailable` -- unreachable endpoint, bad credentials, missing bucket;
* :class:`StorageError` -- anything else.

ETags are normalised: no quotes, lower case. Times are timezone-aware UTC.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Protocol, runtime_checkable

import attrs

from ..errors import ConditionFailed, ObjectNotFound, StorageError, StoreUnavailable

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
    "DELETE_BATCH",
]

#: Most keys one DeleteObjects request may carry (SeaweedFS rejects 1,001).
DELETE_BATCH = 1000


def normalize_etag(etag: str | None) -> str:
    """``'"ABC"'`` -> ``'abc'``: servers differ in quoting and case."""
    return (etag or "").strip().strip('"').lower()


@attrs.frozen
class ObjectInfo:
    """Metadata of one object, as a listing or a HEAD reports it."""

    key: str
    etag: str
    size: int
    last_modified: datetime


@attrs.frozen
class GetResult:
    """An object's body and metadata, and the server's clock when it answered."""

    key: str
    body: bytes
    etag: str
    last_modified: datetime
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
    ``server_time`` is the HTTP Date of the last page."""

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
    ) -> PutResult:
        """Write ``body``. ``if_none_match`` creates only; ``if_match`` replaces only
        the version with that ETag. Raises ConditionFailed otherwise."""

    def get(self, key: str) -> GetResult:
        """Read a whole object. Raises ObjectNotFound."""

    def head(self, key: str) -> ObjectInfo:
        """Read an object's metadata. Raises ObjectNotFound."""

    def delete(self, key: str, *, if_match: str | None = None) -> None:
        """Delete; a missing key is fine without ``if_match`` and ConditionFailed with it."""

    def delete_many(self, keys: Iterable[str]) -> list[str]:
        """Delete unconditionally in batches; returns the keys that could not be deleted."""

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

    def server_time(self) -> datetime:
        """The store's current time (S3: the Date header of a cheap request)."""

    def close(self) -> None:
        """Release connections. Idempotent."""

    def describe(self) -> str:
        """A one-line, secret-free description for logs and the CLI."""
