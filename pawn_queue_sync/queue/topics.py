"""Topics: a marker object ``{topic}/.topic`` makes a prefix a topic."""

from __future__ import annotations

import logging

from .. import layout
from ..errors import ConditionFailed, ObjectNotFound
from .context import Context

log = logging.getLogger(__name__)


def create_topic(ctx: Context, topic: str) -> bool:
    """Create ``topic`` if missing; True if this call created it. Idempotent."""
    layout.validate_topic(topic)
    key = layout.topic_marker_key(topic)
    body = layout.canonical_json({"topic": topic, "created_at": layout.iso(ctx.clock.now())})
    created = True
    if ctx.caps.if_none_match:
        try:
            ctx.store.put(key, body, if_none_match=True)
        except ConditionFailed:
            created = False
    else:
        try:
            ctx.store.head(key)
            created = False
        except ObjectNotFound:
            ctx.store.put(key, body)
    ctx.remember_topic(topic)
    if created:
        log.info("created topic %r", topic)
    return created


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
