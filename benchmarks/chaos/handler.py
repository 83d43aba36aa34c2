"""The chaos workers' handler: records each delivery in the run's ledger.

``handle(msg)`` writes ``start`` (id, pid, consumer, delivery count, lease write time,
a delivery token ``d``, the ``keys`` behind its lease: :func:`lease_keys`), does a
little random work, and writes ``end`` with its outcome just before it returns ("ok")
or raises ("raised"). The id is the payload's ``"id"`` (the harness publishes
``{"id": id, ...}``), else ``msg.id``; ``mid`` is always ``msg.id`` (the key of the
message's objects).

Behaviour from the environment, read once per process:
``CHAOS_LEDGER_DIR`` (required), ``CHAOS_WORK_MS`` (random work of 0..N ms, default
20), ``CHAOS_POISON_PREFIX`` (ids starting with it raise), ``CHAOS_GATE_DIR`` (an id
with a file ``{gate}/{id}.hold`` waits until the file is removed, checking every
50 ms, at most 120 s). A payload of the wrong shape (not a dict with a string "id")
raises too.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.chaos.ledger import Ledger, LedgerWriter

__all__ = ["PoisonError", "WrongShapeError", "handle", "lease_keys", "record_delivery"]

GATE_POLL_SECONDS = 0.05
GATE_MAX_SECONDS = 120.0


class PoisonError(RuntimeError):
    """Raised for a poison id: the handler always fails on it."""


class WrongShapeError(ValueError):
    """Raised for a payload that is not a dict with an "id"."""


class _Env:
    def __init__(self, role: str) -> None:
        self.pid = os.getpid()
        self.writer: LedgerWriter = Ledger(os.environ["CHAOS_LEDGER_DIR"]).writer(role)
        self.work_ms = int(os.environ.get("CHAOS_WORK_MS", "20"))
        self.poison = os.environ.get("CHAOS_POISON_PREFIX") or None
        gate = os.environ.get("CHAOS_GATE_DIR")
        self.gate = Path(gate) if gate else None


_env: _Env | None = None
_env_lock = threading.Lock()


def _current() -> _Env:
    global _env
    with _env_lock:
        if _env is None or _env.pid != os.getpid():
            _env = _Env("worker")
        return _env


def message_ident(msg: Any) -> str:
    """The id the ledger knows a message by (the payload's, else the message's)."""
    payload = msg.payload
    if isinstance(payload, dict) and isinstance(payload.get("id"), str):
        return payload["id"]
    return str(msg.id)


def lease_keys(msg: Any) -> list[str]:
    """The object keys behind a delivery's lease: the message's key and lease key, and
    on a packed topic its segment's key and that segment's lease key (a delay on one of
    these is what can explain a csprng_verify duplicate)."""
    keys = [getattr(msg, "key", None), getattr(msg, "lease_key", None)]
    segment = getattr(msg, "segment", None)
    if segment is not None:
        keys += [getattr(segment, "key", None), getattr(segment, "lease_key", None)]
    return list(dict.fromkeys(str(k) for k in keys if k))


def _consumer_name(msg: Any) -> str | None:
    consumer = getattr(msg, "_consumer", None)
    return getattr(consumer, "name", None)


def _hold(gate: Path, ident: str) -> None:
    """Wait while ``{gate}/{ident}.hold`` exists (at most GATE_MAX_SECONDS)."""
    hold = gate / f"{ident}.hold"
    deadline = time.monotonic() + GATE_MAX_SECONDS
    while hold.exists() and time.monotonic() < deadline:
        time.sleep(GATE_POLL_SECONDS)


def record_delivery(msg: Any, writer: LedgerWriter, *, work_ms: int = 0,
                    poison: str | None = None, gate: Path | None = None) -> None:
    """One recorded handler call (the pool's handler and the sweep's)."""
    ident = message_ident(msg)
    token = uuid.uuid4().hex
    writer.write("start", id=ident, mid=str(msg.id), pid=os.getpid(), d=token,
                 consumer=_consumer_name(msg), delivery_count=msg.delivery_count,
                 w=msg.lease_written_at, keys=lease_keys(msg))
    outcome = "raised"
    try:
        if gate is not None:
            _hold(gate, ident)
        if work_ms > 0:
            time.sleep(random.uniform(0, work_ms) / 1000)
        if not (isinstance(msg.payload, dict) and isinstance(msg.payload.get("id"), str)):
            raise WrongShapeError(f"payload of the wrong shape: {type(msg.payload).__name__}")
        if poison is not None and ident.startswith(poison):
            raise PoisonError(f"poison message {ident}")
        outcome = "ok"
    finally:
        writer.write("end", id=ident, mid=str(msg.id), pid=os.getpid(), d=token,
                     w=msg.lease_written_at, outcome=outcome)


def handle(msg: Any) -> None:
    """The worker pool's handler (``benchmarks.chaos.handler:handle``)."""
    env = _current()
    record_delivery(msg, env.writer, work_ms=env.work_ms, poison=env.poison, gate=env.gate)
