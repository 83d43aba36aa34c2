"""The fast path: the queue's hot S3 requests, signed by us and sent with urllib3.

boto3 spends 2.5-3.5 ms of CPU on every request (model-driven serialisation, endpoint
rules, event hooks, response parsing); the same PUT, GET, HEAD, DELETE, DeleteObjects and
ListObjectsV2 signed here with SigV4 and sent through a urllib3 pool cost about a third
of that, and client CPU is what bounds a consumer (docs/performance.md). Everything else
(bucket checks, copies, the credential chain, errors boto3 knows) stays with boto3.

Only used for an explicit ``endpoint_url`` with path-style addressing and no proxy:
there the URL is plainly ``{endpoint}/{bucket}/{key}``; AWS's own endpoints (regional,
virtual-hosted, FIPS, dual-stack) are botocore's job. Like botocore, every request
emits ``before-send.s3.<Operation>`` on the boto3 client's event system (a handler may
answer instead of the network, as moto's ``mock_aws`` does), and every answer
``after-send.s3.<Operation>`` with ``http_response``; retries follow botocore's
"standard" mode. The answer is handed back raw (:class:`Answer`); :mod:`.s3` turns
it into the storage protocol's results and errors.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
import random
import threading
import time
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, unquote_plus, urlsplit
from xml.sax.saxutils import escape

import attrs

__all__ = [
    "Answer", "Page", "WireClient", "WireDeadline", "WireUnavailable", "delete_errors",
    "error_of", "host_header", "list_page", "retryable",
]

#: Answers botocore's "standard" retry mode retries (besides connection errors).
_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
_RETRY_CODES = frozenset(
    {
        "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException",
        "TooManyRequestsException", "RequestLimitExceeded", "BandwidthLimitExceeded",
        "SlowDown", "RequestThrottled", "RequestTimeout", "RequestTimeoutException",
        "PriorRequestNotComplete", "InternalError",
    }
)
_MAX_BACKOFF = 20.0
_UNRESERVED = "-_.~"
_DEFAULT_PORTS = {"http": 80, "https": 443}


class WireUnavailable(Exception):
    """Every attempt failed without an answer (connection refused, timeout, ...)."""


class WireDeadline(WireUnavailable):
    """The request's deadline passed before an answer came; nothing was sent after it."""


def host_header(url: str) -> str:
    """The Host header urllib3 sends for ``url``, which is what SigV4 must sign: the
    host name lower-cased, an IPv6 address in brackets, the port only when it is not
    the scheme's default, never ``user:password@``. botocore signs the same
    (``botocore.auth._host_from_url``), so the fast path and boto3 agree."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = parts.port
    if port is not None and port != _DEFAULT_PORTS.get(parts.scheme):
        host = f"{host}:{port}"
    return host


def backoff(attempt: int) -> float:
    """botocore's "standard" mode delay before retry number ``attempt`` (1, 2, ...)."""
    return random.random() * min(_MAX_BACKOFF, 2.0 ** (attempt - 1))


