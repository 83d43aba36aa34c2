"""How ``pawnq`` shows things to people: tables and progress bars, drawn by ``rich``
(one well-kept library for both; it sizes columns to the terminal and truncates cells
instead of wrapping a table apart). A table is rendered to text and written through
:func:`~.shared.emit`, so output errors are handled as for every other line; progress
bars go to stderr, and only when it is a terminal (never into a pipe or a log)."""

from __future__ import annotations

import io
import json
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .shared import emit

#: Widest a payload cell is drawn before it is cut (the whole is in ``--json``).
CELL = 60


def cell(value: Any, width: int = CELL) -> str:
    """A value as one table cell: text as is, anything else as compact JSON, cut."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                          separators=(",", ":"))
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    """Write a table of ``rows`` (cells made with :func:`cell`) to stdout."""
    emit(*render_table(columns, rows, title))


def render_table(columns: Sequence[str], rows: Sequence[Sequence[Any]],
                 title: str | None = None) -> list[str]:
    """The lines :func:`table` writes (``pawnq stats --watch`` redraws them in place)."""
    grid = Table(*columns, title=title, box=box.SIMPLE_HEAD, header_style="bold",
                 title_justify="left")
    for row in rows:
        grid.add_row(*(cell(v) if not isinstance(v, str) else v for v in row))
    width = shutil.get_terminal_size((120, 24)).columns if sys.stdout.isatty() else 160
    buffer = io.StringIO()
    Console(file=buffer, width=width, force_terminal=False, color_system=None,
            highlight=False).print(grid)
    return [line.rstrip() for line in buffer.getvalue().rstrip("\n").splitlines()]


def json_lines(items: Sequence[dict[str, Any]]) -> None:
    """One JSON object a line (``--json`` of the list commands)."""
    emit(*(json.dumps(item, ensure_ascii=False) for item in items))


@contextmanager
def progress_bar(label: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr while the block runs; yields ``update(done)``. Silent
    (a no-op update) when stderr is not a terminal."""
    if not sys.stderr.isatty():
        yield lambda _done: None
        return
    bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True)
    with bar:
        task = bar.add_task(label, total=total)
        yield lambda done: bar.update(task, completed=done)
