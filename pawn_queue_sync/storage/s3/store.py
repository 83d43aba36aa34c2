"""The S3 store: the storage protocol on any S3-compatible server.

One boto3 client per process, built lazily on first use and rebuilt after a fork
(a client inherited across fork shares keep-alive sockets with the parent and has been
seen returning other requests' bodies). Threads of one process share the client; boto3
clients are thread-safe. The hot requests go through one transport per process
(:mod:`.transport`): the fast path of :mod:`.fast` where it applies (``s3.fast_path``),
else boto3 (:mod:`.boto`), chosen when the client is built. Every error is translated
into the library's :class:`~pawn_queue_sync.errors.StorageError` family, without
credentials (nor the ``user:password@`` an endpoint URL may carry).

The client comes from the settings, a caller's boto3 session or a caller's client
(:mod:`.source`). A closed store stays closed (:class:`~pawn_queue_sync.errors.StoreClosed`).
Locks a thread of the parent held at a fork are replaced in the child
(``os.register_at_fork``), which then builds its own client on first use.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import attrs

from ...config import redact_endpoint
from ...errors import ConditionFailed, ObjectNotFound, StorageError, StoreClosed, StoreUnavailable
from ..base import DELETE_BATCH, GetResult, Listing, ObjectInfo, PutResult, normalize_etag
from .boto import BotoTransport
from .fast import FastTransport, build_wire
from .secrets import SECRET_FILTER
from .source import ClientSource
from .times import utc
from .transport import Translator, Transport
from .wire import WireClient

if TYPE_CHECKING:
    from ...config import S3Config

__all__ = ["S3Store"]

log = logging.getLogger(__name__)


@attrs.frozen
class _Process:
    """What one process uses: boto3 (for everything it alone sends) and the transport
    of the hot requests (the fast path, or boto3 again)."""

    pid: int
    boto: BotoTransport
    hot: Transport
    wire: WireClient | None


class S3Store:
    """A bucket on an S3-compatible server, behind the storage protocol.

    ``session``: a ``boto3.Session`` whose credentials (profile, assumed role, SSO) and
    settings the store's clients use, in every process; ``client``: a ready boto3 S3
    client, used in this process only (a forked child raises
    :class:`~pawn_queue_sync.errors.StoreNotPortable`). Picklable only when built from
    settings: then only the configuration travels; each process builds its own client.
    """

    def __init__(
        self, config: S3Config, *, max_pool_connections: int | None = None,
        session: Any = None, client: Any = None,
    ) -> None:
        self._config = config
        self._bucket = config.bucket_name
        self._pool = config.max_pool_connections or max_pool_connections or 32
        self._source = ClientSource(config, session=session, client=client)
        self._lock = threading.Lock()  # replaced in a forked child (_after_fork_in_child)
        self._current: _Process | None = None
        self._closed = False
        self._errors = Translator(self._bucket, self.describe, self._secrets)
        _STORES.add(self)

    # -- process-local client ------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        self._source.check_portable()
        return {"config": self._config, "pool": self._pool}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"], max_pool_connections=state["pool"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"S3Store({self.describe()})"

    def describe(self) -> str:
        endpoint = redact_endpoint(self._source.endpoint() or "aws")
        return f"s3:{endpoint}/{self._bucket}"

    def identity(self) -> str:
        """What makes two stores the same for a capability probe's cached result: the
        endpoint and bucket (``describe()``) and who we are to the server (a digest of
        the access key id, or the default credential chain): read-only credentials must
        be refused at setup even after admin ones probed the same bucket."""
        return f"{self.describe()} as {self._source.who()}"

    @property
    def bucket(self) -> str:
        return self._bucket

    def _secrets(self) -> tuple[str | None, ...]:
        return (self._config.aws_access_key_id, self._config.aws_secret_access_key,
                *SECRET_FILTER.secrets())

    def _process(self) -> _Process:
        """This process's transports; built on first use and again after a fork, never
        after ``close()`` (StoreClosed)."""
        current = self._current
        if current is not None and current.pid == os.getpid():
            return current
        with self._lock:
            if self._closed:
                raise StoreClosed(f"{self.describe()} is closed")
            current = self._current
            if current is None or current.pid != os.getpid():
                current = self._current = self._build_client()
            return current

    def _build_client(self) -> _Process:
        built = self._source.build(self._pool)
        boto = BotoTransport(built.client, self._config, self._errors, owned=built.owned)
        wire = build_wire(self._config, built, self._pool)
        hot: Transport = boto if wire is None else FastTransport(wire, self._errors)
        return _Process(os.getpid(), boto, hot, wire)

    def _client(self) -> Any:
        """This process's boto3 client."""
        return self._process().boto.client

    def _wire(self) -> WireClient | None:
        """This process's fast path, or None where it does not apply."""
        return self._process().wire

    @property
    def fast_path(self) -> bool:
        """Whether the hot requests bypass boto3 in this process."""
        return self._wire() is not None

    def close(self) -> None:
        """Release the connections; the store is unusable afterwards (StoreClosed). A
        client given by the caller stays open: it is the caller's."""
        with self._lock:
            self._closed = True
            current, self._current = self._current, None
        if current is not None and current.pid == os.getpid():
            try:
                current.boto.close()
                if current.wire is not None:
                    current.wire.close()
            except Exception:  # closing must never fail a shutdown
                log.debug("error closing the S3 client", exc_info=True)

    # -- the protocol ---------------------------------------------------------------

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
        return self._process().hot.put(
            key, body, if_none_match=if_none_match, if_match=if_match, deadline=deadline,
            retry_by=retry_by,
        )

    def get(self, key: str) -> GetResult:
        return self._process().hot.get(key)

    def head(self, key: str) -> ObjectInfo:
        return self._process().hot.head(key)

    def delete(
        self, key: str, *, if_match: str | None = None, deadline: float | None = None,
        retry_by: float | None = None,
    ) -> None:
        self._process().hot.delete(key, if_match=if_match, deadline=deadline, retry_by=retry_by)

    def delete_many(
        self, keys: Iterable[str], *, deadline: float | None = None,
        etags: Mapping[str, str] | None = None,
    ) -> list[str]:
        keys = list(dict.fromkeys(keys))
        etags = etags or {}
        failed: list[str] = []
        hot = self._process().hot
        for i in range(0, len(keys), DELETE_BATCH):
            chunk = keys[i : i + DELETE_BATCH]
            errors = hot.delete_objects(chunk, {k: etags[k] for k in chunk if k in etags},
                                        deadline)
            failed.extend(k for k, code in errors if code != "NoSuchKey")
        return failed

    def copy(self, src: str, dst: str, *, if_none_match: bool = False) -> PutResult:
        kwargs: dict[str, Any] = {
            "Key": dst,
            "CopySource": {"Bucket": self._bucket, "Key": src},
        }
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        boto = self._process().boto
        try:
            resp = boto.call("copy_object", dst, False, **kwargs)
        except ObjectNotFound:
            raise ObjectNotFound("copy: no such source key", key=src) from None
        except StorageError as exc:
            if if_none_match and "409" in str(exc):
                raise ConditionFailed("copy: condition failed", key=dst) from None
            raise
        etag = normalize_etag(resp.get("CopyObjectResult", {}).get("ETag"))
        return PutResult(dst, etag, boto.server_time(resp))

    def list(
        self,
        prefix: str,
        *,
        limit: int | None = None,
        delimiter: str | None = None,
        start_after: str | None = None,
    ) -> Listing:
        objects: list[ObjectInfo] = []
        prefixes: list[str] = []
        token: str | None = None
        server_time: datetime | None = None
        truncated = False
        hot = self._process().hot
        while True:
            max_keys = DELETE_BATCH
            if limit is not None:
                max_keys = max(1, min(DELETE_BATCH, limit - len(objects)))
            # StartAfter on the first page only: a continuation token carries on from it.
            page, page_time = hot.list_page(
                prefix, max_keys, delimiter, token, None if token else start_after
            )
            server_time = page_time or server_time
            objects.extend(
                ObjectInfo(key=k, etag=normalize_etag(e), size=size, last_modified=utc(m))
                for k, e, size, m in page.rows
            )
            prefixes.extend(page.prefixes)
            token = page.token
            more = token is not None
            if limit is not None and len(objects) >= limit:
                truncated = more or len(objects) > limit
                del objects[limit:]
                break
            if not more:
                break
        return Listing(objects=objects, prefixes=prefixes, server_time=server_time,
                       truncated=truncated)

    def server_time(self) -> datetime | None:
        """The Date of a HEAD of the bucket; None when the server sent none."""
        boto = self._process().boto
        return boto.server_time(boto.call("head_bucket", None))

    # -- bucket management (not part of the protocol) -----------------------------------

    def ensure_bucket(self, *, create: bool = False) -> None:
        """Check the bucket is reachable; create it when asked and missing."""
        boto = self._process().boto
        try:
            boto.call("head_bucket", None)
            return
        except ObjectNotFound:
            if not create:
                raise StoreUnavailable(
                    f"bucket {self._bucket!r} does not exist at {self.describe()} "
                    "(set s3.create_bucket: true to create it)"
                ) from None
        except StoreUnavailable as exc:
            if "does not exist" not in str(exc) or not create:
                raise
        kwargs: dict[str, Any] = {}
        region = self._config.region_name
        if region and region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            boto.call("create_bucket", None, **kwargs)
        except StorageError as exc:
            if "BucketAlreadyOwnedByYou" not in str(exc):
                raise


#: every store of this process, for :func:`_after_fork_in_child`
_STORES: weakref.WeakSet[S3Store] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """In a forked child: new locks for the ones a thread of the parent may have held at
    the fork (building a client takes 0.1 s under the store's lock); that thread does
    not exist here, so they would never be released. Clients, fast paths and their
    connection pools are the parent's and stay unused: each store builds its own on
    first use (keyed by pid)."""
    for store in list(_STORES):
        store._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
