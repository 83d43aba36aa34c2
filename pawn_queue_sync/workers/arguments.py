"""The checks a :class:`~pawn_queue_sync.workers.WorkerPool` makes before it starts a
child, apart from the supervisor: its arguments (every bad value is a ValueError, or a
TypeError for an unknown or doubled keyword) and :func:`preflight` (the handler
imports and the store answers, in the parent, once)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .. import metrics
from ..config import load_config
from ..errors import ConfigError, PawnQueueError, StorageError, TopicNotFoundError
from ..queue.core import PawnQueue
from ..runtime.options import Default, renamed
from .common import (
    _MAX_NAME,
    RET_CONFIG,
    RET_CONNECT,
    RET_IMPORT,
    HandlerImportError,
    child_consumer_name,
    import_handler,
)

log = logging.getLogger("pawn_queue_sync.workers")

#: Old WorkerPool keywords -> their ``*_seconds`` names (deprecated aliases).
DEPRECATED = {
    "shutdown_timeout": "shutdown_timeout_seconds",
    "restart_backoff": "restart_backoff_seconds",
    "restart_backoff_max": "restart_backoff_max_seconds",
}


@attrs.frozen
class PoolArguments:
    """What the checks let through, durations resolved from their old names."""

    topics: tuple[str, ...]
    shutdown_timeout_seconds: float
    restart_backoff_seconds: float
    restart_backoff_max_seconds: float


def check_arguments(
    topics: Sequence[str] | str,
    *,
    processes: int,
    threads: int,
    consumer_name: str,
    shutdown_timeout_seconds: float,
    restart_backoff_seconds: float,
    restart_backoff_max_seconds: float,
    start_method: str,
    max_start_failures: int,
    deprecated: Mapping[str, float],
) -> PoolArguments:
    """Check a pool's arguments; the values to run with."""
    unknown = sorted(set(deprecated) - set(DEPRECATED))
    if unknown:
        raise TypeError(f"WorkerPool() got an unexpected keyword argument {unknown[0]!r}")
    given = {
        "shutdown_timeout_seconds": shutdown_timeout_seconds,
        "restart_backoff_seconds": restart_backoff_seconds,
        "restart_backoff_max_seconds": restart_backoff_max_seconds,
    }
    # given by the caller (not a Default): with its old name too, a TypeError
    explicit = {name for name, value in given.items() if not isinstance(value, Default)}
    durations = {**given,
                 **renamed(dict(deprecated), DEPRECATED, explicit=explicit, stacklevel=4)}
    if isinstance(topics, str):
        topics = [topics]
    if not topics:
        raise ValueError("a worker pool needs at least one topic")
    if processes < 1 or threads < 1:
        raise ValueError("processes and threads must be >= 1")
    for label, value in durations.items():
        # inf or nan would crash the supervisor's waits (at the first stop request)
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value < 0):
            raise ValueError(f"{label} must be a finite number of seconds >= 0, got {value!r}")
    if isinstance(max_start_failures, bool) or not isinstance(max_start_failures, int) \
            or max_start_failures < 1:
        raise ValueError(f"max_start_failures must be an int >= 1, got {max_start_failures!r}")
    if start_method == "fork":
        raise ValueError("fork is not fork-safe with boto3 clients: use spawn or forkserver")
    if (not isinstance(consumer_name, str) or not consumer_name
            or len(child_consumer_name(consumer_name, processes - 1)) > _MAX_NAME):
        raise ValueError(
            f"consumer_name must be a non-empty string; worker i registers as "
            f"'<consumer_name>/i', at most {_MAX_NAME} characters"
        )
    return PoolArguments(
        tuple(topics), *(float(durations[name]) for name in given),
    )


def preflight(
    config_source: Any, topics: Sequence[str], handler: str
) -> tuple[int | None, dict[str, Any] | None]:
    """Import the handler and reach the store once, checking the topics: an exit status
    if that fails (logged), else None; and the configuration as plain data for the
    children."""
    try:
        import_handler(handler)
    except HandlerImportError as exc:
        log.error("%s", exc)
        return RET_IMPORT, None
    try:
        config = load_config(config_source)
    except (ConfigError, OSError) as exc:
        log.error("invalid configuration: %s", exc)
        return RET_CONFIG, None
    pq = PawnQueue(config)
    try:
        pq.setup()
        for topic in topics:
            pq.context.require_topic(topic)
    except TopicNotFoundError as exc:
        log.error("%s", exc)
        return RET_CONFIG, None
    except ConfigError as exc:
        log.error("invalid configuration: %s", exc)
        return RET_CONFIG, None
    except (StorageError, PawnQueueError, OSError) as exc:
        log.error("cannot reach the store: %s", exc)
        return RET_CONNECT, None
    finally:
        pq.teardown()
    return None, config.to_dict()


def check_metrics(port: int | None, addr: str) -> tuple[int, str] | None:
    """``(port, addr)`` to serve the pool's metrics on, or None without a port; a port
    outside 0-65535 (0: any free one) or an empty address is a ValueError, a missing
    ``metrics`` extra :class:`~pawn_queue_sync.errors.MissingExtra`."""
    if port is None:
        return None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"metrics_port must be None or an int in 0-65535, not {port!r}")
    if not isinstance(addr, str) or not addr:
        raise ValueError(f"metrics_addr must be a non-empty str, not {addr!r}")
    metrics.require()
    return port, addr
