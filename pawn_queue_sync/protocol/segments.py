"""Segment leases: one lease per segment object, with each message's progress inside.

A segment (``{topic}/segments/...seg``) carries many messages; one consumer holds it
through one lease object ``{topic}/segment-leases/{segment_id}.lease``. The lease body
is pawn-queue's lease fields (``message_id`` is the segment id) plus ``segment_key``,
``released`` and ``progress``: which messages are settled (acked, nacked,
dead-lettered), how many deliveries each has started, and the last retry error of the
unsettled ones (:class:`Progress`). The rules (docs/guarantees.md, Packed topics):

1. a hand-out is recorded (a lease write counting the delivery) before it happens;
2. a settlement is recorded (a lease write containing it) before it is reported;
3. a stale or released lease is taken over by rewriting it with the same progress,
   conditional on the ETag seen (:func:`take_over`), so progress is never lost: a lease
   is never deleted while its segment exists;
4. once every message is settled, the segment is deleted, then the lease
   (:func:`finish`).

The protocols here are effect generators (:mod:`.effects`), as :mod:`.lease`'s, which
they reuse: a claim is :func:`.lease.claim`, a record or a takeover is
:func:`.lease.refresh` (``If-Match``; without it, check-write-confirm), a give-back is
:func:`.lease.release`.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import json
import random
import re
import secrets
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import Any

import attrs

from ..encoding import canonical_json, iso, md5_hex
from ..errors import DeadlineExceeded, LeaseLostError, ObjectNotFound, SegmentError
from . import lease as leases
from . import runs as _runs
from .effects import Delete, Get, Protocol

__all__ = [
    "ERROR_CHARS",
    "Progress",
    "SegmentLease",
    "claim_segment",
    "finish",
    "load",
    "record",
    "take_over",
]

#: A recorded retry error keeps at most this many characters (the lease stays small).
ERROR_CHARS = 500
#: An index key of ``progress.errors``: ASCII digits, short enough for int() (which
#: refuses strings of more than 4300 digits, with ValueError).
_INDEX = re.compile(r"[0-9]{1,18}")

# -- progress -----------------------------------------------------------------------------


@attrs.frozen
class Progress:
    """What happened to each message of a segment, as its lease records it. Pure: every
    method returns a new Progress.

    ``settled``: half-open index ranges acked, nacked or dead-lettered (sorted, merged);
    ``deliveries``: ``(start, stop, n)`` runs, deliveries *started* per index (a
    delivery is counted before it is handed out; :meth:`release` takes back one that
    ended in a deliberate give-back); ``errors``: ``(index, text)`` of the last retry
    error of unsettled messages; ``count``: messages in the segment (None: unknown)."""

    count: int | None = None
    settled: tuple[tuple[int, int], ...] = ()
    deliveries: tuple[_runs.Run, ...] = ()
    errors: tuple[tuple[int, str], ...] = ()
    #: derived: the starts of ``settled`` and of ``deliveries`` (bisect keys), so a
    #: query costs O(log runs), not O(runs) (a lease may hold thousands of runs)
    _settled_starts: tuple[int, ...] = attrs.field(init=False, eq=False, repr=False)
    _delivery_starts: tuple[int, ...] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_settled_starts", tuple(a for a, _ in self.settled))
        object.__setattr__(self, "_delivery_starts", tuple(a for a, _, _ in self.deliveries))

    # -- queries --------------------------------------------------------------------------

    def is_settled(self, i: int) -> bool:
        k = bisect.bisect_right(self._settled_starts, i) - 1
        return k >= 0 and self.settled[k][0] <= i < self.settled[k][1]

    def deliveries_of(self, i: int) -> int:
        """Deliveries started of message ``i``."""
        return _runs.value_at(self.deliveries, self._delivery_starts, i)

    def error_of(self, i: int) -> str | None:
        return dict(self.errors).get(i)

    def unsettled(self, count: int | None = None, limit: int | None = None) -> list[int]:
        """Indexes in ``range(count)`` (default :attr:`count`) not settled, in order; the
        first ``limit`` of them only, if given (a count comes from a segment's key and
        may be huge before the segment is read: a takeover asks for a poll's few)."""
        n = self.count if count is None else count
        if n is None:
            return []
        return list(itertools.islice(self._unsettled(n), limit))

    def _unsettled(self, n: int) -> Iterator[int]:
        at = 0
        for a, b in self.settled:
            if a >= n:
                break
            yield from range(at, a)
            at = max(at, b)
        yield from range(at, n)

    def settled_count(self, count: int) -> int:
        """How many indexes in ``range(count)`` are settled (from the runs alone)."""
        return sum(min(b, count) - a for a, b in self.settled if a < count)

    @property
    def complete(self) -> bool:
        """Every message of the segment is settled (the count known)."""
        if self.count is None:
            return False
        return self.count == 0 or (
            bool(self.settled) and self.settled[0][0] == 0 and self.settled[0][1] >= self.count
        )

    # -- changes ---------------------------------------------------------------------------

    def hand_out(
        self, indexes: Iterable[int], max_delivery: int
    ) -> tuple[Progress, list[int], list[int]]:
        """Count a new delivery of each unsettled index: ``(progress, handed,
        exhausted)``. An index whose deliveries reached ``max_delivery`` is not handed
        out but ``exhausted`` (to be dead-lettered, then settled); settled indexes are
        neither. Both lists keep the order of ``indexes`` (duplicates once)."""
        handed: list[int] = []
        exhausted: list[int] = []
        for i in dict.fromkeys(indexes):
            if self.is_settled(i):
                continue
            (exhausted if self.deliveries_of(i) >= max_delivery else handed).append(i)
        deliveries = _runs.paint(self.deliveries, _runs.ranges(handed), lambda v: v + 1)
        return attrs.evolve(self, deliveries=deliveries), handed, exhausted

    def release(self, indexes: Iterable[int]) -> Progress:
        """Take back one counted delivery of each index (not below 0): a delivery given
        back on purpose, or counted ahead and never handed out."""
        deliveries = _runs.paint(self.deliveries, _runs.ranges(indexes), lambda v: max(v - 1, 0))
        return attrs.evolve(self, deliveries=deliveries)

    def settle(self, indexes: Iterable[int]) -> Progress:
        """Mark the indexes settled for good (their errors dropped)."""
        ranges = _runs.ranges(indexes)
        if not ranges:
            return self
        runs = _runs.paint([(a, b, 1) for a, b in self.settled], ranges, _runs.one)
        settled = tuple((a, b) for a, b, _ in runs)
        done = {i for a, b in ranges for i in range(a, b)}
        errors = tuple((i, t) for i, t in self.errors if i not in done)
        return attrs.evolve(self, settled=settled, errors=errors)

    def with_error(self, i: int, text: str) -> Progress:
        """Record ``text`` (cut to ERROR_CHARS) as the last error of unsettled ``i``."""
        if self.is_settled(i):
            return self
        errors = dict(self.errors)
        errors[i] = text[:ERROR_CHARS]
        return attrs.evolve(self, errors=tuple(sorted(errors.items())))

    def with_count(self, count: int) -> Progress:
        return attrs.evolve(self, count=count)

    # -- JSON ------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "settled": [[a, b] for a, b in self.settled],
            "deliveries": [[a, b, n] for a, b, n in self.deliveries],
            "errors": {str(i): t for i, t in self.errors},
        }

    @classmethod
    def from_json(cls, doc: object) -> Progress:
        """Parse and check (SegmentError names what is wrong)."""
        if not isinstance(doc, Mapping):
            raise SegmentError("progress is not a JSON object")
        count = doc.get("count")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int)
                                  or count < 0):
            raise SegmentError(f"progress.count: {count!r} is not a count")
        settled, deliveries = doc.get("settled", []), doc.get("deliveries", [])
        errors = doc.get("errors", {})
        if not isinstance(settled, list) or not isinstance(deliveries, list):
            raise SegmentError("progress.settled and progress.deliveries must be lists")
        if not isinstance(errors, Mapping):
            raise SegmentError("progress.errors must be an object")
        parsed: dict[int, str] = {}
        for k, text in errors.items():
            # ASCII digits only: str.isdigit() also accepts '²', which int() refuses
            if not (isinstance(k, str) and _INDEX.fullmatch(k) and isinstance(text, str)):
                raise SegmentError(f"progress.errors: {k[:40]!r} is not index -> text")
            parsed[int(k)] = text[:ERROR_CHARS]
        runs = _runs.normal(settled, 2, "settled")
        progress = cls(
            count=count,
            settled=tuple((a, b) for a, b, _ in runs),
            deliveries=_runs.normal(deliveries, 3, "deliveries"),
        )
        return attrs.evolve(progress, errors=tuple(
            (i, t) for i, t in sorted(parsed.items()) if not progress.is_settled(i)
        ))


