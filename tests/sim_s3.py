"""A deterministic simulated S3 for protocol generators (see pawn_queue_sync.protocol).

Actors are protocol generators yielding Put/Head/Get/Delete/List/Sleep/Now/Parallel
effects. Each request travels to the server with a one-way delay, is applied there at
its arrival time on the virtual clock, and its answer travels back with another delay;
both delays are chosen by the test, per actor and per request. Sleep advances only that
actor's time; Now answers the virtual time at once. Parallel runs its branches as
concurrent requests: each branch's requests draw the next delays of the actor in the
order they are sent, and the actor resumes when the last branch ends. Events at the
same virtual time run in the order they were scheduled, so a run is a pure function of
its inputs.

Retries: a request's delays may name a third figure, ``resend``: the attempts before
never reached the server (a reset, a timeout) and the client's S3 layer sends the one
that does ``resend`` seconds after the request was made. A Put or Delete with a
``retry_by`` gets DeadlineExceeded instead when that retry would leave after it (the
first attempt always goes), as the real stores do; with ``honour_retry_by=False`` the
model ignores ``retry_by`` (a client without it). ``early`` names (actor, request
index) pairs whose client learns of a failure at once, before the request arrives (a
reset after it went out through an intermediary): the request is still applied after
its delay, and a Put or Delete with a ``retry_by`` gets DeadlineExceeded at once (its
retry refused).

The server: last-writer-wins objects, ETag = md5 of the body (or, with ``opaque_etags``,
a fresh value per write), read-after-write, and
If-None-Match / If-Match honoured only when the flag says so (a server that ignores
them simply applies the write). LastModified and Date may be truncated to
``time_resolution`` seconds, as real servers do (SeaweedFS: 1 s).

A List answers every key under the prefix as it stands when the request arrives (a
read-after-write consistent listing, one snapshot). Every applied mutation is logged
with the version it replaced (a branch's under its actor's name), so tests can ask who
overwrote or deleted whose lease.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Generator, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import attrs

from pawn_queue_sync.encoding import md5_hex
from pawn_queue_sync.errors import ConditionFailed, DeadlineExceeded, ObjectNotFound
from pawn_queue_sync.protocol.effects import (
    Delete,
    Effect,
    Get,
    Head,
    List,
    Now,
    Parallel,
    Put,
    Sleep,
)
from pawn_queue_sync.storage.base import GetResult, Listing, ObjectInfo, PutResult
from pawn_queue_sync.storage.listing import build_listing

ORIGIN = datetime(2026, 1, 1, tzinfo=timezone.utc)

#: One request's delays: a number (both ways), (to_server, back), or (to_server, back,
#: resend): the attempt that reaches the server leaves ``resend`` s after the request.
Delay = float | tuple[float, float] | tuple[float, float, float]
#: Per actor: one Delay for every request, a list (item i for request i, the last one
#: repeats), or a function of (request index, effect).
DelaySpec = Delay | Sequence[Delay] | Callable[[int, Effect], Delay]


@attrs.frozen
class Version:
    """One stored version of an object."""

    body: bytes
    etag: str
    written_at: float  # exact virtual time the write was applied
    writer: str


@attrs.frozen
class Applied:
    """A mutation the server applied (a failed condition applies nothing and is not logged)."""

    at: float
    actor: str
    op: str  # "put" or "delete"
    key: str
    before: Version | None
    after: Version | None


@attrs.define
class Outcome:
    """How an actor's protocol ended: its return value or the exception it raised."""

    value: Any = None
    error: BaseException | None = None
    finished_at: float | None = None
    requests: int = 0

    @property
    def done(self) -> bool:
        return self.finished_at is not None


#: Called with (value, error) when a Parallel branch ends.
_Join = Callable[[Any, "BaseException | None"], None]


@attrs.define
class _Actor:
    name: str
    gen: Generator[Effect, Any, Any]
    delays: DelaySpec
    outcome: Outcome = attrs.field(factory=Outcome)
    #: A Parallel branch: the actor whose delays and request count it shares, and what
    #: to call when it ends (instead of setting its outcome).
    root: _Actor | None = None
    join: _Join | None = None

    @property
    def counter(self) -> Outcome:
        """Where this actor's requests are counted (and its delays indexed)."""
        return (self.root or self).outcome


