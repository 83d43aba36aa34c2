"""pawn-queue-sync: a durable pub/sub queue on any S3-compatible object store, for
code that blocks (scripts, process pools, Spark executors). No broker to deploy.

    from pawn_queue_sync import PawnQueue

    with PawnQueue.from_config("config.yaml") as pq:
        pq.create_topic("orders")
        pq.register_producer("order-service").publish("orders", {"order_id": 42})
        consumer = pq.register_consumer("billing", topics=["orders"])
        for msg in consumer.poll():
            print(msg.payload)
            msg.ack()
"""

from typing import Any

from .config import PawnQueueBuilder, PawnQueueConfig, load_config
from .errors import (
    CaseCollision,
    ConditionFailed,
    ConfigError,
    DeadlineExceeded,
    InvalidArgument,
    InvalidTopicName,
    LeaseConflictError,
    LeaseLostError,
    MissingExtra,
    NotStartedError,
    ObjectNotFound,
    PawnQueueError,
    PayloadError,
    PlatformNotSupported,
    ProbeError,
    PublishError,
    RegistrationError,
    SegmentError,
    StorageError,
    StoreClosed,
    StoreFull,
    StoreNotPortable,
    StoreUnavailable,
    TopicNotEmptyError,
    TopicNotFoundError,
)
from .queue.consumer import Consumer
from .queue.core import PawnQueue
from .queue.deadletters import DeadLetter, RedriveResult
from .queue.message import Message
from .queue.peek import PeekedMessage
from .queue.producer import Producer
from .queue.topic_stats import ConsumerStatus, TopicStats
from .runtime import DrainResult, Listener, ListenOptions, drain

__version__ = "0.1.0"

__all__ = [
    # entry points
    "PawnQueue",
    "PawnQueueBuilder",
    "PawnQueueConfig",
    "load_config",
    # roles
    "Producer",
    "Consumer",
    "Message",
    # running handlers
    "Listener",
    "ListenOptions",
    "drain",
    "DrainResult",
    "WorkerPool",
    # errors
    "PawnQueueError",
    "NotStartedError",
    "ConfigError",
    "InvalidTopicName",
    "TopicNotFoundError",
    "PayloadError",
    "PublishError",
    "RegistrationError",
    "SegmentError",
    "StorageError",
    "StoreUnavailable",
    "StoreClosed",
    "StoreFull",
    "StoreNotPortable",
    "DeadlineExceeded",
    "CaseCollision",
    "PlatformNotSupported",
    "ObjectNotFound",
    "ConditionFailed",
    "ProbeError",
    "LeaseLostError",
    "LeaseConflictError",
    "InvalidArgument",
    "MissingExtra",
    "TopicNotEmptyError",
    "DeadLetter",
    "RedriveResult",
    "PeekedMessage",
    "TopicStats",
    "ConsumerStatus",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """``WorkerPool`` is imported on first use: publishing and consuming never need
    the worker pool's multiprocessing and signal handling."""
    if name == "WorkerPool":
        from .workers import WorkerPool

        return WorkerPool
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
