"""Protocol steps as data, so one piece of protocol code runs against any world.

A protocol is a generator that yields effects (:class:`Put`, :class:`Head`, ...) and
receives each effect's result (or has its exception thrown in). :func:`run` drives it
against a real store and clock; the simulated S3 in the tests drives the very same
generator on a virtual clock with chosen request delays.

:class:`Parallel` runs several protocols at once (the real runner: on a thread pool
when given one), so a batch of requests overlaps as concurrent requests would.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from concurrent.futures import Executor
from typing import Any, TypeVar

import attrs

from ..clock import Clock
from ..storage.base import Store

T = TypeVar("T")


@attrs.frozen
class Put:
    """Write ``body`` at ``key``. ``retry_by`` (the protocol clock's monotonic seconds):
    the first attempt goes at once, but no retry leaves after it (DeadlineExceeded): a
    write whose safety rests on landing soon after a check must not be sent again later
    (a csprng claim)."""

    key: str
    body: bytes
    if_none_match: bool = False
    if_match: str | None = None
    retry_by: float | None = None


@attrs.frozen
class Head:
    key: str


@attrs.frozen
class Get:
    key: str


@attrs.frozen
class Delete:
    """Delete ``key``; ``retry_by`` as for :class:`Put`."""

    key: str
    if_match: str | None = None
    retry_by: float | None = None


@attrs.frozen
class List:
    """The objects under ``prefix`` sorting after ``start_after`` (all pages, or the
    first ``limit`` objects); the result is a ``storage.base.Listing`` whose objects
    carry each key's ETag."""

    prefix: str
    start_after: str | None = None
    limit: int | None = None


@attrs.frozen
class Sleep:
    seconds: float


@attrs.frozen
class Now:
    """Read the client's monotonic clock (seconds): how a protocol measures its own
    delays, e.g. how old a listing it relies on has become."""


@attrs.frozen(eq=False)
class Parallel:
    """Run ``branches`` (protocols) concurrently; the result is their results in order.
    If a branch raises, the first such error is raised once every branch has ended."""

    branches: tuple[Generator[Any, Any, Any], ...]


Effect = Put | Head | Get | Delete | List | Sleep | Now | Parallel
Protocol = Generator[Effect, Any, T]


def perform(effect: Effect, store: Store, clock: Clock, pool: Executor | None = None) -> Any:
    """Carry out one effect for real; :class:`Parallel` branches run on ``pool`` (one
    after the other without one)."""
    if isinstance(effect, Put):
        return store.put(
            effect.key, effect.body, if_none_match=effect.if_none_match, if_match=effect.if_match,
            **_retry_bound(effect.retry_by, clock),
        )
    if isinstance(effect, Head):
        return store.head(effect.key)
    if isinstance(effect, Get):
        return store.get(effect.key)
    if isinstance(effect, Delete):
        return store.delete(effect.key, if_match=effect.if_match,
                            **_retry_bound(effect.retry_by, clock))
    if isinstance(effect, List):
        return store.list(effect.prefix, limit=effect.limit, start_after=effect.start_after)
    if isinstance(effect, Sleep):
        return clock.sleep(effect.seconds)
    if isinstance(effect, Now):
        return clock.monotonic()
    if isinstance(effect, Parallel):
        return _parallel(effect.branches, store, clock, pool)
    raise TypeError(f"unknown effect {effect!r}")


def _retry_bound(retry_by: float | None, clock: Clock) -> dict[str, float]:
    """The ``retry_by`` keyword when there is one (a store without it is never sent it),
    moved from ``clock``'s time to :func:`time.monotonic`'s, which the stores that retry
    (S3) measure by: a protocol clock may count from any origin (or be a fake one), and
    the time left is what must carry over."""
    if retry_by is None:
        return {}
    return {"retry_by": time.monotonic() + (retry_by - clock.monotonic())}


def _parallel(
    branches: tuple[Protocol[Any], ...], store: Store, clock: Clock, pool: Executor | None
) -> list[Any]:
    """Run every branch to its end, on ``pool`` if there is one and more than one branch.
    Branches get no pool: a nested Parallel runs in line rather than wait on its own pool."""
    if pool is None or len(branches) < 2:
        outcomes = [_outcome(b, store, clock) for b in branches]
    else:
        futures = [pool.submit(_outcome, b, store, clock) for b in branches]
        outcomes = [f.result() for f in futures]
    for _, error in outcomes:
        if error is not None:
            raise error
    return [value for value, _ in outcomes]


def _outcome(protocol: Protocol[T], store: Store, clock: Clock) -> tuple[Any, Exception | None]:
    """(result, None) or (None, the exception the protocol raised)."""
    try:
        return run(protocol, store, clock), None
    except Exception as exc:
        return None, exc


def run(protocol: Protocol[T], store: Store, clock: Clock, pool: Executor | None = None) -> T:
    """Drive a protocol generator to completion against a store and a clock; ``pool``
    runs the branches of :class:`Parallel` effects."""
    try:
        effect = next(protocol)
        while True:
            try:
                result = perform(effect, store, clock, pool)
            except Exception as exc:  # hand the failure to the protocol to decide
                effect = protocol.throw(exc)
            else:
                effect = protocol.send(result)
    except StopIteration as stop:
        return stop.value
