"""The chaos table: rows rendered as Markdown, and its place in docs/guarantees.md."""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.chaos.accounting import Counts
from benchmarks.chaos.harness import ScenarioResult

__all__ = ["DOC", "END", "START", "load_results", "render_table", "rewrite_doc", "row_line"]

DOC = Path(__file__).resolve().parents[2] / "docs" / "guarantees.md"
START = "<!-- chaos-table-start -->"
END = "<!-- chaos-table-end -->"
HEADER = (
    "| scenario | strategy | topic kind | published | acked | dead-lettered | left | lost "
    "| twice | twice while live | seconds | notes |\n"
    "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
)
_FAULT_NAMES = {
    "error_500": "500", "slowdown_503": "503", "reset": "reset", "read_timeout": "timeout",
    "drop_answer": "dropped answer", "delay_request": "stall (request)",
    "delay_answer": "stall (answer)",
}


def notes_text(result: ScenarioResult) -> str:
    """The notes cell: faults, kills, delays behind csprng duplicates, misses."""
    n: dict[str, Any] = result.notes
    parts: list[str] = []
    if n.get("messages") and result.counts.published < n["messages"]:
        parts.append(f"{n['messages']} asked")
    faults = n.get("faults") or {}
    if faults:
        parts.append("faults: " + ", ".join(
            f"{_FAULT_NAMES.get(k, k)} {v}" for k, v in sorted(faults.items())))
    if n.get("kills"):
        caught = n.get("kills_mid_flight")
        parts.append(f"{n['kills']} kills" + (f" ({caught} mid-handler)" if caught else ""))
    for key in ("poison", "wrong_shape"):
        if n.get(key):
            parts.append(f"{n[key]} {key.replace('_', ' ')}")
    if n.get("handled_before_stop") is False:
        stalled = n.get("stalled_seconds")
        parts.append("the pool was stopped with messages unhandled"
                     + (f" (nothing handled for {stalled:g} s)" if stalled else "")
                     + ": the sweep handled them (left)")
    if result.counts.unconfirmed:
        parts.append(f"{result.counts.unconfirmed} unconfirmed publishes delivered")
    explained = (n.get("overlap_delays") or {}).get("explained") or {}
    if explained:
        delays = sorted({d for ds in explained.values() for d in ds})
        parts.append(f"{len(explained)} duplicates while live, each after a proxy delay "
                     f">= jitter_min_ms ({', '.join(f'{d:g} s' for d in delays[:4])})")
    if n.get("strategy_chosen") and n["strategy_chosen"] != result.strategy:
        parts.append(f"probe chose {n['strategy_chosen']}")
    for key, value in sorted(n.items()):
        if key.startswith("note_"):
            parts.append(str(value))
    parts.append("goals met" if result.goals_met else "MISSED: " + "; ".join(result.misses))
    return "; ".join(parts).replace("|", "/")


def row_line(result: ScenarioResult) -> str:
    c = result.counts
    seconds = result.notes.get("seconds", "")
    return (
        f"| {result.scenario} {result.name} | {result.strategy} | {result.kind} "
        f"| {c.published} | {c.acked} | {c.dead_lettered} | {c.left} | {c.lost} "
        f"| {c.delivered_twice} | {c.twice_while_live} | {seconds} | {notes_text(result)} |"
    )


def render_table(results: Sequence[ScenarioResult], *, quick: bool, seed: int,
                 source: str | None = None) -> str:
    """The table with a line saying where its figures come from (``source``: the saved
    rows it was rendered from, else this run)."""
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    run = "`python -m benchmarks.chaos --quick`" if quick else "`python -m benchmarks.chaos`"
    origin = f"{run} (rows saved with `--out` in {source})" if source else f"{run} (seed {seed})"
    lines = [
        f"Figures of {origin},",
        f"rendered {when}, on a {os.cpu_count()}-core machine shared with other work "
        "(seconds are not a benchmark):",
        "",
        HEADER,
        *(row_line(r) for r in results),
    ]
    return "\n".join(lines)


def rewrite_doc(table: str, doc: Path = DOC) -> None:
    """Replace what is between the chaos markers in ``doc`` with ``table``."""
    text = doc.read_text()
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{doc} has no {START} ... {END} markers")
    text = text[:start + len(START)] + "\n" + table + "\n" + text[end:]
    doc.write_text(text)


def load_results(paths: Sequence[Path]) -> list[ScenarioResult]:
    """Rows saved with ``--out`` (several runs' files, in order), to render them again."""
    results: list[ScenarioResult] = []
    for path in paths:
        for item in json.loads(Path(path).read_text()):
            counts = Counts(**item.pop("counts"))
            results.append(ScenarioResult(counts=counts, **item))
    return results
