"""How a Spark call's work is split between its tasks: the consumer name each task
registers, and each task's share of a limit or of a list of keys."""

from __future__ import annotations

from typing import Any

__all__ = ["check_tasks", "share", "split_evenly", "task_consumer_name"]

#: The registry's limit on a consumer name (see queue.registry.register).
_MAX_NAME = 256


def task_consumer_name(consumer_name: str, index: int) -> str:
    """The consumer that task (partition) ``index`` registers: ``"<consumer_name>/<index>"``,
    so tasks running together have ids of their own (the registry rank that spreads
    csprng_verify claims counts each), and a retried task reuses its partition's id.
    The same rule as a WorkerPool's children."""
    return f"{consumer_name}/{index}"


def check_tasks(consumer_name: str, partitions: int) -> None:
    """Refuse, on the driver, fewer than one partition, or a base name whose task names
    the registry would refuse."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions!r}")
    if (not isinstance(consumer_name, str) or not consumer_name
            or len(task_consumer_name(consumer_name, partitions - 1)) > _MAX_NAME):
        raise ValueError(f"consumer_name must be a non-empty string; task i registers as "
                         f"'<consumer_name>/i', at most {_MAX_NAME} characters")


def split_evenly(items: list[Any], parts: int) -> list[list[Any]]:
    """``items`` in ``parts`` contiguous chunks of near-equal size (no empty chunk)."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    out: list[list[Any]] = []
    start = 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return [c for c in out if c]


def share(total: int | None, parts: int, index: int) -> int | None:
    """Task ``index``'s share of ``total`` split over ``parts`` tasks (None: no limit)."""
    if total is None:
        return None
    base, extra = divmod(total, parts)
    return base + (1 if index < extra else 0)
