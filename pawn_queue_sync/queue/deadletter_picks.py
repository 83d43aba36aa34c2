"""Redrive and purge of chosen dead letters (one, or a selection), for the dashboard.

``PawnQueue.redrive`` and ``PawnQueue.purge`` act on every dead letter of a topic;
these act on the keys a person picked in ``pawnq dashboard``'s dead-letter browser.
A redrive moves each letter exactly as :func:`~.deadletters.redrive` does (the same
move: its lease HEAD, the message written first, then that version of the letter
deleted), so its guarantees hold: a crash repeats a message, never loses one. A purge
deletes only the version the person saw (its ETag, If-Match per key where the server
honours it): a letter written again since (the redriven message failed again) stays.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from .. import layout
from ..errors import InvalidArgument, ObjectNotFound, StorageError
from .context import Context
from .deadletters import RedriveResult, _redrive_one, largest_readable
from .redrive_moves import SegmentsSeen

log = logging.getLogger(__name__)

__all__ = ["MAX_PICKED", "check_keys", "purge_keys", "redrive_keys"]

#: The most keys one call takes (one DeleteObjects; a page of the browser is smaller).
MAX_PICKED = 1000


def check_keys(topic: str, keys: Sequence[str]) -> list[str]:
    """``keys`` as a list of distinct dead-letter keys of ``topic`` (``{topic}/dead-letter/``
    and a name without '/'), 1 to :data:`MAX_PICKED` of them; InvalidArgument otherwise."""
    if isinstance(keys, str) or not isinstance(keys, Sequence):
        raise InvalidArgument(f"keys must be a list of dead-letter keys, not {keys!r:.80}")
    if not 1 <= len(keys) <= MAX_PICKED:
        raise InvalidArgument(f"between 1 and {MAX_PICKED} keys at a time, not {len(keys)}")
    prefix = layout.dead_letter_prefix(topic)
    out: list[str] = []
    for key in keys:
        if (not isinstance(key, str) or not key.startswith(prefix)
                or not key[len(prefix):] or "/" in key[len(prefix):]):
            raise InvalidArgument(f"not a dead-letter key of topic {topic!r}: {key!r:.200}")
        if key not in out:
            out.append(key)
    return out


def redrive_keys(ctx: Context, topic: str, keys: Sequence[str]) -> RedriveResult:
    """Move the dead letters at ``keys`` back to ``topic`` (see :func:`~.deadletters.redrive`
    for each move); a key already gone (redriven or purged meanwhile) is left out of
    ``moved``. Cost per key: a HEAD (its size: one too large to read is skipped
    unread), a GET, a HEAD (its lease), a PUT and a DELETE."""
    picked = check_keys(topic, keys)
    ctx.require_topic(topic)
    result = RedriveResult()
    seen: SegmentsSeen = {}  # this pass's reads of a packed topic's segments
    for key in picked:
        try:
            info = ctx.store.head(key)
        except ObjectNotFound:
            continue
        except StorageError as exc:
            result.failed[key] = str(exc)
            continue
        if info.size > largest_readable(ctx):
            result.skipped[key] = (f"not a message to put back: too large to read "
                                   f"({info.size} bytes)")
            continue
        try:
            _redrive_one(ctx, topic, key, result, seen)
        except StorageError as exc:
            result.failed[key] = str(exc)
            log.warning("redrive of %s failed: %s", key, exc)
        except (OverflowError, ValueError, UnicodeError) as exc:
            result.skipped[key] = f"cannot be put back: {type(exc).__name__}: {exc}"
    log.info("redrive of %d picked dead letter(s) of %r: %d moved, %d skipped, %d failed",
             len(picked), topic, len(result.moved), len(result.skipped), len(result.failed))
    return result


def purge_keys(ctx: Context, topic: str, versions: Mapping[str, str]) -> tuple[int, list[str]]:
    """Delete the dead letters ``versions`` names (key -> the ETag seen, or "" for any
    version); ``(deleted, kept)``: ``kept`` are the keys not deleted because another
    version is there now (or the store refused). A key already gone counts as deleted.
    One DeleteObjects; where the server lacks If-Match, any version is deleted."""
    picked = check_keys(topic, list(versions))
    ctx.require_topic(topic)
    etags = ({k: versions[k] for k in picked if versions[k]} if ctx.caps.if_match else {})
    kept = ctx.store.delete_many(picked, **({"etags": etags} if etags else {}))
    log.info("purged %d picked dead letter(s) of %r (%d kept)", len(picked) - len(kept),
             topic, len(kept))
    return len(picked) - len(kept), list(kept)
