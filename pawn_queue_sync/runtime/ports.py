"""What the runtime needs of a consumer and of a message: small Protocols.

The runtime sits below the queue layer (``queue.consumer`` builds listeners), so it
names the queue's types only through these; :class:`~pawn_queue_sync.Consumer` and
:class:`~pawn_queue_sync.Message` satisfy them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from ..clock import Clock

__all__ = ["MessagePort", "PollingPort", "ContextPort", "ConsumerPort", "Handler"]


class MessagePort(Protocol):
    """A claimed message (hashable by identity, like :class:`~pawn_queue_sync.Message`)."""

    @property
    def id(self) -> str: ...
    @property
    def topic(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def delivery_count(self) -> int: ...
    @property
    def lease_token(self) -> str: ...
    @property
    def lease_written_at(self) -> float: ...
    #: the handler's run time, set by the runtime (events report it)
    handler_seconds: float | None


class PollingPort(Protocol):
    """The ``polling`` settings the runtime reads."""

    @property
    def interval_seconds(self) -> float: ...
    @property
    def jitter_max_ms(self) -> int: ...
    @property
    def max_messages_per_poll(self) -> int: ...
    @property
    def max_delivery_count(self) -> int: ...
    @property
    def lease_refresh_interval_seconds(self) -> float: ...
    @property
    def claim_threads(self) -> int: ...


class _ConfigPort(Protocol):
    @property
    def polling(self) -> PollingPort: ...


class _PoolPort(Protocol):
    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Future[Any]: ...


class ContextPort(Protocol):
    """What a started queue shares: settings, clock, lease timing, thread pools."""

    @property
    def config(self) -> _ConfigPort: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def visibility(self) -> float: ...
    def fence_margin(self) -> float: ...
    def pool(self, name: str, workers: int) -> _PoolPort: ...


class ConsumerPort(Protocol):
    """The consumer calls a listener, a refresher and :func:`drain` make."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def topics(self) -> Sequence[str]: ...
    @property
    def context(self) -> ContextPort: ...
    def poll(self, max_messages: int | None = None) -> Sequence[Any]: ...
    def refresh(self, msg: Any) -> None: ...
    def release(self, msg: Any) -> None: ...
    def retry(self, msg: Any, error: str | None = None) -> None: ...
    def nack(self, msg: Any, reason: str | None = None) -> None: ...
    def ack_many(self, msgs: Iterable[Any]) -> None: ...
    def lease_age(self, msg: Any) -> float: ...
    def give_back(self) -> None:
        """Give back held segments of packed topics with no message out (never raises
        a store error: they go stale instead)."""


#: A message handler: called with each message; returning acks it, raising retries it.
Handler = Callable[[Any], Any]
