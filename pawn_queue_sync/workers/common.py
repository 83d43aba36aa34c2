"""What the supervisor and its worker processes share: exit statuses, the child
consumer names, and importing a handler by name."""

from __future__ import annotations

import contextlib
import importlib
import signal
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = [
    "child_consumer_name",
    "import_handler",
    "HandlerImportError",
    "RET_OK",
    "RET_KILLED",
    "RET_IMPORT",
    "RET_CONNECT",
    "RET_CONFIG",
    "RET_START_FAILED",
    "MAX_START_FAILURES",
    "KILL_GRACE_S",
]

#: Stopped gracefully; every worker exited cleanly.
RET_OK = 0
#: Stopped hard (second signal, or workers outlived the shutdown timeout), or a worker
#: did not exit cleanly when asked to stop.
RET_KILLED = 1
#: The handler could not be imported (5, not 2: 2 is argparse's usage error, which
#: ``pawnq worker`` and ``python -m pawn_queue_sync worker`` also exit with).
RET_IMPORT = 5
#: The store could not be reached (or refused us) at startup.
RET_CONNECT = 3
#: Invalid configuration, or a topic that does not exist.
RET_CONFIG = 4
#: Workers kept failing to start (``max_start_failures`` in a row at one position, each
#: dying before its first successful poll): the pool gave up.
RET_START_FAILED = 6
#: A child's exit only (never the pool's): the store did not answer, or answered a
#: server error, at the child's start (``StorageError.transient``): an outage, which
#: the supervisor waits out with the back-off instead of counting a start failure.
RET_STORE_DOWN = 7

#: Default ``max_start_failures``: consecutive start failures of one worker position
#: after which the pool gives up (``RET_START_FAILED``) instead of restarting forever.
MAX_START_FAILURES = 5
#: How often a starting worker looks whether its first poll succeeded.
_READY_CHECK_S = 0.05

#: Seconds the parent waits beyond ``shutdown_timeout_seconds`` before SIGKILLing workers.
KILL_GRACE_S = 10.0

_SIGNALS = (signal.SIGINT, signal.SIGTERM)

#: How long the supervisor (or a child arming) waits for the stop gate's lock, held
#: for microseconds by whoever uses it, before taking its holder for dead (killed
#: while holding it): the supervisor then signals every live child as if all were
#: armed, and a child arms without the lock.
_GATE_TIMEOUT_S = 5.0


def arm(stopping: Any, armed: Any) -> bool:
    """Called by a child once its signal handlers are installed: mark it ``armed``
    (the supervisor may now signal it) and say whether the pool is already stopping.
    Under ``stopping``'s lock, as :func:`request_stop`: either the child sees the stop
    or the supervisor sees the child armed (and signals it), never neither."""
    with _gate(stopping):
        armed.value = 1
        return bool(stopping.get_obj().value)


def request_stop(stopping: Any, armed: Sequence[Any]) -> list[bool] | None:
    """Called by the supervisor at its first stop request: set ``stopping`` and say
    which children (``armed`` flags) are armed, to be signalled; the others stop as
    they arm. None if the lock could not be taken (a child killed while arming):
    signal every child."""
    with _gate(stopping) as locked:
        stopping.get_obj().value = 1
        return [bool(a.value) for a in armed] if locked else None


@contextlib.contextmanager
def _gate(stopping: Any) -> Iterator[bool]:
    """Hold ``stopping``'s lock (True), or, if it cannot be had within
    ``_GATE_TIMEOUT_S``, go on without it (False): its holder died holding it (a
    process killed while arming), and the supervisor then signals every child, so
    plain reads and writes are enough. Never ``stopping.value``: that takes the same
    (maybe dead) lock again, forever; ``stopping.get_obj().value`` does not."""
    lock = stopping.get_lock()
    locked = lock.acquire(timeout=_GATE_TIMEOUT_S)
    try:
        yield locked
    finally:
        if locked:
            lock.release()


#: The registry's limit on a consumer name (see queue.registry.register).
_MAX_NAME = 256


def child_consumer_name(consumer_name: str, index: int) -> str:
    """The consumer name worker ``index`` of a pool named ``consumer_name`` registers:
    ``"<consumer_name>/<index>"``, the same for every process started at that index."""
    return f"{consumer_name}/{index}"


class HandlerImportError(ImportError):
    """A ``"package.module:function"`` handler name that does not resolve to a callable."""


def import_handler(spec: str) -> Callable[..., Any]:
    """The callable named by ``"package.module:function"`` (``function`` may be dotted,
    e.g. ``"pkg.mod:Class.method"``). Raises HandlerImportError saying why not."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise HandlerImportError(f"handler {spec!r} is not of the form 'package.module:function'")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise HandlerImportError(
            f"cannot import module {module_name!r} for handler {spec!r}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise HandlerImportError(
                f"module {module_name!r} has no attribute {attr_path!r} (handler {spec!r})"
            ) from None
    if not callable(obj):
        raise HandlerImportError(f"handler {spec!r} is not callable")
    return obj  # type: ignore[no-any-return]


