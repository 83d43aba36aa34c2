"""Runs of indexes: a value per index of a long sequence, stored as sorted, disjoint
``(start, stop, value)`` runs (an index in no run has value 0), so a segment consumed in
order is one run whatever its size. Pure helpers of :mod:`.segments`' Progress."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..errors import SegmentError

__all__ = ["Run", "normal", "one", "paint", "ranges", "value_at"]

#: A run of indexes [start, stop) sharing one value.
Run = tuple[int, int, int]


def ranges(indexes: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted, merged half-open ranges covering ``indexes``."""
    out: list[tuple[int, int]] = []
    for i in sorted(set(indexes)):
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


def value_at(runs: Sequence[Run], starts: Sequence[int], i: int) -> int:
    """The value of index ``i`` in ``runs`` (sorted, disjoint; ``starts`` their starts)."""
    k = bisect.bisect_right(starts, i) - 1
    if k >= 0 and runs[k][0] <= i < runs[k][1]:
        return runs[k][2]
    return 0


def paint(
    runs: Sequence[Run], ranges: Sequence[tuple[int, int]], fn: Callable[[int], int]
) -> tuple[Run, ...]:
    """``runs`` with the value ``v`` of every index inside ``ranges`` replaced by
    ``fn(v)`` (an index in no run has value 0); sorted, adjacent equal runs merged,
    zero runs dropped. Costs O((runs + ranges) log), whatever the lengths."""
    if not ranges:
        return tuple(runs)
    cuts = sorted({p for a, b, _ in runs for p in (a, b)} | {p for a, b in ranges for p in (a, b)})
    starts = [a for a, _, _ in runs]
    range_starts = [a for a, _ in ranges]
    out: list[Run] = []
    for a, b in itertools.pairwise(cuts):
        value = value_at(runs, starts, a)
        k = bisect.bisect_right(range_starts, a) - 1
        if k >= 0 and ranges[k][0] <= a < ranges[k][1]:
            value = fn(value)
        _extend(out, a, b, value)
    return tuple(out)


def _extend(out: list[Run], a: int, b: int, value: int) -> None:
    """Append the run ``[a, b)`` of ``value`` to sorted ``out``: merged into the last
    run when adjacent and equal, dropped when 0."""
    if value == 0:
        return
    if out and out[-1][1] == a and out[-1][2] == value:
        out[-1] = (out[-1][0], b, value)
    else:
        out.append((a, b, value))


def normal(runs: Iterable[Sequence[Any]], width: int, what: str) -> tuple[Run, ...]:
    """Validated runs from JSON (``[start, stop]`` or ``[start, stop, n]``), normalised;
    overlapping runs add up (``[start, stop]`` ones: their union, value 1). One sweep
    over their ends, O(runs log runs) (a lease may hold thousands of runs: painting
    them one at a time was superquadratic). SegmentError names what is wrong."""
    deltas: dict[int, int] = {}
    for run in runs:
        if (not isinstance(run, list) or len(run) != width
                or any(isinstance(x, bool) or not isinstance(x, int) for x in run)):
            raise SegmentError(f"progress.{what}: {run!r} is not a run of {width} integers")
        a, b = run[0], run[1]
        n = run[2] if width == 3 else 1
        if not 0 <= a < b or n < 1:
            raise SegmentError(f"progress.{what}: {run!r} is not a valid run")
        deltas[a] = deltas.get(a, 0) + n
        deltas[b] = deltas.get(b, 0) - n
    out: list[Run] = []
    total = 0
    points = sorted(deltas)
    for a, b in itertools.pairwise(points):
        total += deltas[a]
        _extend(out, a, b, total if width == 3 else min(total, 1))
    return tuple(out)


def one(_value: int) -> int:
    return 1
