"""What the dashboard shows, read from the bucket: one :class:`Reading` per poll.

``pq.stats_all()`` (``TopicStats``, issue 16) when the queue has it; until then an
adapter over ``pq.topic_stats`` and the registry gives the same JSON shape (the
fields the page reads: ``topic``, ``packed``, ``pending``, ``in_flight``, ``delayed``,
``dead_lettered``, ``oldest_pending_age_seconds``, ``exact``; consumers with ``id``,
``name``, ``last_seen``, ``alive``). Nothing from the configuration goes in but the
store's :meth:`~pawn_queue_sync.storage.base.Store.describe` (endpoint with any
credentials masked, and the bucket).

Dead letters for the browser: the first :data:`LETTERS_SHOWN` of a topic, each
payload cut to :data:`PAYLOAD_CHARS` characters of JSON.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import attrs

from .. import layout
from ..errors import ObjectNotFound
from ..queue.core import PawnQueue
from ..queue.registry import LIVENESS_HEARTBEATS

__all__ = ["LETTERS_SHOWN", "PAYLOAD_CHARS", "Reading", "read_dead_letters", "read_stats"]

#: Dead letters the browser shows per topic (one LIST and a GET each).
LETTERS_SHOWN = 100
#: Characters of a payload's JSON shown (the rest is cut, and marked so).
PAYLOAD_CHARS = 2000
#: Objects one listing of the adapter counts at most (``stats_all``'s ``max_keys``).
MAX_KEYS = 10000


@attrs.frozen
class Reading:
    """One poll: each topic's counts and the consumers, as JSON-ready dicts."""

    topics: list[dict[str, Any]]
    consumers: list[dict[str, Any]]
    server_time: str | None


def read_stats(pq: PawnQueue, max_keys: int = MAX_KEYS) -> Reading:
    """Every topic's counts and the consumers' liveness, from ``pq.stats_all`` when the
    queue has it, else from ``topic_stats`` and the registry (the same shape)."""
    stats_all = getattr(pq, "stats_all", None)
    if stats_all is not None:
        rows = [s.to_dict() for s in stats_all(max_keys=max_keys)]
        consumers: dict[str, dict[str, Any]] = {}
        for row in rows:
            for c in row.pop("consumers", None) or []:
                consumers.setdefault(c["id"], c)
        times = [r["server_time"] for r in rows if r.get("server_time")]
        return Reading(rows, sorted(consumers.values(), key=_by_name), max(times, default=None))
    return _adapted(pq, max_keys)


def _by_name(row: dict[str, Any]) -> tuple[str, str]:
    return (str(row.get("name") or ""), str(row.get("id") or ""))


def _adapted(pq: PawnQueue, max_keys: int) -> Reading:
    """The TopicStats shape from the calls that exist before ``stats_all``: a topic's
    three listings (``topic_stats``), a LIST of one key for its oldest message, a
    bounded LIST of ``delayed/``; the consumers from one registry listing and a GET each."""
    store = pq.store
    rows = []
    for topic in pq.list_topics():
        counts = pq.topic_stats(topic)
        oldest = store.list(layout.messages_prefix(topic), limit=1)
        delayed = store.list(layout.delayed_prefix(topic), limit=max_keys)
        rows.append({
            "topic": topic,
            "packed": bool(counts.get("packed", False)),
            "pending": int(counts["pending"]),
            # message leases only: topic_stats counts a held segment's messages pending
            "in_flight": int(counts["leased"]),
            "dead_lettered": int(counts["dead_letter"]),
            "delayed": len(delayed.objects),
            "oldest_pending_age_seconds": _age(oldest.objects[0].key, topic,
                                               oldest.server_time) if oldest.objects else None,
            "exact": not delayed.truncated,
        })
    listing = store.list(f"{layout.REGISTRY_PREFIX}consumers/")
    now = listing.server_time
    beat = pq.config.registry.heartbeat_interval_seconds
    consumers = []
    for info in listing.objects:
        try:
            doc = json.loads(store.get(info.key).body)
        except (ObjectNotFound, ValueError):  # gone since the listing, or not JSON
            continue
        if not isinstance(doc, dict):
            continue
        seen = info.last_modified
        alive = (now is not None and seen is not None
                 and (now - seen).total_seconds() <= LIVENESS_HEARTBEATS * beat)
        consumers.append({"id": str(doc.get("entity_id", "")), "name": str(doc.get("name", "")),
                          "last_seen": layout.iso(seen) if seen else None, "alive": alive})
    return Reading(rows, sorted(consumers, key=_by_name),
                   layout.iso(now) if now is not None else None)


def _age(key: str, topic: str, now: datetime | None) -> float | None:
    """Seconds since the timestamp of a message key (server time), None if unknown."""
    if now is None or layout.parse_message_key(topic, key) is None:
        return None
    stamp = key[len(layout.messages_prefix(topic)):].split("-", 1)[0]
    try:
        when = datetime.strptime(stamp + "+0000", "%Y%m%dT%H%M%S_%f%z")
    except ValueError:
        return None
    return max(0.0, (now - when).total_seconds())


def read_dead_letters(pq: PawnQueue, topic: str, limit: int = LETTERS_SHOWN
                      ) -> list[dict[str, Any]]:
    """The first ``limit`` dead letters of ``topic`` for the page (a LIST, a GET each):
    what a person needs to decide (reason, delivery count, times, the payload cut to
    :data:`PAYLOAD_CHARS`), and the ETag read, so a purge deletes that version only."""
    out = []
    for dl in pq.dead_letters(topic, limit=limit):
        text = None if dl.raw is None or "payload" not in dl.raw else _json(dl.payload)
        out.append({
            "key": dl.key,
            "id": dl.id,
            "etag": dl.etag,
            "reason": _cut(dl.reason),
            "delivery_count": dl.delivery_count,
            "dead_lettered_at": dl.dead_lettered_at,
            "created_at": dl.created_at,
            "consumer_id": dl.consumer_id,
            "last_error": _cut(dl.last_error) if dl.last_error else None,
            "payload": _cut(text) if text is not None else None,
            "payload_cut": text is not None and len(text) > PAYLOAD_CHARS,
            "redrivable": dl.redrivable,
        })
    return out


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


def _cut(text: str) -> str:
    return text if len(text) <= PAYLOAD_CHARS else text[:PAYLOAD_CHARS] + "…"
