"""What the dashboard shows, read from the bucket: one :class:`Reading` per poll.

``pq.stats_all()``: each topic's ``TopicStats.to_dict()`` (the page reads ``topic``,
``packed``, ``pending``, ``in_flight``, ``delayed``, ``dead_lettered``,
``oldest_pending_age_seconds``, ``exact`` and ``requests``); ``pq.consumers()``: the
queue's consumers (``id``, ``name``, ``last_seen``, ``alive``), with no topic as well,
and whether that list is whole (``consumers_exact``). Nothing from the configuration goes in but the
store's :meth:`~pawn_queue_sync.storage.base.Store.describe` (endpoint with any
credentials masked, and the bucket).

Dead letters for the browser: the first :data:`LETTERS_SHOWN` of a topic, each
payload cut to :data:`PAYLOAD_CHARS` characters of JSON.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from ..queue.core import PawnQueue
from ..queue.topic_stats import MAX_KEYS

__all__ = ["LETTERS_SHOWN", "PAYLOAD_CHARS", "Reading", "read_dead_letters", "read_stats"]

#: Dead letters the browser shows per topic (one LIST and a GET each).
LETTERS_SHOWN = 100
#: Characters of a payload's JSON shown (the rest is cut, and marked so).
PAYLOAD_CHARS = 2000


@attrs.frozen
class Reading:
    """One poll: each topic's counts and the consumers, as JSON-ready dicts;
    ``consumers_exact`` False when the registry listing stopped at its bound (the
    consumers are then its first entries)."""

    topics: list[dict[str, Any]]
    consumers: list[dict[str, Any]]
    server_time: str | None
    consumers_exact: bool = True


def read_stats(pq: PawnQueue, max_keys: int = MAX_KEYS) -> Reading:
    """Every topic's counts (``pq.stats_all``) and the queue's registered consumers
    (``pq.consumers``: the registry does not record who reads what, and a queue with
    no topic has consumers too), JSON-ready."""
    rows = [s.to_dict() for s in pq.stats_all(max_keys=max_keys)]
    for row in rows:
        row.pop("consumers", None)  # the queue's, read once below
    listed, exact = pq.consumers(max_keys=max_keys)
    times = [r["server_time"] for r in rows if r.get("server_time")]
    return Reading(rows, [c.to_dict() for c in listed], max(times, default=None), exact)


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