@attrs.frozen
class Answer:
    """An HTTP answer: status, lower-cased headers, body."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


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
        self._region = region
        self._credentials = credentials
        self._events = events
        self._attempts = max(1, max_attempts)
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._keys: dict[tuple[str, str], bytes] = {}
        self._keys_lock = threading.Lock()
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
        self, key: str, body: bytes, headers: dict[str, str], deadline: float | None = None
    ) -> Answer:
        headers = {"content-type": "application/json", **headers}
        return self._send(
            _Request("PutObject", "PUT", self._key_path(key), (), headers, body), deadline
        )

    def get(self, key: str) -> Answer:
        return self._send(_Request("GetObject", "GET", self._key_path(key), (), {}, b""))

    def head(self, key: str) -> Answer:
        return self._send(_Request("HeadObject", "HEAD", self._key_path(key), (), {}, b""))

    def delete(
        self, key: str, headers: dict[str, str], deadline: float | None = None
    ) -> Answer:
        return self._send(
            _Request("DeleteObject", "DELETE", self._key_path(key), (), headers, b""), deadline
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

    def _send(self, req: _Request, deadline: float | None = None) -> Answer:
        """Attempts until an answer that is not worth retrying; with a ``deadline``
        (monotonic), none is sent after it, each waits at most until it, and a backoff
        that would end past it gives up at once (WireDeadline)."""
        attempt = 0
        while True:
            attempt += 1
            timeout = None
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
            if deadline is not None and time.monotonic() + delay >= deadline:
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

    # -- SigV4 -----------------------------------------------------------------------

    def _sign(self, req: _Request, query: str) -> dict[str, str]:
        creds = self._credentials.get_frozen_credentials()
        now = datetime.now(timezone.utc)
        amz_date = now.strftime("%Y%m%dT%H%M%SZ")
        day = amz_date[:8]
        payload = hashlib.sha256(req.body).hexdigest()
        headers = {
            **req.headers,
            "host": self._host,
            "x-amz-content-sha256": payload,
            "x-amz-date": amz_date,
        }
        if creds.token:
            headers["x-amz-security-token"] = creds.token
        names = sorted(headers)
        canonical = "\n".join(
            [req.method, req.path, query, *(f"{n}:{headers[n].strip()}" for n in names), "",
             ";".join(names), payload]
        )
        scope = f"{day}/{self._region}/s3/aws4_request"
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256", amz_date, scope,
             hashlib.sha256(canonical.encode("utf-8")).hexdigest()]
        )
        key = self._signing_key(creds.secret_key, day)
        signature = hmac.new(key, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
        headers["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={creds.access_key}/{scope}, "
            f"SignedHeaders={';'.join(names)}, Signature={signature}"
        )
        return headers  # with "host": urllib3 then sends exactly the one signed

    def _signing_key(self, secret: str, day: str) -> bytes:
        cache_key = (hashlib.sha256(secret.encode("utf-8")).hexdigest(), day)
        key = self._keys.get(cache_key)
        if key is None:
            key = hmac.new(("AWS4" + secret).encode("utf-8"), day.encode(), hashlib.sha256).digest()
            for part in (self._region, "s3", "aws4_request"):
                key = hmac.new(key, part.encode("utf-8"), hashlib.sha256).digest()
            with self._keys_lock:
                if len(self._keys) > 8:
                    self._keys.clear()
                self._keys[cache_key] = key
        return key


@attrs.frozen
class _Status:
    """What ``after-send`` handlers get as ``http_response``: the status code."""

    status_code: int


def _q(text: str) -> str:
    return quote(text, safe=_UNRESERVED)


def retryable(status: int, answer: Answer | None = None, code: str = "") -> bool:
    """Whether botocore's "standard" retry mode retries an answer: by its status, or
    the error code of its body (``answer``) or given (``code``)."""
    if status in _RETRY_STATUS:
        return True
    if status >= 400 and answer is not None and answer.body:
        code = error_of(answer)[0]
    return code in _RETRY_CODES


# -- reading answers ----------------------------------------------------------------------


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _xml(body: bytes) -> ET.Element | None:
    try:
        return ET.fromstring(body)
    except ET.ParseError:
        return None


def error_of(answer: Answer) -> tuple[str, str]:
    """(code, message) of an error answer; the status when the body says nothing
    (HEAD answers have no body)."""
    root = _xml(answer.body) if answer.body else None
    code = message = ""
    if root is not None:
        for child in root:
            name = _local(child.tag)
            if name == "Code":
                code = child.text or ""
            elif name == "Message":
                message = child.text or ""
    return code or str(answer.status), message


@attrs.frozen
class Page:
    """One ListObjectsV2 page: (key, etag, size, last modified) rows, common prefixes,
    the continuation token when more remain."""

    rows: list[tuple[str, str, int, Any]]
    prefixes: list[str]
    token: str | None


_ROW_TAGS = tuple((f"<{n}>", f"</{n}>") for n in ("Key", "ETag", "Size", "LastModified"))


def _element(text: str, tags: tuple[str, str]) -> str | None:
    """The text of the first ``<Name>...</Name>`` in ``text``; None if absent or not
    plain text (a nested element or an unclosed tag)."""
    opening, closing = tags
    start = text.find(opening)
    if start < 0:
        return None
    start += len(opening)
    end = text.find(closing, start)
    if end < 0 or "<" in text[start:end]:
        return None
    return text[start:end]


def list_page(body: bytes) -> Page:
    """Parse a ListObjectsV2 answer sent with ``encoding-type=url``.

    The plain answers S3 servers send are scanned with regular expressions (a third of
    ElementTree's CPU: listings are what a poll parses most); anything unusual (CDATA,
    comments, namespace prefixes, a count that does not add up) goes to ElementTree."""
    page = _scan_list(body)
    if page is None:
        page = _parse_list(body)
    rows, prefixes, token, encoded = page
    if encoded:
        rows = [(_decoded(k), e, s, m) for k, e, s, m in rows]
        prefixes = [_decoded(p) for p in prefixes]
    return Page(rows, prefixes, token)


def _decoded(value: str) -> str:
    """A url-encoded key or prefix, decoded as botocore does (a space arrives as "+")."""
    return unquote_plus(value) if "%" in value or "+" in value else value


_Parsed = tuple[list[tuple[str, str, int, Any]], list[str], "str | None", bool]


def _scan_list(body: bytes) -> _Parsed | None:
    """The fast reading of :func:`list_page`; None where it cannot be sure."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if "<!" in text or "<ListBucketResult" not in text or ":Contents" in text:
        return None
    head, *blocks = text.split("<Contents>")
    rest = [head]
    rows: list[tuple[str, str, int, Any]] = []
    for chunk in blocks:
        block, found, tail = chunk.partition("</Contents>")
        key = _element(block, _ROW_TAGS[0])
        if not found or key is None:
            return None
        etag, size, modified = (_element(block, tags) for tags in _ROW_TAGS[1:])
        rows.append((_text(key), _text(etag or ""), int(size or 0), modified or ""))
        rest.append(tail)
    top = "".join(rest)
    prefixes: list[str] = []
    head, *blocks = top.split("<CommonPrefixes>")
    rest = [head]
    for chunk in blocks:
        block, found, tail = chunk.partition("</CommonPrefixes>")
        prefix = _element(block, ("<Prefix>", "</Prefix>"))
        if not found or prefix is None:
            return None
        prefixes.append(_text(prefix))
        rest.append(tail)
    top = "".join(rest)
    truncated = (_element(top, _IS_TRUNCATED) or "").strip().lower() == "true"
    token = _element(top, _NEXT_TOKEN)
    encoded = (_element(top, _ENCODING) or "").strip().lower() == "url"
    return rows, prefixes, (_text(token) if truncated and token else None), encoded


