"""``PawnQueue.peek``: the oldest pending messages of a topic, read without leasing,
writing or deleting anything (LISTs and GETs only)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import attrs

from .. import layout, packing
from ..errors import ObjectNotFound, SegmentError
from ..protocol.segments import Progress, SegmentLease
from .context import Context
from .deadletters import DeadLetter, check_limit, dead_letters, iter_keys, largest_readable

__all__ = ["PeekedMessage", "peek"]


@attrs.frozen
class PeekedMessage:
    """A pending message as :func:`peek` read it. ``attempts``: its deliveries that
    ended without an ack, as recorded; ``leased``: a lease on it (or on its segment)
    was listed, so a consumer may be handling it now; ``segment``: the segment's key
    on a packed topic (``key`` is then that too). ``payload`` is None and ``error``
    says why for an object that is not a readable message."""

    id: str | None
    topic: str
    key: str
    payload: Any
    created_at: str | None
    producer_id: str | None
    attempts: int
    last_error: str | None
    leased: bool
    segment: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def peek(ctx: Context, topic: str, n: int = 10,
         dead_letter: bool = False) -> list[PeekedMessage] | list[DeadLetter]:
    """Up to ``n`` of ``topic``'s oldest pending messages (single messages first, then
    a packed topic's segments in age order, their settled messages left out), or with
    ``dead_letter`` its first ``n`` dead letters. Costs: a LIST of leases, a LIST of
    messages and a GET each; on a packed topic that came short, a LIST of segment
    leases, a LIST of segments, and a GET per segment read and per lease of it."""
    check_limit("n", n)
    if dead_letter:
        return list(dead_letters(ctx, topic, limit=n))
    ctx.require_topic(topic)
    out = list(_singles(ctx, topic, n))
    if len(out) < n and ctx.topic_packed(topic):
        for msg in _segment_messages(ctx, topic):
            out.append(msg)
            if len(out) >= n:
                break
    return out


def _singles(ctx: Context, topic: str, n: int) -> Iterator[PeekedMessage]:
    leased = {mid for o in ctx.store.list(layout.leases_prefix(topic)).objects
              if (mid := layout.lease_message_id(topic, o.key)) is not None}
    for info in ctx.store.list(layout.messages_prefix(topic), limit=n).objects:
        mid = layout.parse_message_key(topic, info.key)
        if info.size > largest_readable(ctx):  # a foreign object of any size: not read
            yield PeekedMessage(id=mid, topic=topic, key=info.key, payload=None,
                                created_at=None, producer_id=None, attempts=0,
                                last_error=None, leased=mid in leased,
                                error=f"too large to read ({info.size} bytes)")
            continue
        try:
            body = ctx.store.get(info.key).body
        except ObjectNotFound:
            continue  # acked since the listing
        yield _single(topic, info.key, mid, body, mid in leased)


def _single(topic: str, key: str, mid: str | None, body: bytes, leased: bool) -> PeekedMessage:
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        doc = None
    if not isinstance(doc, dict) or "payload" not in doc or mid is None:
        why = "not a message key" if mid is None else "not a JSON message"
        return PeekedMessage(id=mid, topic=topic, key=key, payload=None, created_at=None,
                             producer_id=None, attempts=0, last_error=None, leased=leased,
                             error=why)
    attempts = doc.get("attempts", 0)
    last = doc.get("last_error")
    return PeekedMessage(
        id=mid, topic=topic, key=key, payload=doc["payload"],
        created_at=_str(doc.get("created_at")), producer_id=_str(doc.get("producer_id")),
        attempts=attempts if isinstance(attempts, int) and not isinstance(attempts, bool)
        else 0,
        last_error=last if isinstance(last, str) else None, leased=leased,
    )


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _segment_messages(ctx: Context, topic: str) -> Iterator[PeekedMessage]:
    """The unsettled messages of ``topic``'s segments, oldest segment first; a segment
    counts as leased while its lease is not given back (``released``)."""
    leases = {sid: o.key for o in ctx.store.list(layout.segment_leases_prefix(topic)).objects
              if (sid := layout.segment_lease_id(topic, o.key)) is not None}
    for info in iter_keys(ctx, layout.segments_prefix(topic), page=100):
        parsed = layout.parse_segment_key(topic, info.key)
        if parsed is None:
            continue
        sid = parsed[0]
        progress = Progress()
        held = False
        if sid in leases:
            # given back and removed, or unreadable: nothing known settled
            with contextlib.suppress(ObjectNotFound, SegmentError):
                lease = SegmentLease.decode(ctx.store.get(leases[sid]).body)
                progress, held = lease.progress, not lease.released
        try:
            docs = packing.decode_segment(ctx.store.get(info.key).body, topic, sid)
        except ObjectNotFound:
            continue  # finished since the listing
        except SegmentError as exc:
            yield PeekedMessage(id=None, topic=topic, key=info.key, payload=None,
                                created_at=None, producer_id=None, attempts=0,
                                last_error=None, leased=held, segment=info.key,
                                error=str(exc))
            continue
        for i, doc in enumerate(docs):
            if progress.is_settled(i):
                continue
            yield PeekedMessage(
                id=doc["id"], topic=topic, key=info.key, payload=doc["payload"],
                created_at=_str(doc.get("created_at")),
                producer_id=_str(doc.get("producer_id")),
                attempts=progress.deliveries_of(i), last_error=progress.error_of(i),
                leased=held, segment=info.key,
            )
