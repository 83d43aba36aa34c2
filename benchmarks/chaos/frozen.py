"""The consumer that scenario 4 freezes: it polls ``--want`` messages (pull mode: no
refresher), records a ``start`` for each, says what it holds in ``--ready`` (JSON,
written atomically), then waits, as a handler mid-flight would, until the file
``--go`` exists. The scenario SIGSTOPs it there, lets its leases go stale and the pool
take the messages over, creates ``--go`` and SIGCONTs it: it then acks each message at
once and records the result as ``late_ack`` ("ok", "LeaseLostError" or the exception
type), and closes its queue.

    python -m benchmarks.chaos.frozen --config C.json --ledger DIR --topic T --want 20 \
        --ready DIR/frozen.json --go DIR/frozen.go
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.chaos.ledger import Ledger
from pawn_queue_sync import LeaseLostError, PawnQueue
from pawn_queue_sync.queue.message import Message

#: The frozen consumer's registered name (the pool's consumers have another).
CONSUMER_NAME = "chaos-frozen"
#: How often the "handler" looks for the go file, and for how long at most.
GO_POLL_SECONDS = 0.05
GO_TIMEOUT_SECONDS = 300.0
#: How long it polls for its messages before it gives up with what it has.
POLL_TIMEOUT_SECONDS = 60.0


def held_facts(msg: Message) -> dict[str, Any]:
    """What the scenario checks after the late acks: the message's object (plain), or
    its segment, index and segment lease (packed)."""
    seg = msg.segment
    if seg is None:
        return {"id": msg.id, "payload_id": _payload_id(msg), "key": msg.key,
                "lease_key": msg.lease_key}
    return {"id": msg.id, "payload_id": _payload_id(msg), "segment_key": seg.key,
            "segment_lease_key": seg.lease_key, "index": msg.index}


def _payload_id(msg: Message) -> str:
    payload = msg.payload
    return str(payload["id"]) if isinstance(payload, dict) and "id" in payload else msg.id


def _write_atomically(path: Path, doc: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="a JSON file: the queue's config")
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--want", type=int, default=20)
    parser.add_argument("--ready", required=True)
    parser.add_argument("--go", required=True)
    args = parser.parse_args(argv)
    config: dict[str, Any] = json.loads(Path(args.config).read_text())
    out = Ledger(Path(args.ledger)).writer("frozen")
    go = Path(args.go)
    with PawnQueue.from_config(config) as pq:
        consumer = pq.register_consumer(CONSUMER_NAME, [args.topic])
        held: list[Message] = []
        deadline = time.monotonic() + POLL_TIMEOUT_SECONDS
        while len(held) < args.want and time.monotonic() < deadline:
            for msg in consumer.poll(max_messages=args.want - len(held)):
                out.write("start", id=_payload_id(msg), mid=msg.id, pid=os.getpid(),
                          consumer=CONSUMER_NAME, delivery_count=msg.delivery_count,
                          w=msg.lease_written_at)
                held.append(msg)
        _write_atomically(Path(args.ready), {"pid": os.getpid(),
                                             "held": [held_facts(m) for m in held]})
        give_up = time.monotonic() + GO_TIMEOUT_SECONDS
        while not go.exists() and time.monotonic() < give_up:  # frozen here (SIGSTOP)
            time.sleep(GO_POLL_SECONDS)
        for msg in held:
            try:
                msg.ack()
                result = "ok"
            except LeaseLostError:
                result = "LeaseLostError"
            except Exception as exc:  # the result is the report
                result = type(exc).__name__
            out.write("late_ack", id=_payload_id(msg), mid=msg.id, pid=os.getpid(),
                      result=result)
        out.write("frozen_done", pid=os.getpid())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
