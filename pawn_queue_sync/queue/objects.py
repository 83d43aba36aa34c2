"""Topics that store one object per message: the first
:class:`~pawn_queue_sync.queue.source.MessageSource`.

A poll makes one LIST of the topic's leases (LIST metadata is enough to judge them by
the server's clock), removes stale ones only if unchanged, makes one LIST of pending
messages, plans which to claim (:mod:`.planning`), then claims them in parallel on a
thread pool: lease first, then the message body (:mod:`.claims`). With
csprng_verify the candidates' leases are claimed as one batch (the lease LIST is the
"is it free" check, listings verify), then the bodies are fetched in parallel.
Settlement is :mod:`.settle`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .. import layout
from ..protocol import lease as leases
from ..storage.base import Listing
from . import claims, planning, reaping, settle
from .claimant import Claimant
from .message import Message
from .planning import TopicState


class ObjectSource:
    """Claims and settles the messages of topics stored one object each, for one
    consumer (``claimant``); ``peers`` gives its rank among the registered consumers
    and their number (asked of the registry at most once a heartbeat interval)."""

    def __init__(self, claimant: Claimant, peers: Callable[[], tuple[int, int]]) -> None:
        self._claimant = claimant
        self._peers = peers
        #: what our polls of each topic remember for the next
        self._states: dict[str, TopicState] = {}

    def state(self, topic: str) -> TopicState:
        """What our polls of ``topic`` remember (a fresh state before the first)."""
        state = self._states.get(topic)
        if state is None:
            state = self._states[topic] = TopicState()
        return state

    # -- polling ----------------------------------------------------------------------------

    def poll(self, topic: str, want: int, listed: Listing | None = None) -> list[Message]:
        """Claim up to ``want`` pending messages of ``topic`` (see the module).
        ``listed``: its messages as an idle poll's listing just showed them (used by an
        idle poll in place of its first LIST; listed again if cut short)."""
        claimant, state = self._claimant, self.state(topic)
        store = claimant.ctx.store
        prefix = layout.messages_prefix(topic)
        # With rivals about (a poll lost claims, or saw leases that are not ours), pick
        # among a wider window (see planning); alone, oldest first. A wider listing is
        # still one request.
        known = state.contended
        contended = bool(known)
        if state.idle:
            # Idle (or first) poll: messages first, so an empty topic costs one request.
            # The listing must reach past the messages others hold: last poll's lease
            # count is the estimate. A first poll lists wide: whether to spread is known
            # only once the registry is asked, and a page is not listed twice.
            seen = state.leases_seen
            window = planning.window(want, seen, contended or known is None)
            listing = listed or store.list(prefix, limit=planning.listing_limit(window, seen))
            if not listing.objects:
                return []
            if known is None:
                # First poll with messages: consumers started together would all take
                # the same oldest keys, so spread at once if others are registered.
                contended = self._peers()[1] > 1
                window = planning.window(want, seen, contended)
            live, listed_at = reaping.live_leases(claimant, topic)
            rivals = not live <= claimant.ours(topic)
            limit = planning.listing_limit(window, len(live))
            if listing.truncated and len(listing.objects) < limit:
                listing = store.list(prefix, limit=limit)
        else:
            # Busy: leases first, so a message acked between the two listings is not
            # mistaken for a free one (that costs a claim, a GET and a release for nothing).
            live, listed_at = reaping.live_leases(claimant, topic)
            rivals = not live <= claimant.ours(topic)
            window = planning.window(want, len(live), rivals or contended)
            listing = store.list(prefix, limit=planning.listing_limit(window, len(live)))
        state.listed(len(live), bool(listing.objects))
        candidates, foreign = planning.candidates_in(topic, listing.objects, live, window)
        for info in foreign:
            claims.quarantine_foreign(claimant, topic, info.key, info.size)
        if not candidates:
            return []
        batches = self._claims_in_batches()
        candidates = planning.choose(
            state, candidates, want, runs=batches and (rivals or contended),
            peers=self._peers, rng=claimant.rng,
        )
        if batches:
            if state.ranges is None:
                state.ranges = leases.KeyRange(layout.leases_prefix(topic))
            results = claims.claim_batch(claimant, topic, candidates, listed_at, state.ranges)
            got = [m for m in results if m is not None]
        else:
            got = claims.claim_each(claimant, topic, candidates)
        state.claimed(rivals, len(got), len(candidates), claimant.rng)
        return got

    def idle(self, topic: str) -> bool:
        """Our last poll of ``topic`` found no pending message (or none ran yet)."""
        return self.state(topic).idle

    def _claims_in_batches(self) -> bool:
        """csprng_verify on a server whose LIST is consistent: one batch claim per poll."""
        ctx = self._claimant.ctx
        return ctx.caps.strategy == "csprng_verify" and ctx.csprng.consistent_list

    def janitor(self, topic: str) -> int:
        """Remove stale leases of ``topic`` now; how many are live afterwards."""
        return len(reaping.live_leases(self._claimant, topic)[0])

    # -- settling ---------------------------------------------------------------------------

    def ack_many(self, msgs: Sequence[Message]) -> None:
        settle.ack_many(self._claimant, msgs)

    def nack(self, msg: Message, reason: str | None) -> None:
        settle.nack(self._claimant, msg, reason)

    def retry(self, msg: Message, error: str | None, delay: float | None = None) -> None:
        settle.retry(self._claimant, msg, error, delay)

    def release(self, msg: Message) -> None:
        settle.release(self._claimant, msg)

    def refresh(self, msg: Message) -> None:
        settle.refresh(self._claimant, msg)


__all__ = ["ObjectSource"]
