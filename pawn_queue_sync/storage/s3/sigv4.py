"""SigV4 for the fast path (:mod:`.wire`): the Host header to sign, and the
``Authorization`` of one request, with the day's signing key cached.

Credentials are read again for every request (``get_frozen_credentials()``), so
refreshable ones (assumed roles, SSO, instance profiles) are renewed as botocore
renews them, never frozen when the client was built."""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

from .secrets import SECRET_FILTER

__all__ = ["Signer", "host_header"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


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


class Signer:
    """Signs requests to one host and region with (possibly refreshing) credentials
    in botocore's interface. Thread-safe."""

    def __init__(self, *, host: str, region: str, credentials: Any) -> None:
        self._host = host
        self._region = region
        self._credentials = credentials
        self._masked: Any = None  # the credentials last registered with SECRET_FILTER
        self._keys: dict[tuple[str, str], bytes] = {}
        self._keys_lock = threading.Lock()

    def sign(
        self, method: str, path: str, query: str, headers: Mapping[str, str], body: bytes
    ) -> dict[str, str]:
        """The headers to send: ``headers`` with host, payload hash, date, the session
        token if any, and the authorization. ``path`` and ``query`` already encoded."""
        creds = self._credentials.get_frozen_credentials()
        if creds != self._masked:  # refreshed: masked in logs and errors from now on
            SECRET_FILTER.add(creds.access_key, creds.secret_key, creds.token)
            self._masked = creds
        amz_date = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        day = amz_date[:8]
        payload = hashlib.sha256(body).hexdigest()
        signed = {
            **headers,
            "host": self._host,
            "x-amz-content-sha256": payload,
            "x-amz-date": amz_date,
        }
        if creds.token:
            signed["x-amz-security-token"] = creds.token
        names = sorted(signed)
        canonical = "\n".join(
            [method, path, query, *(f"{n}:{signed[n].strip()}" for n in names), "",
             ";".join(names), payload]
        )
        scope = f"{day}/{self._region}/s3/aws4_request"
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256", amz_date, scope,
             hashlib.sha256(canonical.encode("utf-8")).hexdigest()]
        )
        key = self._signing_key(creds.secret_key, day)
        signature = hmac.new(key, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
        signed["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={creds.access_key}/{scope}, "
            f"SignedHeaders={';'.join(names)}, Signature={signature}"
        )
        return signed  # with "host": urllib3 then sends exactly the one signed

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
