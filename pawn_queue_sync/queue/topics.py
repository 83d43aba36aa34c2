"""Topics: a marker object ``{topic}/.topic`` makes a prefix a topic; a manifest
``{topic}/.packed`` makes it a packed one (messages published in segments)."""

from __future__ import annotations

import logging

from .. import layout
from ..errors import ConditionFailed, ObjectNotFound
from .context import Context

log = logging.getLogger(__name__)


#: The manifest of a packed topic: its ``format`` and ``version``.
PACKED_FORMAT = "pawn-queue-sync/packed"
PACKED_VERSION = 1


def create_topic(ctx: Context, topic: str, packed: bool = False) -> bool:
    """Create ``topic`` if missing; True if this call created its marker. Idempotent.

    ``packed=True`` also writes the manifest ``{topic}/.packed`` (once; never removed),
    which makes publishing to it write segments: on an existing plain topic it switches
    the topic, whose single messages still drain. pawn-queue 0.1.x consumers do not see
    packed messages.
    """
    layout.validate_topic(topic)
    now = layout.iso(ctx.clock.now())
    marker = layout.canonical_json({"topic": topic, "created_at": now})
    created = _put_once(ctx, layout.topic_marker_key(topic), marker)
    ctx.remember_topic(topic)
    if created:
        log.info("created topic %r", topic)
    if packed:
        manifest = {"format": PACKED_FORMAT, "version": PACKED_VERSION, "created_at": now}
        if _put_once(ctx, layout.packed_manifest_key(topic), layout.canonical_json(manifest)):
            log.info("topic %r is packed", topic)
        ctx.remember_packed(topic)
    return created


def _put_once(ctx: Context, key: str, body: bytes) -> bool:
    """Write ``key`` unless it exists (If-None-Match, or HEAD then PUT where the server
    lacks it); True if this call wrote it."""
    if ctx.caps.if_none_match:
        try:
            ctx.store.put(key, body, if_none_match=True)
        except ConditionFailed:
            return False
        return True
    try:
        ctx.store.head(key)
    except ObjectNotFound:
        ctx.store.put(key, body)
        return True
    return False


def list_topics(ctx: Context) -> list[str]:
    """Every topic with a marker, sorted. One listing plus a HEAD per top-level prefix."""
    listing = ctx.store.list("", delimiter="/")
    topics: list[str] = []
    for prefix in listing.prefixes:
        name = prefix.rstrip("/")
        try:
            layout.validate_topic(name)
            ctx.store.head(layout.topic_marker_key(name))
        except (ObjectNotFound, ValueError):
            continue  # not a topic: registry, probe, or a foreign prefix
        topics.append(name)
        ctx.remember_topic(name)
    return sorted(topics)


def topic_exists(ctx: Context, topic: str) -> bool:
    try:
        ctx.require_topic(topic)
    except LookupError:
        return False
    return True
