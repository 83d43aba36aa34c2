"""Protocol steps as data, so one piece of protocol code runs against any world.

A protocol is a generator that yields effects (:class:`Put`, :class:`Head`, ...) and
receives each effect's result (or has its exception thrown in). :func:`run` drives it
against a real store and clock; the simulated S3 in the tests drives the very same
generator on a virtual clock with chosen request delays.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, TypeVar

import attrs

from ..clock import Clock
from ..storage.base import Store

T = TypeVar("T")


@attrs.frozen
class Put:
    key: str
    body: bytes
    if_none_match: bool = False
    if_match: str | None = None


@attrs.frozen
class Head:
    key: str


@attrs.frozen
class Get:
    key: str


@attrs.frozen
class Delete:
    key: str
    if_match: str | None = None


@attrs.frozen
class Sleep:
    seconds: float


Effect = Put | Head | Get | Delete | Sleep
Protocol = Generator[Effect, Any, T]


def perform(effect: Effect, store: Store, clock: Clock) -> Any:
    """Carry out one effect for real."""
    if isinstance(effect, Put):
        return store.put(
            effect.key, effect.body, if_none_match=effect.if_none_match, if_match=effect.if_match
        )
    if isinstance(effect, Head):
        return store.head(effect.key)
    if isinstance(effect, Get):
        return store.get(effect.key)
    if isinstance(effect, Delete):
        return store.delete(effect.key, if_match=effect.if_match)
    if isinstance(effect, Sleep):
        return clock.sleep(effect.seconds)
    raise TypeError(f"unknown effect {effect!r}")


def run(protocol: Protocol[T], store: Store, clock: Clock) -> T:
    """Drive a protocol generator to completion against a store and a clock."""
    try:
        effect = next(protocol)
        while True:
            try:
                result = perform(effect, store, clock)
            except Exception as exc:  # hand the failure to the protocol to decide
                effect = protocol.throw(exc)
            else:
                effect = protocol.send(result)
    except StopIteration as stop:
        return stop.value