_IS_TRUNCATED = ("<IsTruncated>", "</IsTruncated>")
_NEXT_TOKEN = ("<NextContinuationToken>", "</NextContinuationToken>")
_ENCODING = ("<EncodingType>", "</EncodingType>")


def _text(value: str) -> str:
    """XML character data: the predefined entities and character references (quoted
    ETags are the common case: a replace or two; SeaweedFS writes the quote as &#34;)."""
    if "&" not in value:
        return value
    plain = value.replace("&quot;", '"').replace("&#34;", '"')
    return html.unescape(value) if "&" in plain else plain


def _parse_list(body: bytes) -> _Parsed:
    """ElementTree's reading of :func:`list_page`."""
    root = _xml(body)
    if root is None:
        raise ValueError("unreadable ListObjectsV2 answer")
    rows: list[tuple[str, str, int, Any]] = []
    prefixes: list[str] = []
    token: str | None = None
    truncated = False
    encoded = False
    for child in root:
        name = _local(child.tag)
        if name == "Contents":
            fields = {_local(f.tag): f.text or "" for f in child}
            rows.append(
                (fields.get("Key", ""), fields.get("ETag", ""), int(fields.get("Size") or 0),
                 fields.get("LastModified", ""))
            )
        elif name == "CommonPrefixes":
            prefixes.extend(f.text or "" for f in child if _local(f.tag) == "Prefix")
        elif name == "NextContinuationToken":
            token = child.text
        elif name == "IsTruncated":
            truncated = (child.text or "").strip().lower() == "true"
        elif name == "EncodingType":
            encoded = (child.text or "").strip().lower() == "url"
    return rows, prefixes, (token if truncated else None), encoded


def delete_errors(body: bytes) -> list[tuple[str, str]]:
    """(key, code) of every failure a DeleteObjects answer lists."""
    root = _xml(body)
    if root is None:
        raise ValueError("unreadable DeleteObjects answer")
    out: list[tuple[str, str]] = []
    for child in root:
        if _local(child.tag) == "Error":
            fields = {_local(f.tag): f.text or "" for f in child}
            out.append((fields.get("Key", ""), fields.get("Code", "")))
    return out
