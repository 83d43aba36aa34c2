"""The fast path's client: the queue's hot S3 requests, signed by us (:mod:`.sigv4`)
and sent with urllib3, with botocore's standard retries (:mod:`.retries`).

boto3 spends 2.5-3.5 ms of CPU on every request (model-driven serialisation, endpoint
rules, event hooks, response parsing); the same PUT, GET, HEAD, DELETE, DeleteObjects and
ListObjectsV2 signed here with SigV4 and sent through a urllib3 pool cost about a third
of that, and client CPU is what bounds a consumer (docs/performance.md).

Only used for an explicit endpoint with path-style addressing and no proxy: there the
URL is plainly ``{endpoint}/{bucket}/{key}``; AWS's own endpoints (regional,
virtual-hosted, FIPS, dual-stack) are botocore's job. Like botocore, every request
emits ``before-send.s3.<Operation>`` on the boto3 client's event system (a handler may
answer instead of the network, as moto's ``mock_aws`` does), and every answer
``after-send.s3.<Operation>`` with ``http_response``. The answer is handed back raw
(:class:`~.answers.Answer`); :mod:`.fast` turns it into the storage protocol's results.
"""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Any
from urllib.parse import quote, urlsplit
from xml.sax.saxutils import escape

import attrs

from ..base import last_send
from .answers import Answer
from .retries import backoff, retryable
from .sigv4 import Signer, host_header

__all__ = ["WireClient", "WireDeadline", "WireUnavailable"]

_UNRESERVED = "-_.~"


class WireUnavailable(Exception):
    """Every attempt failed without an answer (connection refused, timeout, ...)."""


class WireDeadline(WireUnavailable):
    """The request's deadline passed before an answer came; nothing was sent after it."""


@attrs.frozen
class _Request:
    op: str
    method: str
    path: str  # already quoted
    query: tuple[tuple[str, str], ...]
    headers: dict[str, str]
    body: bytes


