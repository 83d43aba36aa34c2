"""Running consumers in a process: lease refresh, thread-pool listening, and
:func:`drain` for embedders such as Spark tasks. Below the queue layer: it knows the
consumer and its messages only through the Protocols of :mod:`.ports`.

- :class:`LeaseRefresher`: renews the leases of messages in hand, on up to
  ``polling.claim_threads`` threads of its own (one per lease tracked, up to that);
- :class:`Listener`: a poll thread feeding a bounded thread pool (behind
  :meth:`Consumer.listen <pawn_queue_sync.Consumer.listen>`), configured by
  :class:`ListenOptions`;
- :func:`drain`: consume until idle, join everything, return :class:`DrainResult`;
- :class:`Wakeup`, :func:`install_stop_handlers`: signal handling shared with the
  worker pool (:mod:`pawn_queue_sync.workers`, process level).
"""

from .drain import DrainResult, drain
from .listen import Listener
from .options import ListenOptions
from .ports import Handler
from .refresher import LeaseRefresher
from .signals import Wakeup, install_stop_handlers
from .state import ListenerStats, describe_error

__all__ = [
    # embedding
    "drain",
    "DrainResult",
    # push mode
    "Listener",
    "ListenOptions",
    "ListenerStats",
    "Handler",
    "describe_error",
    # pull mode
    "LeaseRefresher",
    # signals
    "Wakeup",
    "install_stop_handlers",
]
