"""The chaos suite's event log: one JSON-lines file per process and role.

Every process of a run (the harness, each worker child, the sweep) appends events to
``{dir}/{role}-{pid}.jsonl``, flushed after each line, so a ``kill -9`` loses at most
a partial last line, which the reader skips. Times are ``time.monotonic()``: on Linux
CLOCK_MONOTONIC is system-wide, so times of different processes compare.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["Ledger", "LedgerTail", "LedgerWriter", "expand", "failed_positions",
           "read_events", "record_publish"]


class LedgerWriter:
    """Appends events to one file; thread-safe (handler threads share it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file = path.open("a", encoding="utf-8")

    def write(self, e: str, **fields: Any) -> None:
        """Append event ``e`` with ``fields`` (``t`` defaults to now, monotonic)."""
        fields.setdefault("t", time.monotonic())
        line = json.dumps({"e": e, **fields}, separators=(",", ":"), default=str)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


class Ledger:
    """The directory of one run's event files."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def writer(self, role: str) -> LedgerWriter:
        """A writer of this process for ``role`` (``{role}-{pid}.jsonl``)."""
        return LedgerWriter(self.dir / f"{role}-{os.getpid()}.jsonl")

    def events(self) -> list[dict[str, Any]]:
        return read_events(self.dir)


def failed_positions(exc: BaseException, n: int) -> set[int]:
    """Which of the ``n`` payloads of a publish call that raised ``exc`` were not
    published. A PublishError of ``publish_batch`` lists them in ``failed_indices``
    (positions, input order; the others were written); any other error, or one without
    that list, may have published none of them: all ``n``."""
    indices = getattr(exc, "failed_indices", None)
    return set(range(n)) if indices is None else set(indices)


def record_publish(writer: LedgerWriter, ids: list[str],
                   exc: BaseException | None = None) -> None:
    """Record one publish call of ``ids``: ONE ``pub`` line {ids} for those published
    (so a kill cannot cut the record of a returned call in the middle), then
    ``pubfail`` per id the call did not publish (``exc``: what it raised)."""
    failed = failed_positions(exc, len(ids)) if exc is not None else set()
    published = [mid for k, mid in enumerate(ids) if k not in failed]
    if published:
        writer.write("pub", ids=published)
    for k in sorted(failed):
        writer.write("pubfail", id=ids[k], error=type(exc).__name__)


#: Events that may carry ``ids`` (one line for many ids) instead of one ``id``.
_MULTI = frozenset({"pub", "pubfail"})


def expand(event: dict[str, Any]) -> list[dict[str, Any]]:
    """An event carrying ``ids`` as one event per id (``id`` set); any other as is."""
    if event.get("e") not in _MULTI or "ids" not in event:
        return [event]
    base = {k: v for k, v in event.items() if k != "ids"}
    return [{**base, "id": mid} for mid in event["ids"]]


def _parse(line: str) -> dict[str, Any] | None:
    """One event, or None for a line cut short by a kill (or otherwise unreadable)."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict) or "e" not in event or "t" not in event:
        return None
    return event


def read_events(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every readable event of every file in ``directory``, sorted by time (a ``pub``
    or ``pubfail`` with ``ids``, one per id: see :func:`expand`)."""
    events: list[dict[str, Any]] = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            event = _parse(line)
            if event is not None:
                events.extend(expand(event))
    events.sort(key=lambda ev: ev["t"])
    return events


class LedgerTail:
    """Reads only what was appended since its last call (for waits on progress)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self._offsets: dict[Path, int] = {}

    def new_events(self) -> list[dict[str, Any]]:
        """Complete lines appended since the last call, in file order (expanded as by
        :func:`read_events`)."""
        events: list[dict[str, Any]] = []
        for path in sorted(self.dir.glob("*.jsonl")):
            start = self._offsets.get(path, 0)
            with path.open("rb") as f:
                f.seek(start)
                data = f.read()
            end = data.rfind(b"\n") + 1  # a partial last line is read next time
            self._offsets[path] = start + end
            for line in data[:end].decode("utf-8", errors="replace").splitlines():
                event = _parse(line)
                if event is not None:
                    events.extend(expand(event))
        return events
