"""Supervised worker processes: :class:`WorkerPool` and ``pawnq worker``.

Process level (above the queue layer): the supervisor checks the handler and the store
once, then starts children that each build their own
:class:`~pawn_queue_sync.PawnQueue` and run a
:class:`~pawn_queue_sync.runtime.Listener`. See :mod:`.pool` for the supervision
rules, :mod:`.child` for a worker process, :mod:`.common` for the exit statuses.
"""

from .common import (
    KILL_GRACE_S,
    MAX_START_FAILURES,
    RET_CONFIG,
    RET_CONNECT,
    RET_IMPORT,
    RET_KILLED,
    RET_OK,
    RET_START_FAILED,
    HandlerImportError,
    child_consumer_name,
    import_handler,
)
from .pool import WorkerPool

__all__ = [  # the pool, then what it shares with its children (see .common)
    "WorkerPool",
    "HandlerImportError",
    "import_handler",
    "child_consumer_name",
    "MAX_START_FAILURES",
    "KILL_GRACE_S",
    "RET_OK",
    "RET_KILLED",
    "RET_IMPORT",
    "RET_CONNECT",
    "RET_CONFIG",
    "RET_START_FAILED",
]
