"""The S3 store: the storage protocol on boto3, for any S3-compatible server.

One boto3 client per process, built lazily on first use and rebuilt after a fork
(a client inherited across fork shares keep-alive sockets with the parent and has been
seen returning other requests' bodies). Threads of one process share the client; boto3
clients are thread-safe. The hot requests take the fast path of :mod:`.s3_wire` where
it applies (``s3.fast_path``), built and rebuilt with the client. Every error is
translated here into the library's :class:`~pawn_queue_sync.errors.StorageError`
family, without credentials (nor the ``user:password@`` an endpoint URL may carry).

A closed store stays closed (:class:`~pawn_queue_sync.errors.StoreClosed`). Locks a
thread of the parent held at a fork are replaced in the child (``os.register_at_fork``),
which then builds its own client on first use.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

from ..config import redact_endpoint
from ..errors import (
    ConditionFailed,
    DeadlineExceeded,
    ObjectNotFound,
    StorageError,
    StoreClosed,
    StoreUnavailable,
)
from . import s3_wire
from .base import (
    DELETE_BATCH,
    GetResult,
    Listing,
    ObjectInfo,
    PutResult,
    normalize_etag,
    time_left,
)
from .s3_wire import Answer, WireClient, WireDeadline, WireUnavailable

if TYPE_CHECKING:
    from ..config import S3Config

__all__ = ["S3Store"]

log = logging.getLogger(__name__)

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


class S3Store:
    """A bucket on an S3-compatible server, behind the storage protocol.

    Picklable: only the configuration travels; each process builds its own client.
    """

    def __init__(self, config: S3Config, *, max_pool_connections: int | None = None) -> None:
        self._config = config
        self._bucket = config.bucket_name
        self._pool = config.max_pool_connections or max_pool_connections or 32
        self._lock = threading.Lock()  # replaced in a forked child (_after_fork_in_child)
        self._client_obj: Any = None
        self._wire_obj: WireClient | None = None
        self._client_pid: int | None = None
        self._closed = False
        # (deadline, op, key) of this thread's boto3 call, for the client's event hooks
        self._bounds = threading.local()
        _STORES.add(self)

    # -- process-local client ------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self._config, "pool": self._pool}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"], max_pool_connections=state["pool"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"S3Store({self.describe()})"

    def describe(self) -> str:
        endpoint = redact_endpoint(self._config.endpoint_url or "aws")
        return f"s3:{endpoint}/{self._bucket}"

    def identity(self) -> str:
        """What makes two stores the same for a capability probe's cached result: the
        endpoint and bucket (``describe()``) and who we are to the server (a digest of
        the access key id, or the default credential chain): read-only credentials must
        be refused at setup even after admin ones probed the same bucket."""
        who = self._config.aws_access_key_id or "default credential chain"
        digest = hashlib.sha256(who.encode("utf-8")).hexdigest()[:16]
        return f"{self.describe()} as {digest}"

    @property
    def bucket(self) -> str:
        return self._bucket

    def _client(self) -> Any:
        """This process's boto3 client; built on first use and again after a fork, never
        after ``close()`` (StoreClosed)."""
        pid = os.getpid()
        client = self._client_obj
        if client is not None and self._client_pid == pid:
            return client
        with self._lock:
            if self._closed:
                raise StoreClosed(f"{self.describe()} is closed")
            if self._client_obj is None or self._client_pid != pid:
                client, core = self._build_client()
                self._wire_obj = self._build_wire(client, core)
                self._client_obj = client
                self._client_pid = pid
            return self._client_obj

    def _wire(self) -> WireClient | None:
        """This process's fast path, or None where it does not apply."""
        if self._client_obj is None or self._client_pid != os.getpid():
            self._client()
        return self._wire_obj

    @property
    def fast_path(self) -> bool:
        """Whether the hot requests bypass boto3 in this process."""
        return self._wire() is not None

    def _build_client(self) -> Any:
        import boto3

        _SECRET_FILTER.add(self._config.aws_access_key_id, self._config.aws_secret_access_key)
        from botocore.config import Config

        cfg = self._config
        bc = Config(
            connect_timeout=cfg.connect_timeout_seconds,
            read_timeout=cfg.read_timeout_seconds,
            retries={"max_attempts": cfg.max_attempts, "mode": "standard"},
            max_pool_connections=self._pool,
            s3={"addressing_style": cfg.addressing_style},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        core = _new_botocore_session()
        # botocore parses every listed key's timestamp with dateutil (0.1-0.4 ms each):
        # the standard library does the same in a fraction of that.
        core.get_component("response_parser_factory").set_parser_defaults(
            timestamp_parser=_parse_timestamp
        )
        session = boto3.session.Session(botocore_session=core)
        try:
            client = session.client(
                "s3",
                endpoint_url=cfg.endpoint_url,
                region_name=cfg.region_name,
                use_ssl=cfg.use_ssl,
                aws_access_key_id=cfg.aws_access_key_id,
                aws_secret_access_key=cfg.aws_secret_access_key,
                config=bc,
            )
        except Exception as exc:  # bad endpoint URL, bad region, ...
            raise StoreUnavailable(f"cannot build an S3 client: {type(exc).__name__}") from None
        # Our bodies are small: "Expect: 100-continue" only costs every PUT a round trip.
        from botocore.handlers import add_expect_header

        client.meta.events.unregister("before-call.s3", add_expect_header)
        # deadlines of boto3 calls (see _call): checked before every attempt and retry
        client.meta.events.register_first("before-send.s3", self._before_send)
        client.meta.events.register_first("needs-retry.s3", self._before_retry)
        return client, core

    def _build_wire(self, client: Any, core: Any) -> WireClient | None:
        """The fast path for an explicit endpoint with path addressing, no proxy and
        credentials at hand; None otherwise (boto3 then sends everything)."""
        cfg = self._config
        if not (cfg.fast_path and cfg.endpoint_url) or cfg.addressing_style == "virtual":
            return None
        from urllib.parse import urlsplit
        from urllib.request import getproxies, proxy_bypass

        parts = urlsplit(client.meta.endpoint_url)
        if parts.scheme not in ("http", "https") or parts.query or parts.fragment:
            return None
        if parts.scheme in getproxies() and not proxy_bypass(parts.hostname or ""):
            return None
        if cfg.aws_access_key_id and cfg.aws_secret_access_key:
            from botocore.credentials import Credentials

            credentials: Any = Credentials(cfg.aws_access_key_id, cfg.aws_secret_access_key)
        else:
            credentials = core.get_credentials()
        if credentials is None:
            return None  # boto3 reports the missing credentials
        from botocore.httpsession import get_cert_path

        return WireClient(
            endpoint_url=client.meta.endpoint_url,
            bucket=self._bucket,
            region=client.meta.region_name or "us-east-1",
            credentials=credentials,
            events=client.meta.events,
            pool_size=self._pool,
            connect_timeout=cfg.connect_timeout_seconds,
            read_timeout=cfg.read_timeout_seconds,
            max_attempts=cfg.max_attempts,
            ca_bundle=core.get_config_variable("ca_bundle") or get_cert_path(True),
        )

    def close(self) -> None:
        """Release the connections; the store is unusable afterwards (StoreClosed)."""
        with self._lock:
            self._closed = True
            client, self._client_obj = self._client_obj, None
            wire, self._wire_obj = self._wire_obj, None
            pid, self._client_pid = self._client_pid, None
        if client is not None and pid == os.getpid():
            try:
                client.close()
                if wire is not None:
                    wire.close()
            except Exception:  # closing must never fail a shutdown
                log.debug("error closing the S3 client", exc_info=True)

    # -- error translation -----------------------------------------------------------

    def _call(
        self, op: str, key: str | None, conditional: bool = False, *,
        deadline: float | None = None, **kwargs: Any,
    ) -> Any:
        """Run one client operation, translating every failure into a StorageError;
        with a ``deadline`` (monotonic), bounded as :meth:`_before_send` and
        :meth:`_before_retry` say."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        client = self._client()  # StoreClosed first: the more useful error
        if deadline is not None:
            time_left(deadline, time.monotonic(), op, key)
        self._bounds.current = None if deadline is None else (deadline, op, key)
        try:
            return getattr(client, op)(Bucket=self._bucket, **kwargs)
        except ClientError as exc:
            raise self._translate(op, key, conditional, exc) from None
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
                f"{op} failed: {type(exc).__name__}: {self._redact(str(exc))}", key=key
            ) from None
        except StorageError:
            raise
        except Exception as exc:  # e.g. urllib3 errors surfacing unwrapped
            raise StorageError(f"{op} failed: {type(exc).__name__}", key=key) from None
        finally:
            self._bounds.current = None

    def _before_send(self, request: Any, **_: Any) -> None:
        """botocore's ``before-send`` of a call with a deadline: no attempt after it
        (DeadlineExceeded), and this attempt waits for its answer only until then."""
        bound = getattr(self._bounds, "current", None)
        if bound is None:
            return
        deadline, op, key = bound
        left = time_left(deadline, time.monotonic(), op, key)
        context = getattr(request, "context", None)
        if isinstance(context, dict):  # botocore's per-request read timeout
            context["read_timeout"] = min(self._config.read_timeout_seconds, left)

    def _before_retry(
        self, attempts: int, response: Any = None, caught_exception: Any = None, **_: Any
    ) -> float | None:
        """botocore's ``needs-retry`` of a call with a deadline: the standard mode's
        decision and backoff, except that a retry whose backoff would end past the
        deadline is not made (DeadlineExceeded at once). None: botocore decides."""
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
            retry = s3_wire.retryable(int(http.status_code), code=str(error.get("Code", "")))
        if not retry:
            return None
        deadline, op, key = bound
        delay = s3_wire.backoff(attempts)
        if time.monotonic() + delay >= deadline:
            raise DeadlineExceeded(
                f"{op}: the deadline comes before attempt {attempts + 1}", key=key
            )
        return delay

    def _translate(self, op: str, key: str | None, conditional: bool, exc: Any) -> StorageError:
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
        return self._error(op, key, conditional, code, status, str(err.get("Message", "")))

    def _error(
        self, op: str, key: str | None, conditional: bool, code: str, status: str, message: str
    ) -> StorageError:
        """The library's error for a server's error answer."""
        text = self._redact(message)
        if code in _CONDITION_CODES or status in ("412",) or (conditional and status == "409"):
            return ConditionFailed(f"{op}: condition failed ({code or status})", key=key)
        if code == "NoSuchBucket":
            return StoreUnavailable(f"bucket {self._bucket!r} does not exist", key=key)
        if code in _NOT_FOUND_CODES or status == "404":
            if conditional:  # If-Match on a missing key: some servers answer 404
                return ConditionFailed(f"{op}: condition failed (no such key)", key=key)
            return ObjectNotFound(f"{op}: no such key", key=key)
        if code in _AUTH_CODES or status == "403":
            return StoreUnavailable(
                f"{op}: access denied by {self.describe()} ({code}); check credentials", key=key
            )
        return StorageError(f"{op} failed: {code or status} {text}".rstrip(), key=key)

    def _send(
        self, op: str, key: str | None, conditional: bool, request: Any, *args: Any
    ) -> Answer:
        """One fast-path request; an error answer or no answer becomes a StorageError."""
        try:
            answer: Answer = request(*args)
        except WireDeadline as exc:
            raise DeadlineExceeded(f"{op}: {self._redact(str(exc))}", key=key) from None
        except WireUnavailable as exc:
            raise StoreUnavailable(f"{op} failed: {self._redact(str(exc))}", key=key) from None
        except StorageError:
            raise
        except Exception as exc:  # e.g. credentials that fail to refresh
            raise StorageError(f"{op} failed: {type(exc).__name__}", key=key) from None
        if not answer.ok:
            code, message = s3_wire.error_of(answer)
            raise self._error(op, key, conditional, code, str(answer.status), message)
        return answer

    def _redact(self, text: str) -> str:
        """Mask the credentials, also in the escaped and trimmed forms error texts quote
        them in (botocore shows a bad header as bytes: a key read from a file with its
        newline appears as ``KEY\\n`` in the message), and the userinfo of URLs."""
        text = redact_endpoint(text)
        for secret in (self._config.aws_access_key_id, self._config.aws_secret_access_key):
            if not secret:
                continue
            forms = {
                secret,
                secret.strip(),
                repr(secret)[1:-1],
                repr(secret.encode("utf-8"))[2:-1],
            }
            for form in sorted(forms, key=len, reverse=True):
                if form == secret or len(form) >= 8:
                    text = text.replace(form, "***")
        return text

    @staticmethod
    def _server_time(resp: dict[str, Any]) -> datetime | None:
        """The Date of a boto3 answer; None without one (never the local time)."""
        return _http_date(resp.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date"))

    # -- the protocol ---------------------------------------------------------------

    def put(
        self,
        key: str,
        body: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
        deadline: float | None = None,
    ) -> PutResult:
        conditional = if_none_match or if_match is not None
        wire = self._wire()
        if wire is not None:
            headers = {}
            if if_none_match:
                headers["if-none-match"] = "*"
            if if_match is not None:
                headers["if-match"] = f'"{if_match}"'
            answer = self._send(
                "put_object", key, conditional, wire.put, key, body, headers, deadline
            )
            return PutResult(
                key, normalize_etag(answer.headers.get("etag")),
                _http_date(answer.headers.get("date")),
            )
        kwargs: dict[str, Any] = {"Key": key, "Body": body, "ContentType": "application/json"}
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        if if_match is not None:
            kwargs["IfMatch"] = f'"{if_match}"'
        resp = self._call("put_object", key, conditional, deadline=deadline, **kwargs)
        return PutResult(key, normalize_etag(resp.get("ETag")), self._server_time(resp))

    def get(self, key: str) -> GetResult:
        wire = self._wire()
        if wire is not None:
            answer = self._send("get_object", key, False, wire.get, key)
            return GetResult(
                key=key,
                body=answer.body,
                etag=normalize_etag(answer.headers.get("etag")),
                last_modified=_utc(_http_date(answer.headers.get("last-modified"))),
                server_time=_http_date(answer.headers.get("date")),
            )
        resp = self._call("get_object", key, Key=key)
        try:
            body = resp["Body"].read()
        except Exception as exc:
            raise StorageError(f"reading body failed: {type(exc).__name__}", key=key) from None
        finally:
            resp["Body"].close()
        return GetResult(
            key=key,
            body=body,
            etag=normalize_etag(resp.get("ETag")),
            last_modified=_utc(resp.get("LastModified")),
            server_time=self._server_time(resp),
        )

    def head(self, key: str) -> ObjectInfo:
        wire = self._wire()
        if wire is not None:
            h = self._send("head_object", key, False, wire.head, key).headers
            return ObjectInfo(
                key=key,
                etag=normalize_etag(h.get("etag")),
                size=int(h.get("content-length") or 0),
                last_modified=_utc(_http_date(h.get("last-modified"))),
            )
        resp = self._call("head_object", key, Key=key)
        return ObjectInfo(
            key=key,
            etag=normalize_etag(resp.get("ETag")),
            size=int(resp.get("ContentLength", 0)),
            last_modified=_utc(resp.get("LastModified")),
        )

    def delete(
        self, key: str, *, if_match: str | None = None, deadline: float | None = None
    ) -> None:
        wire = self._wire()
        if wire is not None:
            headers = {} if if_match is None else {"if-match": f'"{if_match}"'}
            self._send(
                "delete_object", key, if_match is not None, wire.delete, key, headers, deadline
            )
            return
        kwargs: dict[str, Any] = {"Key": key}
        if if_match is not None:
            kwargs["IfMatch"] = f'"{if_match}"'
        self._call("delete_object", key, if_match is not None, deadline=deadline, **kwargs)

    def delete_many(
        self, keys: Iterable[str], *, deadline: float | None = None,
        etags: Mapping[str, str] | None = None,
    ) -> list[str]:
        keys = list(dict.fromkeys(keys))
        etags = etags or {}
        failed: list[str] = []
        wire = self._wire()
        for i in range(0, len(keys), DELETE_BATCH):
            chunk = keys[i : i + DELETE_BATCH]
            if wire is not None:
                answer = self._send(
                    "delete_objects", None, False, wire.delete_objects, chunk, deadline,
                    {k: etags[k] for k in chunk if k in etags},
                )
                errors = self._parsed("delete_objects", s3_wire.delete_errors, answer.body)
            else:
                resp = self._call(
                    "delete_objects",
                    None,
                    deadline=deadline,
                    Delete={"Objects": [_object_id(k, etags.get(k)) for k in chunk],
                            "Quiet": True},
                )
                errors = [(e.get("Key", ""), e.get("Code", "")) for e in resp.get("Errors", [])]
            failed.extend(k for k, code in errors if code != "NoSuchKey")
        return failed

    def _parsed(self, op: str, parse: Any, body: bytes) -> Any:
        try:
            return parse(body)
        except ValueError:
            raise StorageError(f"{op}: the server's answer is not S3 XML") from None

    def copy(self, src: str, dst: str, *, if_none_match: bool = False) -> PutResult:
        kwargs: dict[str, Any] = {
            "Key": dst,
            "CopySource": {"Bucket": self._bucket, "Key": src},
        }
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        try:
            resp = self._call("copy_object", dst, False, **kwargs)
        except ObjectNotFound:
            raise ObjectNotFound("copy: no such source key", key=src) from None
        except StorageError as exc:
            if if_none_match and "409" in str(exc):
                raise ConditionFailed("copy: condition failed", key=dst) from None
            raise
        etag = normalize_etag(resp.get("CopyObjectResult", {}).get("ETag"))
        return PutResult(dst, etag, self._server_time(resp))

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
        while True:
            max_keys = DELETE_BATCH
            if limit is not None:
                max_keys = max(1, min(DELETE_BATCH, limit - len(objects)))
            # StartAfter on the first page only: a continuation token carries on from it.
            page, page_time = self._list_page(
                prefix, max_keys, delimiter, token, None if token else start_after
            )
            server_time = page_time or server_time
            objects.extend(
                ObjectInfo(key=k, etag=normalize_etag(e), size=size, last_modified=_utc(m))
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

    def _list_page(
        self, prefix: str, max_keys: int, delimiter: str | None, token: str | None,
        start_after: str | None,
    ) -> tuple[s3_wire.Page, datetime | None]:
        """One ListObjectsV2 page, by whichever path applies."""
        wire = self._wire()
        if wire is not None:
            answer = self._send(
                "list_objects_v2", prefix, False, wire.list_objects, prefix, max_keys,
                delimiter, token, start_after,
            )
            page = self._parsed("list_objects_v2", s3_wire.list_page, answer.body)
            stamps: dict[str, datetime] = {}  # keys written in one second share a stamp
            rows = [
                (k, e, s, (stamps.get(m) or stamps.setdefault(m, _listed_time(k, m)))
                 if m else None)
                for k, e, s, m in page.rows
            ]
            return s3_wire.Page(rows, page.prefixes, page.token), _http_date(
                answer.headers.get("date")
            )
        kwargs: dict[str, Any] = {"Prefix": prefix, "MaxKeys": max_keys}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        if token:
            kwargs["ContinuationToken"] = token
        if start_after:
            kwargs["StartAfter"] = start_after
        resp = self._call("list_objects_v2", prefix, **kwargs)
        rows = [
            (item["Key"], item.get("ETag", ""), int(item.get("Size", 0)),
             _listed_time(item["Key"], item.get("LastModified")))
            for item in resp.get("Contents", [])
        ]
        more = bool(resp.get("IsTruncated")) and bool(resp.get("NextContinuationToken"))
        page = s3_wire.Page(
            rows, [p["Prefix"] for p in resp.get("CommonPrefixes", [])],
            resp.get("NextContinuationToken") if more else None,
        )
        return page, self._server_time(resp)

    def server_time(self) -> datetime | None:
        """The Date of a HEAD of the bucket; None when the server sent none."""
        return self._server_time(self._call("head_bucket", None))

    # -- bucket management (not part of the protocol) -----------------------------------

    def ensure_bucket(self, *, create: bool = False) -> None:
        """Check the bucket is reachable; create it when asked and missing."""
        try:
            self._call("head_bucket", None)
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
            self._call("create_bucket", None, **kwargs)
        except StorageError as exc:
            if "BucketAlreadyOwnedByYou" not in str(exc):
                raise


class _RedactSecrets(logging.Filter):
    """Masks our credentials in botocore's and urllib3's own log records: at DEBUG,
    botocore logs request headers, and the Authorization header names the access key;
    it logs URLs too, so the userinfo of any is masked as well."""

    LOGGERS = (
        "botocore",
        "botocore.endpoint",
        "botocore.auth",
        "botocore.hooks",
        "botocore.httpsession",
        "botocore.parsers",
        "botocore.retryhandler",
        "botocore.credentials",
        "urllib3.connectionpool",
    )

    def __init__(self) -> None:
        super().__init__()
        self._secrets: frozenset[str] = frozenset()
        self._lock = threading.Lock()

    #: whose loggers are covered: a filter acts only on its own logger's records, so
    #: every logger of these packages that exists when a client is built gets it
    PACKAGES = ("botocore", "boto3", "urllib3", "s3transfer")

    def add(self, *secrets: str | None) -> None:
        with self._lock:
            self._secrets = self._secrets | {s for s in secrets if s}
            existing = [
                name for name in list(logging.root.manager.loggerDict)
                if name.split(".", 1)[0] in self.PACKAGES
            ]
            for name in (*self.LOGGERS, *existing):
                logger = logging.getLogger(name)
                if self not in logger.filters:
                    logger.addFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        original = record.getMessage()
        text = self._redact(original)
        if text != original:
            record.msg, record.args = text, None
        if record.exc_info and not record.exc_text:
            # botocore logs connection errors with their traceback, whose text quotes
            # the URL: formatted here once, masked, and kept where handlers look first
            record.exc_text = self._redact(_FORMATTER.formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = self._redact(record.stack_info)
        return True

    def _redact(self, original: str) -> str:
        secrets = self._secrets
        text = redact_endpoint(original) if "@" in original else original
        if any(secret in text for secret in secrets):
            for secret in sorted(secrets, key=len, reverse=True):
                text = text.replace(secret, "***")
        return text


_FORMATTER = logging.Formatter()


_SECRET_FILTER = _RedactSecrets()

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
    _SECRET_FILTER._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)

_LOADER: Any = None


def _new_botocore_session() -> Any:
    """A fresh botocore session (own credentials, config and events) sharing this
    process's data loader: loading the S3 service model again for every client costs
    ~0.5 s of CPU with the GIL held. The loader is a cache of read-only JSON files, so
    no lock (a race builds two, harmlessly) and nothing to redo after a fork."""
    import botocore.loaders
    import botocore.session

    global _LOADER
    loader = _LOADER
    if loader is None:
        loader = _LOADER = botocore.loaders.create_loader()
    session = botocore.session.Session()
    session.register_component("data_loader", loader)
    return session


def _strict_timestamp(value: str) -> datetime:
    """S3 timestamps: ISO 8601 in XML bodies, RFC 1123 in headers; botocore's own parser
    (dateutil) for anything else. Raises ValueError (or TypeError) when unreadable."""
    try:
        if value[:4].isdigit():
            return datetime.fromisoformat(value).astimezone(timezone.utc)
        return parsedate_to_datetime(value).astimezone(timezone.utc)
    except (TypeError, ValueError, IndexError):
        from botocore.utils import parse_timestamp

        return parse_timestamp(value)  # type: ignore[no-any-return]


def _parse_timestamp(value: Any) -> Any:
    """botocore's timestamp parser for our clients: :func:`_strict_timestamp`, or the
    text itself when unreadable, so the store can say which object it belongs to (an
    error raised inside botocore's parser could not)."""
    try:
        return _strict_timestamp(value)
    except (TypeError, ValueError, OverflowError):
        return value


def _listed_time(key: str, value: Any) -> datetime | None:
    """A listed object's LastModified as UTC; None when the server gave none; a
    StorageError naming the object when it is unreadable (never a guess)."""
    if value is None or value == "" or isinstance(value, datetime):
        return _utc(value)
    try:
        return _strict_timestamp(value)
    except (TypeError, ValueError, OverflowError):
        raise StorageError("list_objects_v2: unreadable LastModified", key=key) from None


def _http_date(value: str | None) -> datetime | None:
    """An HTTP date header as UTC; None when absent or unreadable."""
    if not value:
        return None
    try:
        return parsedate_to_datetime(value).astimezone(timezone.utc)
    except (TypeError, ValueError):
        return None


def _utc(value: Any) -> datetime | None:
    """A server's timestamp as UTC; None for anything else (absent or unreadable): the
    local clock never stands in for the server's."""
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc) if value.tzinfo else value.replace(
            tzinfo=timezone.utc
        )
    return None


def _object_id(key: str, etag: str | None) -> dict[str, str]:
    """A DeleteObjects entry: the key, and the ETag it must still have, if given."""
    return {"Key": key, "ETag": f'"{etag}"'} if etag else {"Key": key}