class WireClient:
    """SigV4-signed requests on one bucket over a urllib3 pool. Thread-safe; one per
    process (built by :class:`~pawn_queue_sync.storage.s3.S3Store` after a fork)."""

    def __init__(
        self,
        *,
        endpoint_url: str,
        bucket: str,
        region: str,
        credentials: Any,
        events: Any,
        pool_size: int,
        connect_timeout: float,
        read_timeout: float,
        max_attempts: int,
        ca_bundle: str | None = None,
    ) -> None:
        import urllib3

        parts = urlsplit(endpoint_url)
        self._scheme = parts.scheme
        self._host = host_header(endpoint_url)  # signed, and sent as such
        self._base = parts.path.rstrip("/") + "/" + quote(bucket, safe="")
        self._signer = Signer(host=self._host, region=region, credentials=credentials)
        self._events = events
        self._attempts = max(1, max_attempts)
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        pool_kwargs: dict[str, Any] = {
            "maxsize": pool_size,
            "block": False,
            "retries": False,
            "timeout": urllib3.Timeout(connect=connect_timeout, read=read_timeout),
        }
        if self._scheme == "https":
            if ca_bundle:
                pool_kwargs["ca_certs"] = ca_bundle
            pool_cls: Any = urllib3.HTTPSConnectionPool
        else:
            pool_cls = urllib3.HTTPConnectionPool
        # one pool for the one host: no URL parsing and pool lookup per request
        self._pool = pool_cls(parts.hostname, parts.port, **pool_kwargs)
        # looked up once here, not per request; imported only once S3 is used, like boto3
        from botocore.awsrequest import AWSPreparedRequest

        self._prepared_request = AWSPreparedRequest
        self._timeout = urllib3.Timeout
        self._send_errors = (urllib3.exceptions.HTTPError, OSError, ValueError)
        # what hooks see and errors name: the URL without userinfo, as sent
        self._url_prefix = f"{self._scheme}://{self._host}"

    def close(self) -> None:
        self._pool.close()

    # -- requests ------------------------------------------------------------------

    def put(
        self, key: str, body: bytes, headers: dict[str, str], deadline: float | None = None,
        retry_by: float | None = None,
    ) -> Answer:
        headers = {"content-type": "application/json", **headers}
        return self._send(
            _Request("PutObject", "PUT", self._key_path(key), (), headers, body), deadline,
            retry_by,
        )

    def get(self, key: str) -> Answer:
        return self._send(_Request("GetObject", "GET", self._key_path(key), (), {}, b""))

    def head(self, key: str) -> Answer:
        return self._send(_Request("HeadObject", "HEAD", self._key_path(key), (), {}, b""))

    def delete(
        self, key: str, headers: dict[str, str], deadline: float | None = None,
        retry_by: float | None = None,
    ) -> Answer:
        return self._send(
            _Request("DeleteObject", "DELETE", self._key_path(key), (), headers, b""), deadline,
            retry_by,
        )

    def delete_objects(
        self, keys: list[str], deadline: float | None = None,
        etags: dict[str, str] | None = None,
    ) -> Answer:
        """One DeleteObjects request, quiet (the answer lists failures only); a key in
        ``etags`` is deleted only while it has that ETag (where the server honours it)."""
        etags = etags or {}
        items = "".join(
            f"<Object><Key>{escape(k)}</Key>"
            + (f"<ETag>&quot;{escape(etags[k])}&quot;</ETag>" if etags.get(k) else "")
            + "</Object>"
            for k in keys
        )
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>'
            '<Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            f"<Quiet>true</Quiet>{items}</Delete>"
        ).encode()
        md5 = base64.b64encode(hashlib.md5(body).digest()).decode("ascii")
        headers = {"content-md5": md5, "content-type": "application/xml"}
        return self._send(
            _Request("DeleteObjects", "POST", self._base, (("delete", ""),), headers, body),
            deadline,
        )

    def list_objects(
        self, prefix: str, max_keys: int, delimiter: str | None, token: str | None,
        start_after: str | None = None,
    ) -> Answer:
        query = [("encoding-type", "url"), ("list-type", "2"), ("max-keys", str(max_keys)),
                 ("prefix", prefix)]
        if delimiter:
            query.append(("delimiter", delimiter))
        if token:
            query.append(("continuation-token", token))
        if start_after:
            query.append(("start-after", start_after))
        return self._send(
            _Request("ListObjectsV2", "GET", self._base, tuple(query), {}, b"")
        )

    def _key_path(self, key: str) -> str:
        return f"{self._base}/{quote(key, safe='/' + _UNRESERVED)}"

    # -- sending, with botocore's standard retries ------------------------------------

    def _send(
        self, req: _Request, deadline: float | None = None, retry_by: float | None = None
    ) -> Answer:
        """Attempts until an answer that is not worth retrying; with a ``deadline``
        (monotonic), none is sent after it, each waits at most until it, and a backoff
        that would end past it gives up at once (WireDeadline). ``retry_by`` bounds only
        the retries: the first attempt goes at once, no retry after it, and an attempt
        waits for its answer as usual."""
        last = last_send(deadline, retry_by)
        attempt = 0
        while True:
            attempt += 1
            timeout = None
            if attempt > 1 and retry_by is not None and time.monotonic() >= retry_by:
                raise WireDeadline(f"the retry-by time passed before attempt {attempt}")
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WireDeadline(f"the deadline passed before attempt {attempt}")
                timeout = self._timeout(connect=min(self._connect_timeout, left),
                                        read=min(self._read_timeout, left))
            try:
                answer = self._attempt(req, timeout)
            except WireUnavailable as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    raise WireDeadline(f"no answer by the deadline ({exc})") from None
                if attempt >= self._attempts:
                    raise
            else:
                if not retryable(answer.status, answer) or attempt >= self._attempts:
                    return answer
            delay = backoff(attempt)
            if last is not None and time.monotonic() + delay >= last:
                raise WireDeadline(f"the deadline comes before attempt {attempt + 1}")
            time.sleep(delay)

    def _attempt(self, req: _Request, timeout: Any = None) -> Answer:
        query = "&".join(f"{_q(k)}={_q(v)}" for k, v in sorted(req.query))
        headers = self._sign(req, query)
        target = req.path + (f"?{query}" if query else "")
        answer = self._hooked(req, self._url_prefix + target, headers)
        if answer is None:
            extra = {} if timeout is None else {"timeout": timeout}
            try:
                resp = self._pool.urlopen(
                    req.method, target, body=req.body or None, headers=headers,
                    redirect=False, retries=False, preload_content=True, **extra,
                )
            except self._send_errors as exc:
                # never the exception's text: a malformed header's error quotes it
                raise WireUnavailable(
                    f"{type(exc).__name__} talking to {self._url_prefix}"
                ) from None
            answer = Answer(
                resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.data or b""
            )
        self._events.emit(f"after-send.s3.{req.op}", http_response=_Status(answer.status))
        return answer

    def _hooked(self, req: _Request, url: str, headers: dict[str, str]) -> Answer | None:
        """botocore's ``before-send``: counters see the request, a mock may answer it."""
        prepared = self._prepared_request(req.method, url, headers, req.body or None, False)
        for _, reply in self._events.emit(f"before-send.s3.{req.op}", request=prepared):
            if reply is not None:
                return Answer(
                    int(reply.status_code),
                    {str(k).lower(): str(v) for k, v in reply.headers.items()},
                    bytes(reply.content or b""),
                )
        return None

    def _sign(self, req: _Request, query: str) -> dict[str, str]:
        return self._signer.sign(req.method, req.path, query, req.headers, req.body)


@attrs.frozen
class _Status:
    """What ``after-send`` handlers get as ``http_response``: the status code."""

    status_code: int


def _q(text: str) -> str:
    return quote(text, safe=_UNRESERVED)