class SimS3:
    """The simulated server plus the scheduler that drives the actors."""

    def __init__(
        self, *, if_none_match: bool = True, if_match: bool = True, time_resolution: float = 0.0,
        opaque_etags: bool = False, honour_retry_by: bool = True,
        early: set[tuple[str, int]] | None = None,
    ) -> None:
        self.honour_retry_by = honour_retry_by
        self.early = early or set()
        self.if_none_match = if_none_match
        #: ETags unrelated to the bytes (SSE-KMS, some gateways): one fresh value per write
        self.opaque_etags = opaque_etags
        self._writes = itertools.count()
        self.if_match = if_match
        self.time_resolution = time_resolution
        self.now = 0.0
        self.objects: dict[str, Version] = {}
        self.log: list[Applied] = []
        self.actors: dict[str, _Actor] = {}
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    # -- the test's side ----------------------------------------------------------------

    def spawn(
        self,
        name: str,
        protocol: Generator[Effect, Any, Any],
        *,
        start: float = 0.0,
        delays: DelaySpec = 0.0,
    ) -> Outcome:
        """Start ``protocol`` at virtual time ``start``; returns its (live) outcome."""
        if name in self.actors:
            raise ValueError(f"actor {name!r} exists")
        actor = _Actor(name, protocol, delays)
        self.actors[name] = actor
        self._at(start, lambda: self._step(actor, None, None, first=True))
        return actor.outcome

    def run(self, until: float = math.inf) -> dict[str, Outcome]:
        """Process events up to virtual time ``until``; returns every actor's outcome."""
        while self._queue and self._queue[0][0] <= until:
            when, _, action = heapq.heappop(self._queue)
            self.now = when
            action()
        return self.outcomes

    @property
    def outcomes(self) -> dict[str, Outcome]:
        return {name: a.outcome for name, a in self.actors.items()}

    def wall(self, t: float | None = None) -> datetime:
        """The server's time as a datetime, truncated to ``time_resolution``."""
        t = self.now if t is None else t
        if self.time_resolution:
            t = math.floor(t / self.time_resolution) * self.time_resolution
        return ORIGIN + timedelta(seconds=t)

    # -- scheduling -----------------------------------------------------------------------

    def _at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (when, next(self._seq), action))

    def _delay(self, actor: _Actor, effect: Effect) -> tuple[float, float, float]:
        """(to the server, back, resend) of the actor's next request."""
        spec, i = actor.delays, actor.counter.requests
        if callable(spec):
            d = spec(i, effect)
        elif isinstance(spec, Sequence) and not isinstance(spec, tuple):
            d = spec[min(i, len(spec) - 1)]
        else:
            d = spec
        to, back, *more = (d, d) if isinstance(d, (int, float)) else d
        resend = more[0] if more else 0.0
        if to < 0 or back < 0 or resend < 0:
            raise ValueError("delays cannot be negative")
        return float(to), float(back), float(resend)

    def _step(self, actor: _Actor, result: Any, error: BaseException | None, first=False) -> None:
        """Resume the actor with a result (or an exception) and schedule its next effect."""
        try:
            if first:
                effect = next(actor.gen)
            elif error is not None:
                effect = actor.gen.throw(error)
            else:
                effect = actor.gen.send(result)
        except StopIteration as stop:
            self._end(actor, stop.value, None)
            return
        except Exception as exc:  # the protocol raised: that is its outcome
            self._end(actor, None, exc)
            return
        if isinstance(effect, Sleep):
            self._at(self.now + max(0.0, effect.seconds), lambda: self._step(actor, None, None))
            return
        if isinstance(effect, Now):
            self._at(self.now, lambda: self._step(actor, self.now, None))
            return
        if isinstance(effect, Parallel):
            self._fork(actor, effect.branches)
            return
        early = (actor.name, actor.counter.requests) in self.early and getattr(
            effect, "retry_by", None) is not None
        to, back, resend = self._delay(actor, effect)
        actor.counter.requests += 1
        retry_by = getattr(effect, "retry_by", None) if self.honour_retry_by else None
        if resend > 0 and retry_by is not None and self.now + resend > retry_by:
            late = DeadlineExceeded("the retry-by time comes before the attempt",
                                    key=getattr(effect, "key", None))
            when = max(self.now, min(self.now + resend, retry_by))
            self._at(when, lambda: self._step(actor, None, late))
            return

        def arrive() -> None:
            try:
                res, err = self._apply(actor.name, effect), None
            except (ObjectNotFound, ConditionFailed) as exc:
                res, err = None, exc
            if not early:  # else the client has already been told of a failure
                self._at(self.now + back, lambda: self._step(actor, res, err))

        self._at(self.now + resend + to, arrive)
        if early:
            cut = DeadlineExceeded("reset; the retry-by time comes before attempt 2",
                                   key=getattr(effect, "key", None))
            self._at(self.now, lambda: self._step(actor, None, cut))

    def _end(self, actor: _Actor, value: Any, error: BaseException | None) -> None:
        if actor.join is not None:
            actor.join(value, error)
            return
        actor.outcome.value, actor.outcome.error = value, error
        actor.outcome.finished_at = self.now

    def _fork(self, actor: _Actor, branches: tuple[Generator[Effect, Any, Any], ...]) -> None:
        """Start every branch now, as actors of their own sharing ``actor``'s name and
        delays; resume ``actor`` with their results (or the first error) after the last."""
        results: list[Any] = [None] * len(branches)
        errors: list[BaseException | None] = [None] * len(branches)
        left = [len(branches)]

        def joiner(i: int) -> _Join:
            def join(value: Any, error: BaseException | None) -> None:
                results[i], errors[i] = value, error
                left[0] -= 1
                if not left[0]:
                    first = next((e for e in errors if e is not None), None)
                    self._step(actor, None if first else results, first)

            return join

        if not branches:
            self._at(self.now, lambda: self._step(actor, [], None))
        for i, gen in enumerate(branches):
            branch = _Actor(actor.name, gen, actor.delays, root=actor.root or actor,
                            join=joiner(i))
            self._at(self.now, lambda b=branch: self._step(b, None, None, first=True))

    # -- the server ---------------------------------------------------------------------------

    def _apply(self, actor: str, effect: Effect) -> Any:
        cur = self.objects.get(getattr(effect, "key", ""))
        if isinstance(effect, Put):
            if self.if_none_match and effect.if_none_match and cur is not None:
                raise ConditionFailed("put: exists", key=effect.key)
            if self.if_match and effect.if_match is not None and (
                cur is None or cur.etag != effect.if_match
            ):
                raise ConditionFailed("put: etag differs", key=effect.key)
            etag = (md5_hex(b"write %d" % next(self._writes)) if self.opaque_etags
                    else md5_hex(effect.body))
            new = Version(effect.body, etag, self.now, actor)
            self._mutate(actor, "put", effect.key, cur, new)
            return PutResult(effect.key, new.etag, self.wall())
        if isinstance(effect, Delete):
            if self.if_match and effect.if_match is not None and (
                cur is None or cur.etag != effect.if_match
            ):
                raise ConditionFailed("delete: etag differs", key=effect.key)
            if cur is not None:
                self._mutate(actor, "delete", effect.key, cur, None)
            return None
        if isinstance(effect, List):
            return self._list(effect.prefix, effect.start_after, effect.limit)
        if cur is None:
            raise ObjectNotFound("no such key", key=effect.key)
        if isinstance(effect, Head):
            return ObjectInfo(effect.key, cur.etag, len(cur.body), self.wall(cur.written_at))
        if isinstance(effect, Get):
            return GetResult(
                effect.key, cur.body, cur.etag, self.wall(cur.written_at), self.wall()
            )
        raise TypeError(f"unknown effect {effect!r}")

    def _list(self, prefix: str, start_after: str | None, limit: int | None) -> Listing:
        """The keys under ``prefix`` after ``start_after`` as they stand now, in byte
        order, the first ``limit`` of them (one atomic snapshot, as one page is)."""

        def info(key: str) -> ObjectInfo:
            v = self.objects[key]
            return ObjectInfo(key, v.etag, len(v.body), self.wall(v.written_at))

        return build_listing(sorted(self.objects), info, prefix, limit, None, self.wall(),
                             start_after)

    def _mutate(
        self, actor: str, op: str, key: str, before: Version | None, after: Version | None
    ) -> None:
        if after is None:
            del self.objects[key]
        else:
            self.objects[key] = after
        self.log.append(Applied(self.now, actor, op, key, before, after))
