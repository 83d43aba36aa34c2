"""The segment format (pawn_queue_sync.packing) and the packed-topic keys (layout)."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pawn_queue_sync import layout
from pawn_queue_sync.encoding import canonical_json
from pawn_queue_sync.errors import PawnQueueError, PayloadError, SegmentError
from pawn_queue_sync.packing import (
    SEGMENT_FORMAT,
    SEGMENT_VERSION,
    decode_segment,
    encode_line,
    encode_lines,
    encode_segment,
)

TOPIC = "orders"
SID = "0b5f6a52-6c1e-4f8e-9c1f-0a5d2b7c9e11"
NOW = "2026-11-26T17:00:00.000001+00:00"

#: any JSON value: text with every code point JSON may carry (newlines, U+2028, astral)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def _segment(payloads: list[Any], producer: str | None = "p-1") -> tuple[bytes, list[str]]:
    ids = [str(uuid.uuid4()) for _ in payloads]
    lines = [encode_line(i, producer, NOW, p) for i, p in zip(ids, payloads, strict=True)]
    return encode_segment(TOPIC, SID, producer, NOW, lines), ids


# --------------------------------------------------------------------------- round trips


@given(payloads=st.lists(json_values, min_size=1, max_size=8), producer=st.none() | st.text())
def test_a_segment_round_trips_in_publish_order(payloads: list[Any], producer: str | None) -> None:
    raw, ids = _segment(payloads, producer)
    docs = decode_segment(raw, TOPIC, SID)
    assert [d["id"] for d in docs] == ids
    assert [d["payload"] for d in docs] == payloads
    assert {d["producer_id"] for d in docs} == {producer}
    assert {d["created_at"] for d in docs} == {NOW}
    # one line per message plus the header, each ended by a newline byte
    assert raw.count(b"\n") == len(payloads) + 1 and raw.endswith(b"\n")


@given(payload=json_values, producer=st.none() | st.text())
def test_a_line_is_the_canonical_json_of_the_message(payload: Any, producer: str | None) -> None:
    mid = str(uuid.uuid4())
    doc = {"id": mid, "producer_id": producer, "created_at": NOW, "payload": payload}
    assert encode_line(mid, producer, NOW, payload) == canonical_json(doc)


@given(payloads=st.lists(json_values, max_size=6), producer=st.none() | st.text())
def test_encode_lines_makes_the_lines_of_encode_line(
    payloads: list[Any], producer: str | None
) -> None:
    ids = [str(uuid.uuid4()) for _ in payloads]
    expected = [encode_line(i, producer, NOW, p) for i, p in zip(ids, payloads, strict=True)]
    assert encode_lines(ids, producer, NOW, payloads, 10**9) == expected


def test_encode_lines_names_the_first_bad_payload() -> None:
    ids = [str(uuid.uuid4()) for _ in range(4)]
    with pytest.raises(PayloadError, match=r"payload #2: payload is not JSON-serialisable"):
        encode_lines(ids, "p", NOW, [1, 2, {3}, object()], 1000)
    with pytest.raises(PayloadError, match=r"payload #1: message is \d+ bytes encoded; the "
                       r"limit is 150 \(publishing.max_payload_bytes\)"):
        encode_lines(ids, "p", NOW, [1, "x" * 100, 3, 4], 150)


def test_the_header_names_format_version_topic_segment_and_count() -> None:
    raw, _ = _segment([1, "two", {"3": [3]}])
    header = json.loads(raw.split(b"\n", 1)[0])
    assert header == {
        "count": 3,
        "created_at": NOW,
        "format": SEGMENT_FORMAT,
        "producer_id": "p-1",
        "segment_id": SID,
        "topic": TOPIC,
        "version": SEGMENT_VERSION,
    }
    assert raw.split(b"\n", 1)[0] == canonical_json(header)


def test_unicode_separators_stay_inside_their_line() -> None:
    """U+2028/U+2029 and NEL are line breaks to str.splitlines but not to the format."""
    payloads = ["a\u2028b", "c\u2029d\x85e", "f\ng\r\nh", "\U0001f600"]
    raw, _ = _segment(payloads)
    assert raw.count(b"\n") == len(payloads) + 1
    assert [d["payload"] for d in decode_segment(raw, TOPIC, SID)] == payloads


@pytest.mark.parametrize(
    "payload", [object(), {1, 2}, float("nan"), float("inf"), {"k": b"bytes"}, {1: "a", "b": 2}]
)
def test_a_payload_that_is_not_json_raises_payload_error(payload: Any) -> None:
    with pytest.raises(PayloadError, match="not JSON-serialisable"):
        encode_line(str(uuid.uuid4()), "p", NOW, payload)


def test_a_circular_payload_raises_payload_error() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(PayloadError):
        encode_line(str(uuid.uuid4()), "p", NOW, loop)


# --------------------------------------------------------------------------- corruption


def _header(**changes: Any) -> bytes:
    header = {
        "count": 1,
        "created_at": NOW,
        "format": SEGMENT_FORMAT,
        "producer_id": "p",
        "segment_id": SID,
        "topic": TOPIC,
        "version": SEGMENT_VERSION,
    }
    header.update(changes)
    return canonical_json({k: v for k, v in header.items() if v is not _DROP})


_DROP = object()
_MID = "7d7c1c9e-5a55-4e8c-8d1b-4b0d1f3a9a00"
_LINE = encode_line(_MID, "p", NOW, {"n": 1})
_LINE2 = encode_line("9e1c2f6a-0b7d-4c55-a1e3-2f9a8b7c6d5e", "p", NOW, 2)


def _message(**changes: Any) -> bytes:
    doc = {"created_at": NOW, "id": _MID, "payload": 1, "producer_id": "p"}
    doc.update(changes)
    return canonical_json({k: v for k, v in doc.items() if v is not _DROP})


CORRUPT: dict[str, tuple[bytes, str]] = {
    "not utf-8": (_header() + b"\n\xff\xfe\n", "not UTF-8"),
    "empty": (b"", "truncated"),
    "truncated (no final newline)": (_header() + b"\n" + _LINE, "truncated"),
    "truncated mid-line": (_header() + b"\n" + _LINE[:20] + b"\n", "line 2 is not JSON"),
    "header not json": (b"garbage\n" + _LINE + b"\n", "header is not JSON"),
    "header not an object": (b"[1]\n" + _LINE + b"\n", "header is not a JSON object"),
    "unknown format": (
        _header(format="someone-else/batch") + b"\n" + _LINE + b"\n",
        "unknown format 'someone-else/batch'",
    ),
    "no format": (_header(format=_DROP) + b"\n" + _LINE + b"\n", "unknown format None"),
    "unknown version": (_header(version=2) + b"\n" + _LINE + b"\n", "unknown format version 2"),
    "version true": (_header(version=True) + b"\n" + _LINE + b"\n", "version True"),
    "other topic": (_header(topic="other") + b"\n" + _LINE + b"\n", "names topic 'other'"),
    "other segment": (
        _header(segment_id=str(uuid.UUID(int=1))) + b"\n" + _LINE + b"\n",
        "names segment",
    ),
    "count too high": (_header(count=2) + b"\n" + _LINE + b"\n", "counts 2 messages"),
    "count too low": (_header(count=1) + b"\n" + _LINE + b"\n" + _LINE2 + b"\n", "has 2 lines"),
    "count zero": (_header(count=0) + b"\n", "count 0 is not a positive integer"),
    "count not int": (_header(count="1") + b"\n" + _LINE + b"\n", "count '1'"),
    "blank line": (_header(count=2) + b"\n" + _LINE + b"\n\n", "line 3 is not JSON"),
    "two values on a line": (
        _header(count=2) + b"\n" + _LINE + b"," + _LINE2 + b"\n\n",
        "line 2 is not JSON",
    ),
    "message not an object": (_header() + b"\n[1,2]\n", "line 2 is not a JSON object"),
    # deeper than the JSON parser's recursion limit: a RecursionError, not a ValueError
    "message nested too deep": (
        _header() + b"\n" + b"[" * 100_000 + b"]" * 100_000 + b"\n",
        "line 2 is not JSON",
    ),
    "header nested too deep": (
        b"[" * 100_000 + b"]" * 100_000 + b"\n" + _LINE + b"\n",
        "header is not JSON",
    ),
    "duplicate id": (_header(count=2) + b"\n" + _LINE + b"\n" + _LINE + b"\n", "repeats"),
    "no id": (_header() + b"\n" + _message(id=_DROP) + b"\n", "line 2 lacks id"),
    "no payload": (_header() + b"\n" + _message(payload=_DROP) + b"\n", "lacks payload"),
    "no created_at": (_header() + b"\n" + _message(created_at=_DROP) + b"\n", "lacks created_at"),
    "no producer_id": (
        _header() + b"\n" + _message(producer_id=_DROP) + b"\n",
        "lacks producer_id",
    ),
    "id escaping the prefix": (
        _header() + b"\n" + _message(id="../../other/x") + b"\n",
        "not a UUID",
    ),
    "id not a string": (_header() + b"\n" + _message(id=7) + b"\n", "not a UUID"),
    "created_at not a string": (_header() + b"\n" + _message(created_at=1) + b"\n", "created_at"),
    "producer_id not a string": (_header() + b"\n" + _message(producer_id=[]) + b"\n", "producer"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_every_corruption_raises_segment_error_naming_it(case: str) -> None:
    raw, problem = CORRUPT[case]
    with pytest.raises(SegmentError) as info:
        decode_segment(raw, TOPIC, SID)
    assert problem in str(info.value), (case, str(info.value))
    assert SID in str(info.value) and TOPIC in str(info.value)
    assert isinstance(info.value, PawnQueueError) and isinstance(info.value, ValueError)


def test_a_good_segment_of_the_corruption_helpers_decodes() -> None:
    """The helpers above make valid segments but for the one change of each case."""
    raw = _header(count=2) + b"\n" + _LINE + b"\n" + _message(id=str(uuid.UUID(int=5))) + b"\n"
    assert [d["payload"] for d in decode_segment(raw, TOPIC, SID)] == [{"n": 1}, 1]


@given(cut=st.integers(min_value=0, max_value=400))
def test_any_truncation_raises_segment_error(cut: int) -> None:
    raw, _ = _segment(["x" * 20, {"a": [1, 2, 3]}, None])
    cut = min(cut, len(raw) - 1)
    with pytest.raises(SegmentError):
        decode_segment(raw[:cut], TOPIC, SID)


# --------------------------------------------------------------------------- keys


def test_segment_keys_round_trip_and_sort_by_age() -> None:
    ts = layout.sortable_timestamp(datetime(2026, 11, 26, 17, 0, 1, 5, tzinfo=timezone.utc))
    key = layout.segment_key(TOPIC, ts, SID, 250)
    assert key == f"orders/segments/20261126T170001_000005-{SID}-n250.seg"
    assert key.startswith(layout.segments_prefix(TOPIC))
    assert layout.parse_segment_key(TOPIC, key) == (SID, 250)
    older = layout.segment_key(TOPIC, "20261126T170001_000004", str(uuid.UUID(int=2**127)), 1)
    assert older < key


@pytest.mark.parametrize(
    "key",
    [
        f"other/segments/20261126T170001_000005-{SID}-n2.seg",  # another topic
        f"orders2/segments/20261126T170001_000005-{SID}-n2.seg",  # a topic that extends it
        f"orders/messages/20261126T170001_000005-{SID}.json",  # a single message
        f"orders/segments/20261126T170001_000005-{SID}.seg",  # no count
        f"orders/segments/20261126T170001_000005-{SID}-n0.seg",  # an empty segment
        f"orders/segments/20261126T170001_000005-{SID}-n07.seg",  # a padded count
        f"orders/segments/20261126T170001_000005-{SID}-n2.json",
        f"orders/segments/20261126T170001_000005-{SID}-n2.seg.tmp",
        f"orders/segments/20261126T170001_000005-{SID.upper()}-n2.seg",
        f"orders/segments/x/20261126T170001_000005-{SID}-n2.seg",  # nested
        f"orders/segments/2026112T170001_000005-{SID}-n2.seg",
        "orders/segments/20261126T170001_000005-not-a-uuid-n2.seg",
        "orders/segments/",
        "orders/.packed",
    ],
)
def test_parse_segment_key_rejects_foreign_keys(key: str) -> None:
    assert layout.parse_segment_key(TOPIC, key) is None


def test_segment_lease_keys() -> None:
    key = layout.segment_lease_key(TOPIC, SID)
    assert key == f"orders/segment-leases/{SID}.lease"
    assert key.startswith(layout.segment_leases_prefix(TOPIC))
    assert layout.segment_lease_id(TOPIC, key) == SID
    # a plain lease is not a segment lease, nor the other way round
    assert layout.lease_message_id(TOPIC, key) is None
    assert layout.segment_lease_id(TOPIC, layout.lease_key(TOPIC, SID)) is None
    for foreign in (
        f"other/segment-leases/{SID}.lease",
        f"orders/segment-leases/{SID}.json",
        "orders/segment-leases/.lease",
        f"orders/segment-leases/a/{SID}.lease",
    ):
        assert layout.segment_lease_id(TOPIC, foreign) is None


def test_pawn_queue_prefixes_never_see_packed_objects() -> None:
    """pawn-queue 0.1.x lists messages/ and leases/ only: segments, their leases and the
    manifest lie outside both."""
    keys = [
        layout.packed_manifest_key(TOPIC),
        layout.segment_key(TOPIC, "20261126T170001_000005", SID, 1),
        layout.segment_lease_key(TOPIC, SID),
    ]
    assert keys[0] == "orders/.packed"
    for key in keys:
        assert not key.startswith(layout.messages_prefix(TOPIC))
        assert not key.startswith(layout.leases_prefix(TOPIC))
        assert layout.parse_message_key(TOPIC, key) is None
