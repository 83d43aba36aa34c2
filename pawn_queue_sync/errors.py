"""One exception hierarchy for the whole library, rooted at :class:`PawnQueueError`.

Errors from boto3, the file system or the network are translated at the storage
boundary into :class:`StorageError` subclasses; nothing else escapes. Messages never
contain credentials.
"""

from __future__ import annotations

__all__ = [
    "NotStartedError",
    "PawnQueueError",
    "ConfigError",
    "TopicNotFoundError",
    "InvalidTopicName",
    "PayloadError",
    "PublishError",
    "SegmentError",
    "RegistrationError",
    "StorageError",
    "ObjectNotFound",
    "ConditionFailed",
    "StoreUnavailable",
    "StoreClosed",
    "DeadlineExceeded",
    "StoreFull",
    "StoreNotPortable",
    "CaseCollision",
    "PlatformNotSupported",
    "ProbeError",
    "LeaseLostError",
    "LeaseConflictError",
    "InvalidArgument",
    "TopicNotEmptyError",
    "MissingExtra",
]


class PawnQueueError(Exception):
    """Root of every exception this library raises on purpose."""


class ConfigError(PawnQueueError, ValueError):
    """A configuration value is missing or invalid; the message names the field."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        super().__init__(f"{field}: {problem}")


class NotStartedError(PawnQueueError, RuntimeError):
    """The queue was used before ``setup()`` (or after ``teardown()``)."""


class TopicNotFoundError(PawnQueueError, LookupError):
    """The topic has no marker object: create it first with ``create_topic``."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        super().__init__(f"topic {topic!r} does not exist; call create_topic({topic!r}) first")


class InvalidTopicName(PawnQueueError, ValueError):
    """A topic name that could escape its prefix or confuse listings."""

    def __init__(self, topic: object, reason: str) -> None:
        self.topic = topic
        super().__init__(f"invalid topic name {topic!r}: {reason}")


class InvalidArgument(PawnQueueError, ValueError):
    """An argument out of its range (a rate of 0, a ``max`` below 1, an unknown
    section, ...): raised before anything in the store changes."""


class TopicNotEmptyError(PawnQueueError):
    """``delete_topic`` refused: the topic still holds messages, segments, dead letters
    or live leases (``what`` says which); ``force=True`` deletes them too."""

    def __init__(self, topic: str, what: str) -> None:
        self.topic = topic
        self.what = what
        super().__init__(f"topic {topic!r} is not empty ({what}); delete_topic(..., "
                         "force=True) deletes it with everything in it")


class PayloadError(PawnQueueError, ValueError):
    """A payload that cannot be published: not JSON-serialisable, or too large."""


class PublishError(PawnQueueError):
    """A message could not be written; nothing was published for it."""


class SegmentError(PawnQueueError, ValueError):
    """A segment (or a segment lease) that cannot be read: not UTF-8 or JSON, an unknown
    format or version, not the segment its key names, a wrong count, a duplicate id, a
    missing field. The message names the problem; a consumer quarantines such a segment."""


class RegistrationError(PawnQueueError):
    """A producer or consumer could not be registered."""

    #: True when the store failed with an outage (``StorageError.transient``)
    transient: bool = False


class StorageError(PawnQueueError):
    """The object store failed or answered something unusable.

    ``key`` names the object concerned, when there is one; the message describes the
    underlying error briefly and never contains credentials. ``transient`` is True when
    the store did not answer (connection refused or reset, timeouts) or answered a
    server error (5xx, SlowDown) after every retry: an outage that may pass, unlike a
    missing bucket or refused credentials (a worker pool restarts a child that meets
    the first until the store is back, and gives up on the second).
    """

    #: the default of the class (an outage that may pass, or not); see the docstring
    transient: bool = False

    def __init__(
        self, message: str, *, key: str | None = None, transient: bool | None = None
    ) -> None:
        self.key = key
        if transient is not None:
            self.transient = transient
        super().__init__(message if key is None else f"{message} (key={key!r})")


class ObjectNotFound(StorageError, KeyError):
    """The key does not exist."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return Exception.__str__(self)


class ConditionFailed(StorageError):
    """A conditional request (If-None-Match / If-Match) did not hold."""


class StoreUnavailable(StorageError):
    """The store could not be reached or refused our credentials."""


class StoreFull(StorageError):
    """The local store's disk (or the user's quota) is full: writes fail, while reads,
    listings and deletes go on working, so acking what is held frees space."""


class CaseCollision(StorageError):
    """On a case-insensitive file system, a key names a directory that exists with
    other letter case (topics ``Orders`` and ``orders`` would share one directory)."""


class PlatformNotSupported(StorageError, ImportError):
    """The local store needs POSIX file locks (``fcntl``): not available on Windows."""


class StoreClosed(StorageError, NotStartedError):
    """The store was used after ``close()``: it opens no connection again. (Also a
    :class:`NotStartedError`: the same mistake as using a queue after teardown.)"""


class MissingExtra(PawnQueueError, ImportError):
    """A feature needs an optional dependency that is not installed; the message names
    the extra to install (e.g. ``pip install 'pawn-queue-sync[metrics]'``)."""


class StoreNotPortable(PawnQueueError, TypeError):
    """An S3 store built from a caller's boto3 session or client was pickled, or one
    built from a caller's client was used in a forked child: neither can carry that
    object across. Build the store where it is used (from settings, or a session)."""


class DeadlineExceeded(StorageError):
    """A request's deadline passed before it got an answer: no attempt was sent after
    the deadline, but one sent before it may still have been applied by the server.
    Also raised when a retry was not sent because it would leave after the request's
    ``retry_by`` (a csprng_verify lease write or delete relying on a check: see
    docs/guarantees.md); e.g. by ``Message.refresh()`` on a server without If-Match,
    when the refresh did not land and the lease is still ours, unrefreshed."""

    transient = True


class ProbeError(StorageError):
    """The capability probe at setup could not decide; never silently ignored."""


class LeaseConflictError(PawnQueueError):
    """Another consumer holds the lease for this message."""

    def __init__(self, message_id: str) -> None:
        self.message_id = message_id
        super().__init__(f"message {message_id!r} is leased by another consumer")


class LeaseLostError(PawnQueueError):
    """Our lease expired and was taken, or was removed: we must not act on the message."""

    def __init__(self, message_id: str, detail: str = "") -> None:
        self.message_id = message_id
        text = f"lease on message {message_id!r} is no longer ours"
        super().__init__(f"{text}: {detail}" if detail else text)
