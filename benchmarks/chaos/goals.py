"""The goals a chaos row must meet (docs/guarantees.md, "Chaos suite")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from benchmarks.chaos.accounting import Counts

__all__ = ["judge"]


def judge(counts: Counts, *, events: Iterable[Mapping[str, Any]], strategy: str,
          poison: set[str], explained: Mapping[str, Any],
          allowed_left: int = 0) -> list[str]:
    """The goals ``counts`` miss, each said with its figures (empty: all met).

    ``strategy`` is the one the queue used (``auto`` resolved by its probe). ``left``
    (messages the harness's sweep had to handle) is a miss beyond ``allowed_left``: the
    sweep must not hide a worker pool that stalled. No scenario leaves messages on
    purpose (every one waits for its pool to handle all it published), so it is 0.
    """
    misses: list[str] = []
    d = counts.details
    if counts.lost:
        misses.append(f"{counts.lost} lost (e.g. {d['lost'][:5]})")
    if counts.left > allowed_left:
        misses.append(f"{counts.left} left to the sweep: the worker pool did not drain the "
                      "topic (it stalled or handled nothing)")
    if counts.remaining_after_sweep:
        misses.append(f"{counts.remaining_after_sweep} left in the topic after the sweep")
    if strategy == "conditional_write" and counts.twice_while_live:
        misses.append(f"{counts.twice_while_live} delivered twice while a lease was live "
                      f"under conditional_write (e.g. {d['overlaps'][:3]})")
    if strategy == "csprng_verify" and explained.get("unexplained"):
        misses.append(f"{len(explained['unexplained'])} overlaps under csprng_verify with "
                      f"no delay >= jitter_min_ms: {explained['unexplained'][:5]}")
    if counts.wrong_dead_letters:
        misses.append(f"{counts.wrong_dead_letters} dead-lettered that are not poison "
                      f"(e.g. {d['wrong_dead_letters'][:5]})")
    if poison:
        if counts.poison_delivery_errors:
            misses.append(f"{counts.poison_delivery_errors} poison ids not delivered exactly "
                          f"max_delivery_count times: {d['poison_delivery_errors']}")
        if counts.poison_not_dead_lettered:
            misses.append(f"{counts.poison_not_dead_lettered} poison ids not dead-lettered: "
                          f"{d['poison_not_dead_lettered'][:5]}")
    late = [ev for ev in events if ev.get("e") == "late_ack"]
    wrong_late = [ev for ev in late if ev.get("result") != "LeaseLostError"]
    if wrong_late:
        misses.append(f"{len(wrong_late)} of {len(late)} late acks did not fail with "
                      f"LeaseLostError: {[ev.get('result') for ev in wrong_late[:5]]}")
    return misses
