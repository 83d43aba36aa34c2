"""``PawnQueue.topic_stats``: what a topic holds, counted from listings.

A plain topic: pending messages, leases and dead letters (three listings). A packed
topic adds its segments: their message counts come from their keys (no segment is
read) and what their leases recorded settled is subtracted from ``pending`` (one GET
per segment lease: a consumer holds a few at a time).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from .. import layout
from ..errors import ObjectNotFound, SegmentError
from ..protocol.segments import SegmentLease
from .context import Context
from .topic_stats import ConsumerStatus, TopicStats  # noqa: F401  (``pq.stats``: there)

log = logging.getLogger(__name__)

__all__ = ["topic_stats"]


def topic_stats(ctx: Context, topic: str) -> dict[str, int | bool]:
    """Counts of ``topic``'s pending messages, leases and dead letters; for a packed
    topic also ``packed``, ``segments``, ``segment_messages`` (sum of the counts in
    the segment keys), ``segments_leased``, and ``pending`` counts the messages in
    segments that no lease recorded settled."""
    ctx.require_topic(topic)
    pending = len(ctx.store.list(layout.messages_prefix(topic)).objects)
    stats: dict[str, int | bool] = {
        "pending": pending,
        "leased": len(ctx.store.list(layout.leases_prefix(topic)).objects),
        "dead_letter": len(ctx.store.list(layout.dead_letter_prefix(topic)).objects),
    }
    if not ctx.topic_packed(topic):
        return stats
    segments: dict[str, int] = {}  # segment id -> message count (from its key)
    for obj in ctx.store.list(layout.segments_prefix(topic)).objects:
        parsed = layout.parse_segment_key(topic, obj.key)
        if parsed is not None:
            segments[parsed[0]] = parsed[1]
    lease_keys = [o.key for o in ctx.store.list(layout.segment_leases_prefix(topic)).objects]
    settled = _settled(ctx, topic, lease_keys, segments)
    in_segments = sum(segments.values())
    stats.update(
        pending=pending + in_segments - settled,
        packed=True,
        segments=len(segments),
        segment_messages=in_segments,
        segments_leased=len(lease_keys),
    )
    return stats


def _settled(ctx: Context, topic: str, lease_keys: Iterable[str],
             segments: dict[str, int]) -> int:
    """Messages the leases of listed segments recorded settled. A lease whose segment
    is gone settles nothing that is counted; an unreadable one is counted as settling
    nothing (its segment's messages are still pending)."""
    total = 0
    for key in lease_keys:
        sid = layout.segment_lease_id(topic, key)
        count = segments.get(sid) if sid is not None else None
        if count is None:
            continue
        try:
            lease = SegmentLease.decode(ctx.store.get(key).body)
        except ObjectNotFound:
            continue  # released and removed since the listing
        except SegmentError as exc:
            log.warning("topic_stats(%r): unreadable segment lease %s: %s", topic, key, exc)
            continue
        total += lease.progress.settled_count(count)
    return total
