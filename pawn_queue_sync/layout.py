"""The bucket layout shared with pawn-queue 0.1.3, and the JSON encoding of objects.

::

    {topic}/.topic                               topic marker
    {topic}/messages/{YYYYMMDDTHHMMSS_ffffff}-{uuid}.json   pending message
    {topic}/leases/{uuid}.lease                  lease on a message
    {topic}/dead-letter/{uuid}.json              dead-lettered message
    {topic}/.packed                              manifest: the topic is packed
    {topic}/segments/{YYYYMMDDTHHMMSS_ffffff}-{segment_uuid}-n{count}.seg   a segment
    {topic}/segment-leases/{segment_uuid}.lease  lease on a segment (progress inside)
    {topic}/delayed/{YYYYMMDDTHHMMSS_ffffff}-{uuid}-d{delay_ms}.json   a delayed message
    {topic}/delayed.lock                         promotion lock: one promoter at a time
    {topic}/dedup/{sha256 of the dedup id}.json  deduplication marker
    _registry/{producers|consumers}/{uuid}.json  registrations
    _probe/{uuid}.probe                          capability probe (always removed)
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timezone
from typing import NamedTuple

from .encoding import canonical_json, iso, md5_hex  # noqa: F401  (part of the layout API)
from .errors import InvalidTopicName

TOPIC_MARKER = ".topic"
MESSAGES = "messages"
LEASES = "leases"
DEAD_LETTER = "dead-letter"
REGISTRY_PREFIX = "_registry/"
PROBE_PREFIX = "_probe/"
PACKED_MANIFEST = ".packed"
SEGMENTS = "segments"
SEGMENT_LEASES = "segment-leases"
DELAYED = "delayed"
DEDUP = "dedup"

_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")
_TS_ID = (
    r"(?P<ts>\d{8}T\d{6}_\d{6})-(?P<id>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
)
_MESSAGE_NAME_RE = re.compile(_TS_ID + r"\.json")
_SEGMENT_NAME_RE = re.compile(_TS_ID + r"-n(?P<count>[1-9]\d{0,8})\.seg")
_DELAYED_NAME_RE = re.compile(_TS_ID + r"-d(?P<delay>[1-9]\d{0,12})\.json")


def validate_topic(topic: object) -> str:
    """Return ``topic`` if it is a safe topic name, else raise InvalidTopicName.

    1-128 characters of ``[A-Za-z0-9._-]``, not starting with ``_`` or ``.`` (reserved
    for the registry, probes and markers), and no ``..``.
    """
    if not isinstance(topic, str):
        raise InvalidTopicName(topic, "must be a string")
    if not _TOPIC_RE.fullmatch(topic):
        raise InvalidTopicName(topic, "use 1-128 characters of A-Z a-z 0-9 . _ -")
    if topic[0] in "_.":
        raise InvalidTopicName(topic, "must not start with '_' or '.'")
    if ".." in topic:
        raise InvalidTopicName(topic, "must not contain '..'")
    return topic


def topic_marker_key(topic: str) -> str:
    return f"{topic}/{TOPIC_MARKER}"


def messages_prefix(topic: str) -> str:
    return f"{topic}/{MESSAGES}/"


def leases_prefix(topic: str) -> str:
    return f"{topic}/{LEASES}/"


def dead_letter_prefix(topic: str) -> str:
    return f"{topic}/{DEAD_LETTER}/"


def sortable_timestamp(when: datetime) -> str:
    """``YYYYMMDDTHHMMSS_ffffff`` in UTC: keys sort in publish order."""
    when = when.astimezone(timezone.utc)
    return when.strftime("%Y%m%dT%H%M%S_") + f"{when.microsecond:06d}"


def parse_sortable_timestamp(ts: str) -> datetime:
    """``YYYYMMDDTHHMMSS_ffffff`` -> a UTC datetime (ValueError if it is not one)."""
    return datetime.strptime(ts, "%Y%m%dT%H%M%S_%f").replace(tzinfo=timezone.utc)


def message_key(topic: str, ts: str, message_id: str) -> str:
    return f"{topic}/{MESSAGES}/{ts}-{message_id}.json"


def lease_key(topic: str, message_id: str) -> str:
    return f"{topic}/{LEASES}/{message_id}.lease"


def dead_letter_key(topic: str, message_id: str) -> str:
    return f"{topic}/{DEAD_LETTER}/{message_id}.json"


def registry_key(role: str, entity_id: str) -> str:
    return f"{REGISTRY_PREFIX}{role}/{entity_id}.json"


def probe_key() -> str:
    return f"{PROBE_PREFIX}{uuid.uuid4()}.probe"


def parse_message_key(topic: str, key: str) -> str | None:
    """The message id of a well-formed message key, or None for a foreign object."""
    prefix = messages_prefix(topic)
    if not key.startswith(prefix):
        return None
    match = _MESSAGE_NAME_RE.fullmatch(key[len(prefix) :])
    return match.group("id") if match else None


def message_key_parts(topic: str, key: str) -> tuple[str, str] | None:
    """(timestamp, message id) of a well-formed message key, or None."""
    prefix = messages_prefix(topic)
    if not key.startswith(prefix):
        return None
    match = _MESSAGE_NAME_RE.fullmatch(key[len(prefix) :])
    return (match.group("ts"), match.group("id")) if match else None


def lease_message_id(topic: str, key: str) -> str | None:
    """The message id a lease key refers to, or None for a foreign object."""
    return _lease_name(leases_prefix(topic), key)


def _lease_name(prefix: str, key: str) -> str | None:
    """``{prefix}{name}.lease`` -> name (one non-empty path segment), else None."""
    if not key.startswith(prefix) or not key.endswith(".lease"):
        return None
    name = key[len(prefix) : -len(".lease")]
    return name if name and "/" not in name else None


# --------------------------------------------------------------------------- packed topics
# pawn-queue 0.1.x lists only messages/ and leases/: it never sees segments nor their
# leases (so its janitor cannot delete a segment lease and lose its recorded progress).


def packed_manifest_key(topic: str) -> str:
    return f"{topic}/{PACKED_MANIFEST}"


def segments_prefix(topic: str) -> str:
    return f"{topic}/{SEGMENTS}/"


def segment_leases_prefix(topic: str) -> str:
    return f"{topic}/{SEGMENT_LEASES}/"


def segment_key(topic: str, ts: str, segment_id: str, count: int) -> str:
    """A segment's key: sorts by age like messages; the message count is in the name so
    ``topics --stats`` counts messages without reading segments."""
    return f"{topic}/{SEGMENTS}/{ts}-{segment_id}-n{count}.seg"


def parse_segment_key(topic: str, key: str) -> tuple[str, int] | None:
    """(segment id, message count) of a well-formed segment key, or None for a foreign
    object."""
    prefix = segments_prefix(topic)
    if not key.startswith(prefix):
        return None
    match = _SEGMENT_NAME_RE.fullmatch(key[len(prefix) :])
    return (match.group("id"), int(match.group("count"))) if match else None


def segment_lease_key(topic: str, segment_id: str) -> str:
    return f"{topic}/{SEGMENT_LEASES}/{segment_id}.lease"


def segment_lease_id(topic: str, key: str) -> str | None:
    """The segment id a segment lease key refers to, or None for a foreign object."""
    return _lease_name(segment_leases_prefix(topic), key)


# --------------------------------------------------------------------------- delays, dedup
# pawn-queue 0.1.x never lists delayed/ nor dedup/: a delayed message is invisible to its
# consumers until it is moved to messages/ (queue/delayed.py).


def delayed_prefix(topic: str) -> str:
    return f"{topic}/{DELAYED}/"


def dedup_prefix(topic: str) -> str:
    return f"{topic}/{DEDUP}/"


class DelayedName(NamedTuple):
    """What a delayed message's key says: when it is due by its publisher's clock (the
    key's order only), its message id, and its delay in milliseconds (counted from the
    object's LastModified, by the server's clock: queue/delayed.py)."""

    due_ts: str
    message_id: str
    delay_ms: int


def delayed_lock_key(topic: str) -> str:
    """The lock a promoter holds while it moves a topic's due delayed messages (beside
    ``delayed/``, so listings of delayed messages never count it)."""
    return f"{topic}/{DELAYED}.lock"


def delayed_key(topic: str, due_ts: str, message_id: str, delay_ms: int) -> str:
    return f"{topic}/{DELAYED}/{due_ts}-{message_id}-d{delay_ms}.json"


def parse_delayed_key(topic: str, key: str) -> DelayedName | None:
    """The :class:`DelayedName` of a well-formed delayed key (its time a real date), or
    None for a foreign object."""
    prefix = delayed_prefix(topic)
    if not key.startswith(prefix):
        return None
    match = _DELAYED_NAME_RE.fullmatch(key[len(prefix) :])
    if match is None:
        return None
    try:
        parse_sortable_timestamp(match.group("ts"))
    except ValueError:  # digits of no date (a month 13)
        return None
    return DelayedName(match.group("ts"), match.group("id"), int(match.group("delay")))
