"""Deduplicated publishing: a conditional create of a marker per dedup id and topic.

(Skeleton: the lead's contract; the dedup helper fills it in.)
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from .context import Context

__all__ = ["check_dedup_id", "publish_once"]


def check_dedup_id(dedup_id: object) -> str:
    """``dedup_id`` if it is a usable dedup id, else PayloadError."""
    raise NotImplementedError("deduplication is not built yet")


def publish_once(ctx: Context, topic: str, dedup_id: str, message_id: str,
                 created_at: datetime, write: Callable[[str, datetime], str]) -> str:
    """Publish through ``write(message_id, created_at)`` unless ``dedup_id`` was
    published on ``topic`` within the window; the message id either way."""
    raise NotImplementedError("deduplication is not built yet")
