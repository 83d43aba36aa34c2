"""The one interface the S3 store sends its hot requests through, its two
implementations being boto3 (:mod:`.boto`) and the fast path (:mod:`.fast`); and the
translation of S3's error answers into the library's errors, which both share."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Protocol

import attrs

from ...errors import ConditionFailed, ObjectNotFound, StorageError, StoreUnavailable
from ..base import GetResult, ObjectInfo, PutResult
from .answers import Page
from .retries import transient_failure
from .secrets import mask

__all__ = ["Page", "Transport", "Translator"]

_CONDITION_CODES = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict", "409"})
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_AUTH_CODES = frozenset(
    {
        "AccessDenied",
        "403",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "AllAccessDisabled",
    }
)


class Transport(Protocol):
    """The store's hot requests on one bucket, answered as the storage protocol's
    results, failures raised as :class:`StorageError` (secrets masked)."""

    def put(
        self, key: str, body: bytes, *, if_none_match: bool, if_match: str | None,
        deadline: float | None, retry_by: float | None = None,
    ) -> PutResult: ...

    def get(self, key: str) -> GetResult: ...

    def head(self, key: str) -> ObjectInfo: ...

    def delete(
        self, key: str, *, if_match: str | None, deadline: float | None,
        retry_by: float | None = None,
    ) -> None: ...

    def delete_objects(
        self, keys: list[str], etags: Mapping[str, str], deadline: float | None
    ) -> list[tuple[str, str]]:
        """One DeleteObjects request (at most 1000 keys): (key, code) of each failure."""
        ...

    def list_page(
        self, prefix: str, max_keys: int, delimiter: str | None, token: str | None,
        start_after: str | None,
    ) -> tuple[Page, datetime | None]:
        """One ListObjectsV2 page (rows' times as UTC datetimes) and the server's Date."""
        ...

    def close(self) -> None: ...


@attrs.frozen
class Translator:
    """The library's error for a server's error answer, naming the store
    (``describe``) and never a secret (``secrets()``: the credentials in use)."""

    bucket: str
    describe: Callable[[], str]
    secrets: Callable[[], Iterable[str | None]]

    def mask(self, text: str) -> str:
        return mask(text, self.secrets())

    def error(
        self, op: str, key: str | None, conditional: bool, code: str, status: str,
        message: str,
    ) -> StorageError:
        text = self.mask(message)
        if code in _CONDITION_CODES or status in ("412",) or (conditional and status == "409"):
            return ConditionFailed(f"{op}: condition failed ({code or status})", key=key)
        if code == "NoSuchBucket":
            return StoreUnavailable(f"bucket {self.bucket!r} does not exist", key=key)
        if code in _NOT_FOUND_CODES or status == "404":
            if conditional:  # If-Match on a missing key: some servers answer 404
                return ConditionFailed(f"{op}: condition failed (no such key)", key=key)
            return ObjectNotFound(f"{op}: no such key", key=key)
        if code in _AUTH_CODES or status == "403":
            return StoreUnavailable(
                f"{op}: access denied by {self.describe()} ({code}); check credentials", key=key
            )
        return StorageError(
            f"{op} failed: {code or status} {text}".rstrip(), key=key,
            transient=status.startswith("5") or transient_failure(status, code),
        )
