"""The poll of an idle topic: one LIST that serves both the promotion of delayed
messages and the question "is there anything to claim?".

While a consumer's last poll of a topic found nothing to claim, its next poll lists
``{topic}/`` once, from just before ``delayed/`` (:data:`START_AFTER`), up to
:data:`PAGE` keys. Keys there come in this order of sections: ``delayed/``, the
promotion lock, ``leases/``, ``messages/``, ``segment-leases/``, ``segments/`` (the
dead letters, dedup markers, topic marker and manifest sort before the start and are
not listed). So the page carries the first delayed keys in due order (all a
promotion pass needs: it stops at the first key not due) and, when it is not cut,
tells whether ``messages/`` and ``segments/`` hold anything. A page that shows work,
or is cut before it can tell, sends the poll to the topic's normal listings.

SeaweedFS lists nested keys by directory, not by bytes: a StartAfter of
``{topic}/delayed.lock`` skips the whole ``delayed/`` directory there (it sorts the
directory ``delayed`` before the file ``delayed.lock``), and foreign siblings such
as ``messages.x`` come after ``messages/`` rather than before. The start is
therefore a name between ``dedup`` and ``delayed`` in both orders, and a section
counts as fully listed only when the page is not cut or shows a key of a later
section (the sections' own order is the same in both).
"""

from __future__ import annotations

import attrs

from .. import layout
from ..storage.base import Listing, ObjectInfo
from .context import Context
from .message import Message
from .packed import PackedSource
from .promotion import Promoter
from .source import MessageSource

__all__ = ["PAGE", "SECTIONS", "START_AFTER", "Probe", "poll_topic", "probe", "start_after"]

#: Keys one idle poll lists (the promotion's first page was as long).
PAGE = 100
#: The name after which the listing starts: after ``dedup/`` and before ``delayed``
#: and everything after it, in byte order and in SeaweedFS's directory order.
START_AFTER = "dedup0"
#: The sections an idle poll looks at, in listing order.
SECTIONS = (layout.DELAYED, layout.LEASES, layout.MESSAGES, layout.SEGMENT_LEASES,
            layout.SEGMENTS)


def start_after(topic: str) -> str:
    """Where an idle poll's listing of ``topic`` starts (exclusive)."""
    return f"{topic}/{START_AFTER}"


@attrs.frozen
class Probe:
    """What one listing of an idle topic showed: its keys by section and whether each
    section was listed to its end."""

    topic: str
    listing: Listing
    sections: dict[str, list[ObjectInfo]]
    complete: frozenset[str]

    def empty(self, section: str) -> bool:
        """``section`` (e.g. ``layout.MESSAGES``) is known to hold no key."""
        return section in self.complete and not self.sections[section]

    def listing_of(self, section: str) -> Listing | None:
        """The keys of ``section`` on the page as a listing of that prefix
        (``truncated`` when more may follow the last one), or None when the page says
        nothing about it (cut before any of its keys)."""
        objects = self.sections[section]
        done = section in self.complete
        if not objects and not done:
            return None
        return Listing(objects, server_time=self.listing.server_time, truncated=not done)


def probe(ctx: Context, topic: str) -> Probe:
    """List ``topic`` once from :func:`start_after` (see the module). Raises
    StorageError as the store's list does."""
    listing = ctx.store.list(f"{topic}/", limit=PAGE, start_after=start_after(topic))
    prefixes = {name: f"{topic}/{name}/" for name in SECTIONS}
    sections: dict[str, list[ObjectInfo]] = {name: [] for name in SECTIONS}
    for info in listing.objects:
        for name, prefix in prefixes.items():
            if info.key.startswith(prefix):
                sections[name].append(info)
                break
    if not listing.truncated:
        complete = frozenset(SECTIONS)
    else:  # a section is done once a later one shows up (same order on every server)
        later = [i for i, name in enumerate(SECTIONS) if sections[name]]
        complete = frozenset(SECTIONS[: max(later)]) if later else frozenset()
    return Probe(topic, listing, sections, complete)


def poll_topic(ctx: Context, topic: str, want: int, source: MessageSource,
               promoter: Promoter, packed: PackedSource) -> list[Message]:
    """A consumer's poll of ``topic`` from ``source``: its due delayed messages
    promoted first (so this poll takes them), then claims. Idle (``source.idle``), one
    LIST (:func:`probe`) serves the promotion and, when it shows nothing to claim
    (``packed``: the packed source, whose segments count too), the whole poll; a
    source without ``idle`` is always polled."""
    idle_now = getattr(source, "idle", None)
    if idle_now is None or not idle_now(topic):
        promoter.run_due(topic)
        return source.poll(topic, want)
    seen = probe(ctx, topic)
    promoted = promoter.run_due(topic, seen.listing_of(layout.DELAYED))
    if not (promoted or seen.empty(layout.MESSAGES)):
        if source is packed:  # its singles: looked at in this poll, not an interval on
            packed.singles_arrived(topic)
    elif not promoted and (source is not packed or seen.empty(layout.SEGMENTS)):
        return []
    return source.poll(topic, want, None if promoted else seen.listing_of(layout.MESSAGES))
