"""botocore's "standard" retry mode, as the fast path (:mod:`.wire`) and the deadlines
of boto3 calls (:mod:`.boto`) apply it: which answers are retried, and the backoff.

Why not botocore's own ``botocore.retries.standard``: its ``RetryPolicy`` decides on a
``RetryContext`` built from botocore's parsed response and operation model (the fast
path has neither), its quota is per-client state the fast path would have to share
with boto3's, and its backoff depends on the release (1.44 scales the wait of a
non-throttling error by 50 ms and honours ``x-amz-retry-after``, earlier releases wait
up to 1 s, 2 s, 4 s, ... for any error). Reusing it would change how long a request
waits before its next attempt, so the rules stay here, in one place: the error codes
are botocore's transient and throttling ones (and S3's ``InternalError``)."""

from __future__ import annotations

import random

from .answers import Answer, error_of

__all__ = ["backoff", "retryable", "transient_failure"]

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


def backoff(attempt: int) -> float:
    """The delay before retry number ``attempt`` (1, 2, ...): full jitter, doubling,
    at most 20 s."""
    return random.random() * min(_MAX_BACKOFF, 2.0 ** (attempt - 1))


def transient_failure(status: str, code: str) -> bool:
    """Whether an error answer that outlasted every retry is an outage that may pass
    (a retried status or code: 5xx, 429, throttling, SlowDown), not a refusal."""
    return (status.isdigit() and int(status) in _RETRY_STATUS) or code in _RETRY_CODES


def retryable(status: int, answer: Answer | None = None, code: str = "") -> bool:
    """Whether an answer is retried: by its status, or the error code of its body
    (``answer``) or given (``code``)."""
    if status in _RETRY_STATUS:
        return True
    if status >= 400 and answer is not None and answer.body:
        code = error_of(answer)[0]
    return code in _RETRY_CODES