# -- the lease body ------------------------------------------------------------------------

_STR_FIELDS = ("consumer_id", "message_id", "claimed_at", "expires_at", "nonce", "segment_key")


@attrs.frozen
class SegmentLease:
    """A segment lease's content (pawn-queue's lease fields, ``message_id`` being the
    segment id, plus ``segment_key``, ``released`` and ``progress``). Every version
    written has a fresh 256-bit nonce, so no two writes have the same bytes."""

    consumer_id: str
    segment_id: str
    claimed_at: str
    expires_at: str
    nonce: str
    segment_key: str
    released: bool = False
    progress: Progress = Progress()

    @classmethod
    def new(
        cls, consumer_id: str, segment_id: str, segment_key: str, now: datetime,
        visibility: float, progress: Progress,
    ) -> SegmentLease:
        return cls(
            consumer_id=consumer_id,
            segment_id=segment_id,
            claimed_at=iso(now),
            expires_at=iso(now + timedelta(seconds=visibility)),
            nonce=secrets.token_hex(32),
            segment_key=segment_key,
            progress=progress,
        )

    @property
    def message_id(self) -> str:
        """The segment id (what :func:`.lease.refresh` names in LeaseLostError)."""
        return self.segment_id

    def rewritten(
        self, now: datetime, visibility: float, progress: Progress, *,
        consumer_id: str | None = None, released: bool = False,
    ) -> SegmentLease:
        """The next version: ``progress``, a new expiry and nonce; ``consumer_id`` for a
        takeover (then claimed now); ``released`` for a give-back."""
        taken = consumer_id is not None and consumer_id != self.consumer_id
        return attrs.evolve(
            self,
            consumer_id=consumer_id or self.consumer_id,
            claimed_at=iso(now) if taken else self.claimed_at,
            expires_at=iso(now + timedelta(seconds=visibility)),
            nonce=secrets.token_hex(32),
            released=released,
            progress=progress,
        )

    def encode(self) -> bytes:
        return canonical_json({
            "consumer_id": self.consumer_id,
            "message_id": self.segment_id,
            "claimed_at": self.claimed_at,
            "expires_at": self.expires_at,
            "nonce": self.nonce,
            "segment_key": self.segment_key,
            "released": self.released,
            "progress": self.progress.to_json(),
        })

    @property
    def token(self) -> str:
        """The MD5 of the bytes: a write's token only when the server gave no ETag."""
        return md5_hex(self.encode())

    @classmethod
    def decode(cls, raw: bytes) -> SegmentLease:
        """Parse a lease body; SegmentError names what is wrong."""
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
            raise SegmentError(f"segment lease is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise SegmentError("segment lease is not a JSON object")
        bad = [f for f in _STR_FIELDS if not isinstance(doc.get(f), str)]
        if bad:
            raise SegmentError(f"segment lease: field(s) {', '.join(bad)} missing or not text")
        released = doc.get("released", False)
        if not isinstance(released, bool):
            raise SegmentError("segment lease: released is not a boolean")
        return cls(
            consumer_id=doc["consumer_id"],
            segment_id=doc["message_id"],
            claimed_at=doc["claimed_at"],
            expires_at=doc["expires_at"],
            nonce=doc["nonce"],
            segment_key=doc["segment_key"],
            released=released,
            progress=Progress.from_json(doc.get("progress", {})),
        )


# -- protocols -------------------------------------------------------------------------------


def claim_segment(
    caps: leases.Capabilities, key: str, lease: SegmentLease,
    csprng: leases.CsprngSettings, rng: random.Random | None = None,
) -> Protocol[str | None]:
    """Claim a segment nobody holds (no lease at ``key``): :func:`.lease.claim` with our
    first lease (its progress counts the first hand-out). Our token, or None (lost);
    a write that failed raises the store's error (DeadlineExceeded when a csprng
    lease write's retry was refused and nothing landed)."""
    return leases.claim(caps, key, lease, csprng, rng)


def load(key: str) -> Protocol[tuple[SegmentLease, str] | None]:
    """GET a segment lease: (its body, its ETag), or None if there is none. A body that
    cannot be read raises SegmentError."""
    try:
        got = yield Get(key)
    except ObjectNotFound:
        return None
    return SegmentLease.decode(got.body), got.etag


def take_over(
    caps: leases.Capabilities, key: str, seen_etag: str, lease: SegmentLease,
    csprng: leases.CsprngSettings,
) -> Protocol[str | None]:
    """Replace the stale or released lease version ``seen_etag`` (read by :func:`load`)
    with ``lease``: ours, carrying the same progress plus our hand-out. ``If-Match``
    the seen ETag; without If-Match, check-write-confirm as :func:`.lease.refresh`.
    Our token, or None when the lease changed since it was read (someone else took
    it over, or its holder was alive after all), or when our write could not be sent
    in time and did not land (the stale version stays for a later take-over)."""
    try:
        return (yield from leases.refresh(key, seen_etag, lease, caps, csprng))
    except (LeaseLostError, DeadlineExceeded):
        return None


def record(
    caps: leases.Capabilities, key: str, token: str, lease: SegmentLease,
    csprng: leases.CsprngSettings,
) -> Protocol[str]:
    """Write ``lease`` (new progress, new expiry) over our version ``token``: the new
    token. Raises LeaseLostError when the lease is no longer ours (nothing written)."""
    return (yield from leases.refresh(key, token, lease, caps, csprng))


def finish(
    caps: leases.Capabilities, key: str, token: str, segment_key: str,
    csprng: leases.CsprngSettings | None = None,
) -> Protocol[None]:
    """A segment whose every message is settled (that progress recorded): delete it,
    then our lease (only while it is ``token``; ``csprng`` bounds that release without
    If-Match). A segment already gone is fine; a lease no longer ours is left to
    whoever holds it (it finds the segment gone)."""
    with contextlib.suppress(ObjectNotFound):
        yield Delete(segment_key)
    yield from leases.release(key, token, caps, csprng)
