"""The boto3 transport: the store's requests as boto3 calls, with deadlines enforced
through the client's own events (checked before every attempt and retry) and every
failure translated into the library's errors, secrets masked."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import attrs

from ...errors import DeadlineExceeded, StorageError, StoreUnavailable
from ..base import GetResult, ObjectInfo, PutResult, last_send, normalize_etag, time_left
from .answers import Page
from .retries import backoff, retryable
from .times import http_date, listed_time, utc
from .transport import Translator

if TYPE_CHECKING:
    from ...config import S3Config

__all__ = ["BotoTransport"]


@attrs.define
class _Bound:
    """The bounds of one boto3 call (monotonic instants) and its attempts so far."""

    deadline: float | None
    retry_by: float | None
    op: str
    key: str | None
    attempts: int = 0


class BotoTransport:
    """:class:`~.transport.Transport` over a boto3 client, and the requests only boto3
    sends (copies, bucket checks). One per process and client."""

    def __init__(
        self, client: Any, config: S3Config, translator: Translator, *, owned: bool
    ) -> None:
        self.client = client
        self._config = config
        self._errors = translator
        self._owned = owned
        self._bucket = translator.bucket
        # the _Bound of this thread's boto3 call, for the client's event hooks
        self._bounds = threading.local()
        events = client.meta.events
        if owned:
            # Our bodies are small: "Expect: 100-continue" only costs every PUT a round trip.
            from botocore.handlers import add_expect_header

            events.unregister("before-call.s3", add_expect_header)
        # deadlines of calls (see call()): checked before every attempt and retry
        events.register_first("before-send.s3", self._before_send)
        events.register_first("needs-retry.s3", self._before_retry)

    def close(self) -> None:
        events = self.client.meta.events
        if self._owned:
            self.client.close()
        else:  # the caller's client: ours are the hooks, not its connections
            events.unregister("before-send.s3", self._before_send)
            events.unregister("needs-retry.s3", self._before_retry)

    # -- calls and their deadlines ---------------------------------------------------

    def call(
        self, op: str, key: str | None, conditional: bool = False, *,
        deadline: float | None = None, retry_by: float | None = None, **kwargs: Any,
    ) -> Any:
        """Run one client operation, translating every failure into a StorageError;
        with a ``deadline`` or ``retry_by`` (monotonic), bounded as :meth:`_before_send`
        and :meth:`_before_retry` say."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        if deadline is not None:
            time_left(deadline, time.monotonic(), op, key)
        bounded = deadline is not None or retry_by is not None
        self._bounds.current = _Bound(deadline, retry_by, op, key) if bounded else None
        try:
            return getattr(self.client, op)(Bucket=self._bucket, **kwargs)
        except ClientError as exc:
            err = exc.response.get("Error", {})
            status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            raise self._errors.error(
                op, key, conditional, str(err.get("Code", "")), status,
                str(err.get("Message", "")),
            ) from None
        except NoCredentialsError:
            raise StoreUnavailable(
                "no S3 credentials: set s3.aws_access_key_id/aws_secret_access_key, "
                "PAWNQUEUE_S3_ACCESS_KEY/PAWNQUEUE_S3_SECRET_KEY, or AWS credentials"
            ) from None
        except BotoCoreError as exc:
            if deadline is not None and time.monotonic() >= deadline:
                raise DeadlineExceeded(
                    f"{op}: no answer by the deadline ({type(exc).__name__})", key=key
                ) from None
            raise StoreUnavailable(
                f"{op} failed: {type(exc).__name__}: {self._errors.mask(str(exc))}", key=key,
                transient=True,
            ) from None
        except StorageError:
            raise
        except Exception as exc:  # e.g. urllib3 errors surfacing unwrapped
            raise StorageError(f"{op} failed: {type(exc).__name__}", key=key) from None
        finally:
            self._bounds.current = None

    def _before_send(self, request: Any, **_: Any) -> None:
        """botocore's ``before-send`` of a bounded call: no attempt after its deadline
        and no retry after its ``retry_by`` (DeadlineExceeded); an attempt waits for its
        answer only until the deadline (as long as it would without one)."""
        bound = getattr(self._bounds, "current", None)
        if bound is None:
            return
        bound.attempts += 1
        now, op, key = time.monotonic(), bound.op, bound.key
        if bound.attempts > 1:
            time_left(bound.retry_by, now, op, key)
        if bound.deadline is None:
            return
        left = time_left(bound.deadline, now, op, key)
        context = getattr(request, "context", None)
        if isinstance(context, dict):  # botocore's per-request read timeout
            context["read_timeout"] = min(self._config.read_timeout_seconds, left)

    def _before_retry(
        self, attempts: int, response: Any = None, caught_exception: Any = None, **_: Any
    ) -> float | None:
        """botocore's ``needs-retry`` of a bounded call: the standard mode's decision
        and backoff, except that a retry whose backoff would end past the deadline or
        the ``retry_by`` is not made (DeadlineExceeded at once). None: botocore decides."""
        bound = getattr(self._bounds, "current", None)
        if bound is None or attempts >= self._config.max_attempts:
            return None
        from botocore.exceptions import BotoCoreError

        if caught_exception is not None:
            retry = isinstance(caught_exception, BotoCoreError)  # no answer: transport
        elif response is None:
            return None
        else:
            http, parsed = response
            error = parsed.get("Error", {}) if isinstance(parsed, dict) else {}
            retry = retryable(int(http.status_code), code=str(error.get("Code", "")))
        if not retry:
            return None
        delay = backoff(attempts)
        last = last_send(bound.deadline, bound.retry_by)
        if last is not None and time.monotonic() + delay >= last:
            raise DeadlineExceeded(
                f"{bound.op}: the deadline comes before attempt {attempts + 1}", key=bound.key
            )
        return delay

    @staticmethod
    def server_time(resp: dict[str, Any]) -> datetime | None:
        """The Date of a boto3 answer; None without one (never the local time)."""
        return http_date(resp.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date"))

    # -- the transport -----------------------------------------------------------------

    def put(
        self, key: str, body: bytes, *, if_none_match: bool, if_match: str | None,
        deadline: float | None, retry_by: float | None = None,
    ) -> PutResult:
        kwargs: dict[str, Any] = {"Key": key, "Body": body, "ContentType": "application/json"}
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        if if_match is not None:
            kwargs["IfMatch"] = f'"{if_match}"'
        conditional = if_none_match or if_match is not None
        resp = self.call("put_object", key, conditional, deadline=deadline, retry_by=retry_by,
                         **kwargs)
        return PutResult(key, normalize_etag(resp.get("ETag")), self.server_time(resp))

    def get(self, key: str) -> GetResult:
        resp = self.call("get_object", key, Key=key)
        try:
            body = resp["Body"].read()
        except Exception as exc:
            raise StorageError(f"reading body failed: {type(exc).__name__}", key=key,
                               transient=True) from None
        finally:
            resp["Body"].close()
        return GetResult(
            key=key,
            body=body,
            etag=normalize_etag(resp.get("ETag")),
            last_modified=utc(resp.get("LastModified")),
            server_time=self.server_time(resp),
        )

    def head(self, key: str) -> ObjectInfo:
        resp = self.call("head_object", key, Key=key)
        return ObjectInfo(
            key=key,
            etag=normalize_etag(resp.get("ETag")),
            size=int(resp.get("ContentLength", 0)),
            last_modified=utc(resp.get("LastModified")),
        )

    def delete(
        self, key: str, *, if_match: str | None, deadline: float | None,
        retry_by: float | None = None,
    ) -> None:
        kwargs: dict[str, Any] = {"Key": key}
        if if_match is not None:
            kwargs["IfMatch"] = f'"{if_match}"'
        self.call("delete_object", key, if_match is not None, deadline=deadline,
                  retry_by=retry_by, **kwargs)

    def delete_objects(
        self, keys: list[str], etags: Mapping[str, str], deadline: float | None
    ) -> list[tuple[str, str]]:
        objects = [
            {"Key": k, "ETag": f'"{etags[k]}"'} if etags.get(k) else {"Key": k} for k in keys
        ]
        resp = self.call("delete_objects", None, deadline=deadline,
                         Delete={"Objects": objects, "Quiet": True})
        return [(e.get("Key", ""), e.get("Code", "")) for e in resp.get("Errors", [])]

    def list_page(
        self, prefix: str, max_keys: int, delimiter: str | None, token: str | None,
        start_after: str | None,
    ) -> tuple[Page, datetime | None]:
        kwargs: dict[str, Any] = {"Prefix": prefix, "MaxKeys": max_keys}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        if token:
            kwargs["ContinuationToken"] = token
        if start_after:
            kwargs["StartAfter"] = start_after
        resp = self.call("list_objects_v2", prefix, **kwargs)
        rows = [
            (item["Key"], item.get("ETag", ""), int(item.get("Size", 0)),
             listed_time(item["Key"], item.get("LastModified")))
            for item in resp.get("Contents", [])
        ]
        more = bool(resp.get("IsTruncated")) and bool(resp.get("NextContinuationToken"))
        page = Page(
            rows, [p["Prefix"] for p in resp.get("CommonPrefixes", [])],
            resp.get("NextContinuationToken") if more else None,
        )
        return page, self.server_time(resp)
