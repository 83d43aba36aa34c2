"""An in-process store: a dict behind a lock. **For unit tests only.**

It behaves like the S3 servers this library supports (ETag = MD5 of the body, If-Match
on a missing key fails, deletes of missing keys are fine, listings in byte order) but
keeps nothing across processes or restarts.

Fault injection: pass ``hooks``, a callable ``before(op, key)`` run before every
operation, outside the store's lock, in the calling thread. It may raise (the operation
then fails with that exception and changes nothing) or block (e.g. on a
``threading.Event``, to hold a caller at a known point). ``op`` is the method name:
``put``, ``get``, ``head``, ``delete``, ``copy`` (``key`` is the destination),
``list`` (``key`` is the prefix), ``server_time`` (``key`` is ``""``), and for
``delete_many`` it is called once per key with op ``delete_many``; a
:class:`StorageError` raised there marks just that key as failed, as a partially
failed batch delete would.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime

import attrs

from ..clock import SYSTEM_CLOCK, Clock
from .base import (
    ConditionFailed,
    GetResult,
    Listing,
    ObjectInfo,
    ObjectNotFound,
    PutResult,
    StorageError,
    normalize_etag,
    time_left,
)
from .listing import build_listing

__all__ = ["Hook", "MemoryStore"]

#: ``before(op, key)``: called before each operation; may raise or block.
Hook = Callable[[str, str], None]


@attrs.frozen
class _Object:
    """One stored version."""

    body: bytes
    etag: str
    last_modified: datetime


class MemoryStore:
    """Objects in a dict; thread-safe, for unit tests (see the module docstring)."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK, *, hooks: Hook | None = None) -> None:
        self._clock = clock
        self._hooks = hooks
        self._lock = threading.Lock()
        self._objects: dict[str, _Object] = {}

    def _before(self, op: str, key: str) -> None:
        """Run the fault-injection hook, if any."""
        if self._hooks is not None:
            self._hooks(op, key)

    def _existing(self, op: str, key: str) -> _Object:
        """The object at ``key``, read for ``op`` after the key check and the hook.
        Raises ObjectNotFound."""
        self._check_key(key)
        self._before(op, key)
        with self._lock:
            obj = self._objects.get(key)
        if obj is None:
            raise ObjectNotFound("no such key", key=key)
        return obj

    @staticmethod
    def _check_key(key: object) -> str:
        """Reject what no S3 server accepts as a key."""
        if not isinstance(key, str) or not key:
            raise StorageError(f"invalid key {key!r}")
        return key

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
        """Write ``body``; create-only with ``if_none_match``, replace-only the version
        with ETag ``if_match``. Raises ConditionFailed otherwise, and DeadlineExceeded
        past ``deadline`` (on the injected clock's ``monotonic()``). One attempt: no
        retry for ``retry_by`` to bound."""
        self._check_key(key)
        if not isinstance(body, bytes | bytearray | memoryview):
            raise StorageError(f"body must be bytes, not {type(body).__name__}", key=key)
        self._before("put", key)
        time_left(deadline, self._clock.monotonic(), "put", key)
        data = bytes(body)
        etag = hashlib.md5(data).hexdigest()
        with self._lock:
            current = self._objects.get(key)
            if if_match is not None and (
                current is None or current.etag != normalize_etag(if_match)
            ):
                raise ConditionFailed("If-Match did not hold", key=key)
            if if_none_match and current is not None:
                raise ConditionFailed("If-None-Match: the key exists", key=key)
            now = self._clock.now()
            self._objects[key] = _Object(data, etag, now)
        return PutResult(key=key, etag=etag, server_time=now)

    def get(self, key: str) -> GetResult:
        """Read a whole object. Raises ObjectNotFound."""
        obj = self._existing("get", key)
        return GetResult(
            key=key,
            body=obj.body,
            etag=obj.etag,
            last_modified=obj.last_modified,
            server_time=self._clock.now(),
        )

    def head(self, key: str) -> ObjectInfo:
        """Read an object's metadata. Raises ObjectNotFound."""
        obj = self._existing("head", key)
        return ObjectInfo(
            key=key, etag=obj.etag, size=len(obj.body), last_modified=obj.last_modified
        )

    def delete(
        self, key: str, *, if_match: str | None = None, deadline: float | None = None,
        retry_by: float | None = None,
    ) -> None:
        """Delete; a missing key is fine without ``if_match`` and ConditionFailed with it;
        DeadlineExceeded past ``deadline`` (on the injected clock's ``monotonic()``);
        ``retry_by`` as for :meth:`put`."""
        self._check_key(key)
        self._before("delete", key)
        time_left(deadline, self._clock.monotonic(), "delete", key)
        self._delete(key, if_match)

    def _delete(self, key: str, if_match: str | None) -> None:
        """Delete under the lock, checking ``if_match``."""
        with self._lock:
            current = self._objects.get(key)
            if if_match is not None and (
                current is None or current.etag != normalize_etag(if_match)
            ):
                raise ConditionFailed("If-Match did not hold", key=key)
            self._objects.pop(key, None)

    def delete_many(
        self, keys: Iterable[str], *, deadline: float | None = None,
        etags: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Delete each key (only while its ETag is ``etags[key]``, if given; a missing
        key is no failure); returns the keys not deleted (another version, or the hook
        made them fail). DeadlineExceeded past ``deadline`` (the keys before it are
        deleted)."""
        failed: list[str] = []
        for key in keys:
            try:
                self._check_key(key)
                self._before("delete_many", key)
            except StorageError:
                failed.append(key)
                continue
            time_left(deadline, self._clock.monotonic(), "delete_many", key)
            try:
                self._delete(key, (etags or {}).get(key))
            except ConditionFailed:
                if key in self._objects:  # another version
                    failed.append(key)
        return failed

    def copy(self, src: str, dst: str, *, if_none_match: bool = False) -> PutResult:
        """Copy ``src`` to ``dst`` (create-only with ``if_none_match``). Raises
        ObjectNotFound for a missing source."""
        self._check_key(src)
        self._check_key(dst)
        self._before("copy", dst)
        with self._lock:
            obj = self._objects.get(src)
            if obj is None:
                raise ObjectNotFound("no such source key", key=src)
            if if_none_match and dst in self._objects:
                raise ConditionFailed("If-None-Match: the key exists", key=dst)
            now = self._clock.now()
            self._objects[dst] = _Object(obj.body, obj.etag, now)
        return PutResult(key=dst, etag=obj.etag, server_time=now)

    def list(
        self,
        prefix: str,
        *,
        limit: int | None = None,
        delimiter: str | None = None,
        start_after: str | None = None,
    ) -> Listing:
        """Keys under ``prefix`` in ascending byte order (a snapshot)."""
        if not isinstance(prefix, str):
            raise StorageError(f"prefix must be a string, not {type(prefix).__name__}")
        self._before("list", prefix)
        with self._lock:
            snapshot = {k: v for k, v in self._objects.items() if k.startswith(prefix)}
        # Code point order of str equals byte order of their UTF-8 encoding.
        keys = sorted(snapshot)

        def info(key: str) -> ObjectInfo:
            obj = snapshot[key]
            return ObjectInfo(
                key=key, etag=obj.etag, size=len(obj.body), last_modified=obj.last_modified
            )

        return build_listing(
            keys, info, prefix, limit, delimiter, self._clock.now(), start_after
        )

    def server_time(self) -> datetime:
        """The injected clock's time."""
        self._before("server_time", "")
        return self._clock.now()

    def close(self) -> None:
        """Nothing to release."""

    def describe(self) -> str:
        """``memory:`` and the object count."""
        with self._lock:
            return f"memory:{len(self._objects)} objects"
