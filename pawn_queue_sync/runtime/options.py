"""The options of a listener (:class:`ListenOptions`), one convention for durations:
``*_seconds``. The names used before (``shutdown_timeout``, ``idle_timeout``, ...)
are accepted as deprecated aliases (a DeprecationWarning names the new one).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Collection, Mapping
from typing import Any

import attrs

__all__ = ["ListenOptions", "DEPRECATED_ALIASES", "resolve_options", "option_names",
           "renamed", "renamed_value", "warn_renamed", "Default", "check_duration"]

#: Old keyword -> its ``*_seconds`` name (accepted with a DeprecationWarning).
DEPRECATED_ALIASES: Mapping[str, str] = {
    "shutdown_timeout": "shutdown_timeout_seconds",
    "idle_timeout": "idle_timeout_seconds",
    "ack_flush_interval": "ack_flush_interval_seconds",
    "poll_coalesce": "poll_coalesce_seconds",
    "retry_backoff": "retry_backoff_seconds",
    "retry_backoff_max": "retry_backoff_max_seconds",
}


class Default(float):
    """The default value of a renamed duration parameter: a float that a function can
    tell from the same number passed explicitly (``isinstance(value, Default)``), so
    that the deprecated name and the new one both given is refused even when the new
    one was given its default's value. Shows as the number (in ``help()``, signatures)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return float.__repr__(self)


def check_duration(name: str, value: float | None, *, optional: bool = False) -> None:
    """A duration must be a finite number of seconds (None too when ``optional``): inf
    or nan would crash a thread's wait later (OverflowError) instead of failing here."""
    if value is None and optional:
        return
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number of seconds"
                         f"{' or None' if optional else ''}, got {value!r}")


#: ListenOptions fields that are durations, and whether None is allowed (no limit)
_DURATIONS: Mapping[str, bool] = {
    "idle_timeout_seconds": True,
    "shutdown_timeout_seconds": False,
    "handler_timeout_seconds": True,
    "ack_flush_interval_seconds": False,
    "poll_coalesce_seconds": False,
    "retry_backoff_seconds": False,
    "retry_backoff_max_seconds": False,
}


@attrs.frozen(kw_only=True)
class ListenOptions:
    """How a :class:`~pawn_queue_sync.runtime.Listener` runs (every duration in
    seconds). Pass one to :meth:`Consumer.listen <pawn_queue_sync.Consumer.listen>`,
    :class:`~pawn_queue_sync.runtime.Listener` or
    ``WorkerPool(listener_options=...)``, or the same names as keywords.

    - ``max_workers``: handler threads.
    - ``max_messages``: stop after this many handler calls (None: no limit).
    - ``idle_timeout_seconds``: stop after this long with nothing to do (None: never).
    - ``shutdown_timeout_seconds``: how long running handlers get at stop.
    - ``handler_timeout_seconds``: give up on a handler call running longer (None: no
      limit; see :class:`~pawn_queue_sync.runtime.Listener`).
    - ``install_signal_handlers``: SIGTERM and SIGINT stop the listener gracefully
      (only when ``run()`` is called in the main thread).
    - ``ack_batch_size``, ``ack_flush_interval_seconds``: acks are batched.
    - ``poll_coalesce_seconds``: with fewer than half the workers free, wait up to this
      long for more before polling.
    - ``retry_backoff_seconds`` (doubling per delivery), ``retry_backoff_max_seconds``.
    - ``name``: names the listener's threads and log lines (default: the consumer's).
    """

    max_workers: int = 4
    max_messages: int | None = None
    idle_timeout_seconds: float | None = None
    shutdown_timeout_seconds: float = 30.0
    handler_timeout_seconds: float | None = None
    install_signal_handlers: bool = False
    ack_batch_size: int = 100
    ack_flush_interval_seconds: float = 0.05
    poll_coalesce_seconds: float = 0.05
    retry_backoff_seconds: float = 1.0
    retry_backoff_max_seconds: float = 30.0
    name: str | None = None

    def __attrs_post_init__(self) -> None:
        for field, optional in _DURATIONS.items():
            check_duration(field, getattr(self, field), optional=optional)
        if self.max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {self.max_workers!r}")
        if self.max_messages is not None and self.max_messages < 0:
            raise ValueError(f"max_messages must be >= 0, got {self.max_messages!r}")
        if not 1 <= self.ack_batch_size <= 1000:  # DeleteObjects takes at most 1,000 keys
            raise ValueError(f"ack_batch_size must be in 1..1000, got "
                             f"{self.ack_batch_size!r}")
        timeout = self.handler_timeout_seconds
        if timeout is not None and not timeout > 0:
            raise ValueError(f"handler_timeout_seconds must be > 0 or None, got "
                             f"{timeout!r}")


