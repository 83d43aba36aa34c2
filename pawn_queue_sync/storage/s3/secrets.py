"""Secret masking for the S3 store, in one place: the credentials the store uses and
the ``user:password@`` of any URL are masked in error texts (:func:`mask`) and in the
log records of botocore, boto3, urllib3 and s3transfer (:data:`SECRET_FILTER`).
Endpoint userinfo is masked by :func:`pawn_queue_sync.config.redact_endpoint`, which
reprs and ``describe()`` use too."""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable

from ...config import redact_endpoint

__all__ = ["SECRET_FILTER", "mask"]


#: what a signed request shows of its credentials, whatever they are (credentials that
#: refresh change after the client was built): the value of a session-token header or
#: query parameter (as botocore logs it: ``x-amz-security-token:T``, ``'X-Amz-Security-
#: Token': b'T'``, ``X-Amz-Security-Token=T``) and the access key of a SigV4
#: ``Credential=KEY/...`` (``X-Amz-Credential=KEY%2F...`` in a presigned URL)
_SIGNED = re.compile(
    r"(?i)(x-amz-security-token['\"]?\s*[:=]\s*b?['\"]?)[^'\"\s&,]+"
    r"|(credential=)[^/%'\"\s,&]+"
)


def _mask_value(match: re.Match[str]) -> str:
    """A match of :data:`_SIGNED` or :data:`_ISSUED`: its name part kept, the value
    masked."""
    return (match.group(1) or match.group(2)) + "***"


#: credentials in the answer of a refresh, as botocore logs a response body at DEBUG:
#: STS's XML (``<SecretAccessKey>S</SecretAccessKey>``) and the JSON of SSO, the
#: container and instance metadata endpoints (``"secretAccessKey": "S"``,
#: ``"SecretAccessKey" : "S"``, ``"Token"``), in bytes reprs too
_ISSUED = re.compile(
    r"(?i)(<(?:AccessKeyId|SecretAccessKey|SessionToken)>)[^<]+"
    r"|((?:\\?['\"])(?:accessKeyId|secretAccessKey|sessionToken|Token)(?:\\?['\"])"
    r"\s*:\s*(?:\\?['\"]))[^'\"\\]+"
)
_ISSUED_HINTS = ("accesskeyid", "secretaccesskey", "sessiontoken", "token")


def mask(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with the userinfo of URLs and every secret masked (``***``), also in
    the escaped and trimmed forms error texts quote them in (botocore shows a bad
    header as bytes: a key read from a file with its newline appears as ``KEY\\n``);
    a form other than the secret itself only when 8 characters or longer. The session
    token and access key of a signed request are masked whatever they are."""
    if "@" in text:
        text = redact_endpoint(text)
    lowered = text.lower()
    if "credential=" in lowered or "x-amz-security-token" in lowered:
        text = _SIGNED.sub(_mask_value, text)
    if any(hint in lowered for hint in _ISSUED_HINTS):
        text = _ISSUED.sub(_mask_value, text)
    forms: set[str] = set()
    for secret in secrets:
        if not secret:
            continue
        forms.add(secret)
        for form in (secret.strip(), repr(secret)[1:-1], repr(secret.encode("utf-8"))[2:-1]):
            if len(form) >= 8:
                forms.add(form)
    if any(form in text for form in forms):
        for form in sorted(forms, key=len, reverse=True):
            text = text.replace(form, "***")
    return text


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

    #: whose loggers are covered: a filter acts only on its own logger's records, so
    #: every logger of these packages that exists when a client is built gets it
    PACKAGES = ("botocore", "boto3", "urllib3", "s3transfer")

    def __init__(self) -> None:
        super().__init__()
        self._secrets: frozenset[str] = frozenset()
        self._lock = threading.Lock()

    def secrets(self) -> frozenset[str]:
        """Every secret added so far (of every store of this process)."""
        return self._secrets

    def add(self, *secrets: str | None) -> None:
        """Mask these too (a no-op for ones already known: cheap enough per request)."""
        if not {s for s in secrets if s} - self._secrets:
            return
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
        text = mask(original, self._secrets)
        if text != original:
            record.msg, record.args = text, None
        if record.exc_info and not record.exc_text:
            # botocore logs connection errors with their traceback, whose text quotes
            # the URL: formatted here once, masked, and kept where handlers look first
            record.exc_text = mask(_FORMATTER.formatException(record.exc_info), self._secrets)
        if record.stack_info:
            record.stack_info = mask(record.stack_info, self._secrets)
        return True


_FORMATTER = logging.Formatter()

#: The one filter of this process, on the loggers of the packages S3 requests go through.
SECRET_FILTER = _RedactSecrets()


def _after_fork_in_child() -> None:
    """A lock another thread of the parent held at the fork would never be released."""
    SECRET_FILTER._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
