"""The fast transport: the hot requests over :class:`~.wire.WireClient` (signed by us,
sent with urllib3), answers read into the storage protocol's results."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from ...errors import DeadlineExceeded, StorageError, StoreUnavailable
from ..base import GetResult, ObjectInfo, PutResult, normalize_etag
from .answers import Answer, Page, delete_errors, error_of, list_page
from .times import http_date, listed_time, utc
from .transport import Translator
from .wire import WireClient, WireDeadline, WireUnavailable

if TYPE_CHECKING:
    from ...config import S3Config
    from .source import Built

__all__ = ["FastTransport", "build_wire"]

_T = TypeVar("_T")


class FastTransport:
    """:class:`~.transport.Transport` over a :class:`WireClient` (one per process)."""

    def __init__(self, wire: WireClient, translator: Translator) -> None:
        self.wire = wire
        self._errors = translator

    def close(self) -> None:
        self.wire.close()

    def _send(
        self, op: str, key: str | None, conditional: bool, request: Any, *args: Any
    ) -> Answer:
        """One request; an error answer or no answer becomes a StorageError."""
        try:
            answer: Answer = request(*args)
        except WireDeadline as exc:
            raise DeadlineExceeded(f"{op}: {self._errors.mask(str(exc))}", key=key) from None
        except WireUnavailable as exc:
            raise StoreUnavailable(
                f"{op} failed: {self._errors.mask(str(exc))}", key=key, transient=True
            ) from None
        except StorageError:
            raise
        except Exception as exc:  # e.g. credentials that fail to refresh
            raise StorageError(f"{op} failed: {type(exc).__name__}", key=key) from None
        if not answer.ok:
            code, message = error_of(answer)
            raise self._errors.error(op, key, conditional, code, str(answer.status), message)
        return answer

    def put(
        self, key: str, body: bytes, *, if_none_match: bool, if_match: str | None,
        deadline: float | None, retry_by: float | None = None,
    ) -> PutResult:
        headers = {}
        if if_none_match:
            headers["if-none-match"] = "*"
        if if_match is not None:
            headers["if-match"] = f'"{if_match}"'
        conditional = if_none_match or if_match is not None
        answer = self._send("put_object", key, conditional, self.wire.put, key, body, headers,
                            deadline, retry_by)
        return PutResult(
            key, normalize_etag(answer.headers.get("etag")), http_date(answer.headers.get("date"))
        )

    def get(self, key: str) -> GetResult:
        answer = self._send("get_object", key, False, self.wire.get, key)
        return GetResult(
            key=key,
            body=answer.body,
            etag=normalize_etag(answer.headers.get("etag")),
            last_modified=utc(http_date(answer.headers.get("last-modified"))),
            server_time=http_date(answer.headers.get("date")),
        )

    def head(self, key: str) -> ObjectInfo:
        h = self._send("head_object", key, False, self.wire.head, key).headers
        return ObjectInfo(
            key=key,
            etag=normalize_etag(h.get("etag")),
            size=int(h.get("content-length") or 0),
            last_modified=utc(http_date(h.get("last-modified"))),
        )

    def delete(
        self, key: str, *, if_match: str | None, deadline: float | None,
        retry_by: float | None = None,
    ) -> None:
        headers = {} if if_match is None else {"if-match": f'"{if_match}"'}
        self._send("delete_object", key, if_match is not None, self.wire.delete, key, headers,
                   deadline, retry_by)

    def delete_objects(
        self, keys: list[str], etags: Mapping[str, str], deadline: float | None
    ) -> list[tuple[str, str]]:
        answer = self._send("delete_objects", None, False, self.wire.delete_objects, keys,
                            deadline, dict(etags))
        return self._parsed("delete_objects", delete_errors, answer.body)

    def list_page(
        self, prefix: str, max_keys: int, delimiter: str | None, token: str | None,
        start_after: str | None,
    ) -> tuple[Page, datetime | None]:
        answer = self._send("list_objects_v2", prefix, False, self.wire.list_objects, prefix,
                            max_keys, delimiter, token, start_after)
        page = self._parsed("list_objects_v2", list_page, answer.body)
        stamps: dict[str, datetime | None] = {}  # keys written in one second share a stamp
        rows = [
            (k, e, s, (stamps.get(m) or stamps.setdefault(m, listed_time(k, m))) if m else None)
            for k, e, s, m in page.rows
        ]
        return Page(rows, page.prefixes, page.token), http_date(answer.headers.get("date"))

    @staticmethod
    def _parsed(op: str, parse: Callable[[bytes], _T], body: bytes) -> _T:
        try:
            return parse(body)
        except ValueError:
            raise StorageError(f"{op}: the server's answer is not S3 XML") from None


def build_wire(config: S3Config, built: Built, pool: int) -> WireClient | None:
    """The fast path for an explicit endpoint with path addressing, no proxy and
    credentials at hand; None otherwise (boto3 then sends everything)."""
    client = built.client
    style = config.addressing_style
    if not built.owned:  # the caller's client addresses as it was configured to
        style = (getattr(client.meta.config, "s3", None) or {}).get("addressing_style") or style
    if not (config.fast_path and config.endpoint_url) or style == "virtual":
        return None
    from urllib.parse import urlsplit
    from urllib.request import getproxies, proxy_bypass

    parts = urlsplit(client.meta.endpoint_url)
    if parts.scheme not in ("http", "https") or parts.query or parts.fragment:
        return None
    if parts.scheme in getproxies() and not proxy_bypass(parts.hostname or ""):
        return None
    if built.credentials is None:
        return None  # boto3 reports the missing credentials
    if parts.scheme == "https" and built.ca_bundle is None:
        return None  # the client does not verify certificates: the fast path would
    return WireClient(
        endpoint_url=client.meta.endpoint_url,
        bucket=config.bucket_name,
        region=client.meta.region_name or "us-east-1",
        credentials=built.credentials,
        events=client.meta.events,
        pool_size=pool,
        connect_timeout=config.connect_timeout_seconds,
        read_timeout=config.read_timeout_seconds,
        max_attempts=config.max_attempts,
        ca_bundle=built.ca_bundle,
    )