def option_names() -> frozenset[str]:
    """Every keyword :func:`resolve_options` takes (new names and deprecated ones)."""
    return frozenset(a.name for a in attrs.fields(ListenOptions)) | set(DEPRECATED_ALIASES)


def warn_renamed(old: str, new: str, *, stacklevel: int = 2) -> None:
    """Warn (DeprecationWarning) that the name ``old`` is deprecated for ``new``: the one
    message every deprecated ``*_seconds`` alias gives. ``stacklevel`` as
    ``warnings.warn``'s, counted from the function calling this one (2: its caller)."""
    warnings.warn(f"{old!r} is deprecated; use {new!r}", DeprecationWarning,
                  stacklevel=stacklevel + 1)


def renamed(given: Mapping[str, Any], aliases: Mapping[str, str], *,
            stacklevel: int = 3, explicit: Collection[str] = ()) -> dict[str, Any]:
    """``given`` with each deprecated name of ``aliases`` replaced by its new one (each
    warns with a DeprecationWarning); both names at once is a TypeError. ``explicit``:
    new names the caller was given as parameters of their own (not in ``given``)."""
    out: dict[str, Any] = {}
    for key, value in given.items():
        new = aliases.get(key)
        if new is not None:
            warn_renamed(key, new, stacklevel=stacklevel)
            if new in given or new in explicit:
                raise TypeError(f"both {key!r} and {new!r} given")
            key = new
        out[key] = value
    return out


def renamed_value(old: str, old_value: float | None, new: str, new_value: float, *,
                  stacklevel: int = 2) -> float:
    """The value of the parameter ``new`` whose deprecated name is ``old``:
    ``old_value`` (with a DeprecationWarning) when given (not None), else ``new_value``.
    Both given is a TypeError, as in :func:`renamed`; ``new``'s default must be a
    :class:`Default` (so giving it its default's value counts as given).
    ``stacklevel``: as :func:`warn_renamed`'s."""
    if old_value is None:
        return new_value
    warn_renamed(old, new, stacklevel=stacklevel + 1)
    if not isinstance(new_value, Default):
        raise TypeError(f"both {old!r} and {new!r} given")
    return old_value


def resolve_options(options: ListenOptions | None, kwargs: Mapping[str, Any], *,
                    stacklevel: int = 3) -> ListenOptions:
    """``options`` (or the defaults) with ``kwargs`` applied; deprecated names warn
    and are renamed; an unknown name is a TypeError (as a misspelled keyword is)."""
    if options is not None and not isinstance(options, ListenOptions):
        raise TypeError(f"options must be a ListenOptions (or None), got "
                        f"{type(options).__name__}; pass option names as keywords, "
                        f"e.g. max_workers=2")
    fields = {a.name for a in attrs.fields(ListenOptions)}
    given = renamed(kwargs, DEPRECATED_ALIASES, stacklevel=stacklevel + 1)
    unknown = sorted(set(given) - fields)
    if unknown:
        raise TypeError(f"unexpected listener option(s) {', '.join(map(repr, unknown))}; "
                        f"known: {', '.join(sorted(fields))}")
    base = options if options is not None else ListenOptions()
    return attrs.evolve(base, **given) if given else base
