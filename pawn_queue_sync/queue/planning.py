"""Which messages a poll of one topic tries to claim: pure functions of what the
listings showed and what the consumer's earlier polls there remember (a
:class:`TopicState`). No store, no clock: tested on their own (tests/test_planning.py).

Alone on a topic, a consumer takes the oldest messages. With rivals about (a poll lost
claims, or saw leases that are not ours) it picks among a window _CONTENDED_WINDOW
times wider: at random for conditional_write claims, as a run of ids adjacent in id
order for csprng_verify batches (their lease keys are then adjacent too, and a batch's
verification listings span only its share of the leases).
"""

from __future__ import annotations

import bisect
import random
import uuid
from collections.abc import Callable, Sequence

import attrs

from .. import layout
from ..protocol import lease as leases
from ..storage.base import DELETE_BATCH, ObjectInfo

#: With rivals about, a poll picks its claims at random among this many times more
#: candidates than it wants, so consumers polling together rarely race for one key.
CONTENDED_WINDOW = 16
#: Keys a message listing reaches beyond the window and the held ones (foreign objects,
#: messages published meanwhile before the held ones).
LIST_SLACK = 8
#: A consumer's share of scarce candidates (see :func:`run_of`) is at least this many:
#: each poll waits out the jitter, so a backlog's last messages drained a few at a time
#: would take many polls.
MIN_SHARE = 32

#: A message a poll may claim: its key and its id.
Candidate = tuple[str, str]


@attrs.define
class TopicState:
    """What a consumer's polls of one topic remember for the next."""

    #: live leases our last poll there saw (how far the next listing must reach)
    leases_seen: int = 0
    #: our last poll with candidates there saw rivals: lost claims, or leases not
    #: ours; None until such a poll
    contended: bool | None = None
    #: our last poll there found no pending message (a first poll counts as idle)
    idle: bool = True
    #: the message id our last batch claim's run ended at ("": the last id was
    #: reached, the next run starts from the first; None: no run yet)
    cursor: str | None = None
    #: the lister of our batch claims' lease ranges (keeps its estimate of how
    #: crowded they are from one batch to the next)
    ranges: leases.KeyRange | None = None

    def listed(self, live: int, pending: bool) -> None:
        """A poll listed ``live`` live leases and found pending messages or not."""
        self.leases_seen = live
        self.idle = not pending

    def claimed(self, rivals: bool, got: int, tried: int, rng: random.Random) -> None:
        """A poll tried ``tried`` claims and won ``got``; ``rivals``: it saw leases not
        ours. A loss means we met a rival's run: the next run starts at a random id."""
        self.contended = rivals or got < tried
        if got < tried and self.cursor is not None:
            self.cursor = id_at(rng.random())


def window(want: int, held: int, wide: bool) -> int:
    """How many free candidates to pick ``want`` from: ``want`` (oldest first), or
    with rivals about CONTENDED_WINDOW times as many, as far as one listing page
    (with the ``held`` keys in it) reaches: a page of 1,000 keys costs the server
    ~40 ms of CPU on SeaweedFS, so more pages would cost more than lost claims."""
    if not wide:
        return want
    return max(want, min(want * CONTENDED_WINDOW, DELETE_BATCH - held - LIST_SLACK))


def listing_limit(window: int, held: int) -> int:
    """How many message keys to list so ``window`` free ones remain past ``held``."""
    return window + held + LIST_SLACK


def candidates_in(
    topic: str, objects: Sequence[ObjectInfo], live: set[str], window: int
) -> tuple[list[Candidate], list[ObjectInfo]]:
    """The free candidates of a message listing, at most ``window``, in listing order,
    and the foreign objects met before the window filled (not message keys: to be
    moved aside). One candidate per message id, the oldest: two objects with one id
    (a publish retried without created_at) share one lease key, so one is claimed,
    and the other once the first is settled and its lease gone."""
    candidates: list[Candidate] = []
    foreign: list[ObjectInfo] = []
    taken = set(live)
    for info in objects:
        mid = layout.parse_message_key(topic, info.key)
        if mid is None:
            foreign.append(info)
        elif mid not in taken:
            taken.add(mid)
            candidates.append((info.key, mid))
        if len(candidates) >= window:
            break
    return candidates, foreign


def run_of(
    candidates: Sequence[Candidate], want: int, cursor: str | None, place: int, peers: int
) -> tuple[list[Candidate], str]:
    """``want`` candidates adjacent in message id order, and the cursor the next run
    carries on from. Each run carries on after the last one (``cursor``), so
    consumers sweeping the id space at one pace keep apart: the first starts at our
    share of the id space by ``place`` (our rank) among ``peers`` registered
    consumers; one that reached the last id is followed by one from the first. None
    takes more than its share of scarce candidates (at least MIN_SHARE)."""
    ordered = sorted(candidates, key=lambda c: c[1])
    want = min(want, max(-(-len(ordered) // peers), MIN_SHARE))
    if cursor is None:
        cursor = id_at(place / peers)
    start = bisect.bisect_right([mid for _, mid in ordered], cursor)
    start = max(0, min(start, len(ordered) - want))  # near the end: the last `want`
    run = ordered[start : start + want]
    return run, (run[-1][1] if start + want < len(ordered) else "")


def choose(
    state: TopicState,
    candidates: list[Candidate],
    want: int,
    *,
    runs: bool,
    peers: Callable[[], tuple[int, int]],
    rng: random.Random,
) -> list[Candidate]:
    """The candidates to claim: a run (see :func:`run_of`; ``runs``: batch claims
    among rivals; ``peers`` gives our rank and the number of consumers), else
    ``want`` at random among them, else all."""
    if runs:
        place, count = peers()
        chosen, state.cursor = run_of(candidates, want, state.cursor, place, count)
        return chosen
    if len(candidates) > want:
        return rng.sample(candidates, want)
    return candidates


def id_at(fraction: float) -> str:
    """The message id (a uuid string, as ids compare) at ``fraction`` of the id space."""
    return str(uuid.UUID(int=min(int(fraction * 2**128), 2**128 - 1)))


__all__ = [
    "CONTENDED_WINDOW",
    "LIST_SLACK",
    "MIN_SHARE",
    "Candidate",
    "TopicState",
    "candidates_in",
    "choose",
    "id_at",
    "listing_limit",
    "run_of",
    "window",
]
