"""The segment format of packed topics: many messages in one object (version 1).

UTF-8 JSON lines, each ended by ``\\n``: a header line, then one line per message in
publish order, each canonical JSON (sorted keys, compact, as
:func:`~pawn_queue_sync.encoding.canonical_json`)::

    {"count":2,"created_at":"...","format":"pawn-queue-sync/segment","producer_id":"...","segment_id":"<uuid>","topic":"t","version":1}
    {"created_at":"...","id":"<uuid>","payload":{"n":1},"producer_id":"..."}
    {"created_at":"...","id":"<uuid>","payload":"two","producer_id":"..."}

JSON escapes every control character inside strings, so a ``\\n`` byte only ever ends a
line (U+2028/U+2029 stay as they are: split on ``\\n`` bytes, never ``splitlines``).
docs/architecture.md describes the format byte by byte. Base layer: imports only
errors and encoding.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from .encoding import canonical_json
from .errors import PayloadError, SegmentError

__all__ = [
    "SEGMENT_FORMAT",
    "SEGMENT_VERSION",
    "decode_segment",
    "encode_line",
    "encode_lines",
    "encode_segment",
]

SEGMENT_FORMAT = "pawn-queue-sync/segment"
SEGMENT_VERSION = 1

_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_dumps = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
).encode


def encode_line(
    message_id: str, producer_id: str | None, created_at: str, payload: Any
) -> bytes:
    """One message's line (no trailing newline): the canonical JSON of its ``created_at``,
    ``id``, ``payload`` and ``producer_id``. Raises PayloadError if the payload is not
    JSON-serialisable. The payload is encoded once, by the C encoder; the rest is spliced
    around it in sorted key order (the same bytes as ``canonical_json`` of the dict)."""
    return (
        f'{{"created_at":{_dumps(created_at)},"id":{_dumps(message_id)},'
        f'"payload":{_payload_json(payload)},"producer_id":{_dumps(producer_id)}}}'
    ).encode()


def _payload_json(payload: Any) -> str:
    try:
        return _dumps(payload)
    except (TypeError, ValueError, RecursionError) as exc:
        raise PayloadError(f"payload is not JSON-serialisable: {exc}") from None


def encode_lines(
    message_ids: Sequence[str],
    producer_id: str | None,
    created_at: str,
    payloads: Sequence[Any],
    max_bytes: int,
) -> list[bytes]:
    """:func:`encode_line` for many messages of one producer and one time, fast: each
    payload is encoded once and spliced between fixed bytes with its id (a canonical
    UUID string, so no JSON escaping is needed; not checked). Raises PayloadError
    naming the first payload (``payload #i``) that is not JSON or whose line is over
    ``max_bytes`` (``publishing.max_payload_bytes``)."""
    head = f'{{"created_at":{_dumps(created_at)},"id":"'
    tail = f',"producer_id":{_dumps(producer_id)}}}'
    lines: list[bytes] = []
    append = lines.append
    dumps = _dumps
    for index, (message_id, payload) in enumerate(zip(message_ids, payloads, strict=True)):
        try:
            body = dumps(payload)
        except (TypeError, ValueError, RecursionError) as exc:
            raise PayloadError(
                f"payload #{index}: payload is not JSON-serialisable: {exc}"
            ) from None
        line = f'{head}{message_id}","payload":{body}{tail}'.encode()
        if len(line) > max_bytes:
            raise PayloadError(f"payload #{index}: {too_large(len(line), max_bytes)}")
        append(line)
    return lines


def too_large(size: int, limit: int) -> str:
    """What PayloadError says of a message over the limit."""
    return (
        f"message is {size} bytes encoded; the limit is {limit} "
        "(publishing.max_payload_bytes)"
    )


def encode_header(
    topic: str, segment_id: str, producer_id: str | None, created_at: str, count: int
) -> bytes:
    """The header line of a segment of ``count`` messages (no trailing newline)."""
    return canonical_json(
        {
            "count": count,
            "created_at": created_at,
            "format": SEGMENT_FORMAT,
            "producer_id": producer_id,
            "segment_id": segment_id,
            "topic": topic,
            "version": SEGMENT_VERSION,
        }
    )


def encode_segment(
    topic: str,
    segment_id: str,
    producer_id: str | None,
    created_at: str,
    lines: Sequence[bytes],
) -> bytes:
    """A whole segment: the header, then ``lines`` (from :func:`encode_line`) in order."""
    header = encode_header(topic, segment_id, producer_id, created_at, len(lines))
    return b"\n".join([header, *lines, b""])


def decode_segment(raw: bytes, topic: str, segment_id: str) -> list[dict[str, Any]]:
    """The messages of a segment, in publish order: dicts with ``id``, ``producer_id``,
    ``created_at`` and ``payload``. ``topic`` and ``segment_id`` are what its key says;
    raises SegmentError naming the problem if anything does not hold."""
    where = f"segment {segment_id!r} of topic {topic!r}"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SegmentError(f"{where} is not UTF-8: {exc}") from None
    if not text.endswith("\n"):
        raise SegmentError(f"{where} is truncated: it does not end with a newline")
    lines = text[:-1].split("\n")
    header = _parse(lines[0], where, "header")
    _check_header(header, where, topic, segment_id, len(lines) - 1)
    # One C call for all the messages; line by line to name what is wrong (or when a
    # line held two values, "{..},{..}", and the array came out longer).
    try:
        docs = json.loads("[" + ",".join(lines[1:]) + "]")
    except (ValueError, RecursionError):
        docs = None
    if docs is None or len(docs) != len(lines) - 1:
        docs = [_parse(line, where, f"line {n}") for n, line in enumerate(lines[1:], 2)]
    seen: set[str] = set()
    for n, doc in enumerate(docs, 2):
        _check_message(doc, where, n)
        if doc["id"] in seen:
            raise SegmentError(f"{where}: line {n} repeats message id {doc['id']!r}")
        seen.add(doc["id"])
    return docs  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- checks


def _parse(line: str, where: str, what: str) -> Any:
    try:
        return json.loads(line)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise SegmentError(f"{where}: {what} is not JSON: {exc}") from None


def _check_header(
    header: Any, where: str, topic: str, segment_id: str, lines: int
) -> None:
    if not isinstance(header, dict):
        raise SegmentError(f"{where}: the header is not a JSON object")
    fmt = header.get("format")
    if fmt != SEGMENT_FORMAT:
        raise SegmentError(f"{where}: unknown format {fmt!r} (expected {SEGMENT_FORMAT!r})")
    version = header.get("version")
    if version != SEGMENT_VERSION or isinstance(version, bool):
        raise SegmentError(
            f"{where}: unknown format version {version!r} of {SEGMENT_FORMAT!r} "
            f"(this library reads version {SEGMENT_VERSION})"
        )
    if header.get("topic") != topic:
        raise SegmentError(f"{where}: the header names topic {header.get('topic')!r}")
    if header.get("segment_id") != segment_id:
        raise SegmentError(
            f"{where}: the header names segment {header.get('segment_id')!r}"
        )
    count = header.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise SegmentError(f"{where}: the header's count {count!r} is not a positive integer")
    if count != lines:
        raise SegmentError(
            f"{where}: the header counts {count} messages but the segment has {lines} lines "
            "after it"
        )


def _check_message(doc: Any, where: str, n: int) -> None:
    if not isinstance(doc, dict):
        raise SegmentError(f"{where}: line {n} is not a JSON object")
    missing = [k for k in ("id", "producer_id", "created_at", "payload") if k not in doc]
    if missing:
        raise SegmentError(f"{where}: line {n} lacks {', '.join(missing)}")
    mid = doc["id"]
    if not isinstance(mid, str) or not _UUID_RE.fullmatch(mid):
        raise SegmentError(f"{where}: line {n} has an id that is not a UUID: {mid!r:.80}")
    if not isinstance(doc["created_at"], str):
        raise SegmentError(f"{where}: line {n} has a created_at that is not a string")
    producer = doc["producer_id"]
    if producer is not None and not isinstance(producer, str):
        raise SegmentError(f"{where}: line {n} has a producer_id that is not a string")
