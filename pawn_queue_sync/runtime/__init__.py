"""Running consumers: lease refresh, thread-pool listening, worker processes, and
:func:`drain` for embedders such as Spark tasks.

- :class:`LeaseRefresher`: renews the leases of messages in hand, on up to
  ``polling.claim_threads`` threads of its own (one per lease tracked, up to that);
- :class:`Listener`: a poll thread feeding a bounded thread pool (behind
  :meth:`Consumer.listen <pawn_queue_sync.Consumer.listen>`);
- :func:`drain`: consume until idle, join everything, return :class:`DrainResult`;
- :class:`~pawn_queue_sync.runtime.workers.WorkerPool`: supervised worker processes
  (``pawnq worker``), imported lazily as it pulls in multiprocessing.
"""

from .drain import DrainResult, drain
from .listen import Handler, Listener, ListenerStats, describe_error
from .refresher import LeaseRefresher

__all__ = [
    # embedding
    "drain",
    "DrainResult",
    # push mode
    "Listener",
    "ListenerStats",
    "Handler",
    "describe_error",
    # pull mode
    "LeaseRefresher",
]
