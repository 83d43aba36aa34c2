"""What every ``pawnq`` command shares: its output, its errors, the queue it opens, and
the argument types.

Output is written, flushed (and for a regular file, synced) before anything depends
on it: ``consume`` acks a batch only once its lines are out.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from typing import Any

from ..config import PawnQueueConfig, load_config
from ..queue.core import PawnQueue


class CliError(Exception):
    """A command failed outside the library (its input or output): one line on
    stderr, exit ``EXIT_ERROR``."""


class OutputError(CliError):
    """Standard output could not be written (disk full, I/O error, ...)."""

    def __init__(self, cause: OSError, consequence: str = "") -> None:
        self.cause = cause
        text = f"cannot write output: {cause}"
        super().__init__(f"{text}; {consequence}" if consequence else text)


def emit(*lines: str, sync: bool = False) -> None:
    """Write ``lines`` to stdout and flush them, so a failure surfaces here and not
    at exit, after we acted on the output as written. ``sync`` also fsyncs a regular
    file (what ``consume`` does before acking). BrokenPipeError goes through as is;
    any other OSError becomes :class:`OutputError`."""
    out = sys.stdout
    try:
        for line in lines:
            out.write(line + "\n")
        out.flush()
        if sync:
            _sync(out)
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OutputError(exc) from exc


def _sync(stream: Any) -> None:
    """fsync ``stream`` when it is a regular file (pipes and terminals can't be)."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # a replaced stdout (tests, embedders)
        return
    if stat.S_ISREG(os.fstat(fd).st_mode):
        os.fsync(fd)


def discard_stdout() -> None:
    """Point stdout at /dev/null, so what is left in its buffer can't fail again when
    the interpreter flushes it at exit (Python's advice for SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):  # no real stdout: nothing to flush
        pass


def progress(label: str, done: int, total: int) -> None:
    """A progress bar on a terminal; silence when output goes to a file or a pipe."""
    if not sys.stdout.isatty():
        return
    width = 30
    filled = int(width * done / max(total, 1))
    sys.stdout.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
    sys.stdout.flush()


def end_progress() -> None:
    """End a progress bar's line (on a terminal only, as the bar itself)."""
    if sys.stdout.isatty():
        emit("")


#: Configuration files a reader may expect a command to read: it reads none without
#: ``--config`` (see :func:`unread_config_note`).
CONFIG_NAMES = ("config.yaml", "config.yml", "pawnqueue.yaml")


def open_queue(args: argparse.Namespace, overrides: dict[str, Any] | None = None) -> PawnQueue:
    """The queue of ``--config`` (or the environment), with ``overrides`` on top."""
    config = load_config(args.config) if args.config else load_config(overrides or None)
    if args.config and overrides:
        merged = config.to_dict()
        for section, values in overrides.items():
            merged.setdefault(section, {}).update(values)
        config = load_config(merged)
    note = unread_config_note(args.config, config)
    if note:
        print(f"pawnq: {note}", file=sys.stderr, flush=True)
    return PawnQueue(config)


def unread_config_note(config_arg: object, config: PawnQueueConfig) -> str | None:
    """A warning when a command falls back to the local store while a configuration
    file sits in the working directory: ``--config`` is the only way a command reads
    one, and a reader who set up S3 in ``config.yaml`` would otherwise write to a
    stray local store without a word. None when there is nothing to say."""
    if config_arg or config.s3 is not None:
        return None
    found = [name for name in CONFIG_NAMES if os.path.isfile(name)]
    if not found:
        return None
    return (f"no --config: using the local store in {config.local.path} "
            f"(./{found[0]} is read only with --config {found[0]})")


def count(minimum: int) -> Any:
    """An argparse type: an int of at least ``minimum`` (else a usage error)."""

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def positive_seconds(text: str) -> float:
    """An argparse type: a positive number of seconds."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value
