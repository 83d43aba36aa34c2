"""Delayed messages: published into ``{topic}/delayed/``, moved to ``messages/`` once due.

(Skeleton: the lead's contract; the delay helper fills it in.)
"""

from __future__ import annotations

from .context import Context

__all__ = ["check_delay", "write_delayed"]


def check_delay(delay_seconds: float | None) -> float | None:
    """``delay_seconds`` checked: None (or 0) means no delay; else seconds > 0."""
    if delay_seconds is None:
        return None
    raise NotImplementedError("delayed messages are not built yet")


def write_delayed(ctx: Context, topic: str, message_key: str, body: bytes,
                  delay: float) -> None:
    """Store the message ``body`` (whose messages/ key would be ``message_key``) as
    delayed by ``delay`` seconds."""
    raise NotImplementedError("delayed messages are not built yet")
