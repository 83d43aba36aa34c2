"""Scenario 4: a consumer frozen (SIGSTOP) past its visibility timeout holding messages
mid-handler, then resumed (SIGCONT): its late acks must fail with LeaseLostError and
delete nothing.

Sharp on purpose: the frozen consumer (:mod:`benchmarks.chaos.frozen`, pull mode, no
refresher) polls its messages (on a packed topic: under a segment lease) and is
stopped; gate files hold exactly those ids in the pool's handler, so once the leases
are stale the pool takes them over and *keeps holding them* (its listeners refresh
the leases). Only when every one is held by a pool worker does the frozen one resume:
its late acks run while the new holders hold the messages. Then, before the gates
open: every message object (plain), or segment with those indexes unsettled in its
lease (packed), is still there. The gates open, and the new holders' acks must remove
the messages.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from typing import Any

from benchmarks.chaos.harness import ChaosRun, ChaosSettings, ScenarioResult
from benchmarks.chaos.ledger import LedgerTail
from benchmarks.chaos.programs import spawn, wait_for
from pawn_queue_sync.errors import ObjectNotFound, SegmentError
from pawn_queue_sync.protocol.segments import SegmentLease
from pawn_queue_sync.storage.base import Store

NAME = "freeze"
NUMBER = 4
FULL_MESSAGES, QUICK_MESSAGES = 400, 60
FULL_HELD, QUICK_HELD = 7, 3
#: Seconds the frozen consumer may take to poll its messages.
READY_TIMEOUT = 90.0


def _present(store: Store, held: list[dict[str, Any]]) -> dict[str, str]:
    """Each held id -> what is wrong with its stored state ("" when still pending)."""
    found: dict[str, str] = {}
    for h in held:
        ident = h["payload_id"]
        try:
            if "key" in h:  # plain: the message object is still there
                store.head(h["key"])
                found[ident] = ""
                continue
            store.head(h["segment_key"])
            lease = SegmentLease.decode(store.get(h["segment_lease_key"]).body)
        except ObjectNotFound as exc:
            found[ident] = f"gone: {exc}"
            continue
        except SegmentError as exc:
            found[ident] = f"unreadable segment lease: {exc}"
            continue
        settled = lease.progress.is_settled(int(h["index"]))
        found[ident] = f"index {h['index']} settled in the segment lease" if settled else ""
    return found


def _settled(store: Store, h: dict[str, Any]) -> bool:
    """The new holder's ack went through: the message, or its index, is settled."""
    try:
        if "key" in h:
            store.head(h["key"])
            return False
        lease = SegmentLease.decode(store.get(h["segment_lease_key"]).body)
    except ObjectNotFound:
        return True  # plain: deleted; packed: the segment finished (deleted, then its lease)
    except SegmentError:
        return False
    return lease.progress.is_settled(int(h["index"]))


def run(settings: ChaosSettings) -> ScenarioResult:
    quick = settings.quick
    n = settings.messages or (QUICK_MESSAGES if quick else FULL_MESSAGES)
    # a packed segment goes to one pool child, whose threads the gates block: leave
    # it one free thread, or it holds the rest of the segment with none to run them
    want = max(1, min(QUICK_HELD if quick else FULL_HELD, settings.threads - 1))
    misses: list[str] = []
    with ChaosRun(settings) as chaos:
        gate = chaos.run_dir / "gates"
        gate.mkdir()
        ready, go = chaos.run_dir / "frozen.json", chaos.run_dir / "frozen.go"
        chaos.publish(n)
        frozen = spawn(chaos, "frozen", "--topic", chaos.topic, "--want", str(want),
                       "--ready", str(ready), "--go", str(go))
        try:
            if not wait_for(ready.exists, READY_TIMEOUT, frozen):
                raise RuntimeError(f"the frozen consumer held nothing (exit {frozen.poll()})")
            os.kill(frozen.pid, signal.SIGSTOP)
            chaos.log.write("stop", pid=frozen.pid)
            stopped_at = time.monotonic()
            held: list[dict[str, Any]] = json.loads(ready.read_text())["held"]
            ids = {h["payload_id"] for h in held}
            for ident in ids:
                (gate / f"{ident}.hold").touch()
            chaos.start_pool(env={"CHAOS_GATE_DIR": str(gate)})
            # the pool takes every held message over once the frozen leases are stale
            taken: dict[str, int] = {}  # id -> the delivery count the pool saw first
            tail = LedgerTail(chaos.ledger.dir)

            def all_taken() -> bool:
                for ev in tail.new_events():
                    if (ev.get("e") == "start" and ev.get("id") in ids
                            and ev.get("pid") != frozen.pid):
                        taken.setdefault(ev["id"], int(ev.get("delivery_count") or 0))
                return taken.keys() >= ids

            limit = 4 * settings.visibility_timeout + 90
            if not wait_for(all_taken, limit):
                misses.append(f"the pool took over {len(taken)} of {len(ids)} frozen messages "
                              f"in {limit:.0f} s")
            frozen_s = time.monotonic() - stopped_at
            uncounted = {i: c for i, c in taken.items() if c < 2}
            if uncounted:  # the frozen delivery must count (delivery_count >= 2 after it)
                misses.append(f"{len(uncounted)} taken over with delivery_count < 2: "
                              f"{dict(list(uncounted.items())[:3])}")
            # the late acks, while the new holders hold the messages (the gates are shut)
            go.touch()
            os.kill(frozen.pid, signal.SIGCONT)
            chaos.log.write("cont", pid=frozen.pid)
            try:
                frozen.wait(timeout=120)
            except subprocess.TimeoutExpired:
                frozen.kill()
                misses.append("the frozen consumer did not finish its late acks in 120 s")
            late = [ev for ev in chaos.ledger.events() if ev.get("e") == "late_ack"]
            if len(late) != len(ids):
                misses.append(f"{len(late)} late acks recorded for {len(ids)} held messages")
            store = chaos.direct_queue().store
            damaged = {ident: why for ident, why in _present(store, held).items() if why}
            if damaged:
                misses.append(f"{len(damaged)} messages the late acks touched were removed or "
                              f"settled: {dict(list(damaged.items())[:3])}")
            for ident in ids:
                (gate / f"{ident}.hold").unlink()
            handled = chaos.wait_handled(chaos.published_ids())
            settled = wait_for(lambda: all(_settled(store, h) for h in held), 60)
            if not settled:
                misses.append("the new holders' acks did not remove every message taken over")
        finally:
            _end(frozen)
        results = dict(Counter(str(ev.get("result")) for ev in late))
        return chaos.finish(NAME, scenario=NUMBER, extra_misses=misses, notes={
            "messages": n, "held_by_frozen": len(ids), "frozen_seconds": round(frozen_s, 1),
            "late_acks": results, "damaged_by_late_acks": len(damaged),
            "new_holders_acked": settled, "handled_before_stop": handled,
            "note_late": f"frozen {frozen_s:.0f} s holding {len(ids)}; late acks: "
                         + ", ".join(f"{k} {v}" for k, v in sorted(results.items()))
                         + f"; {len(damaged)} deleted or settled by them",
        })


def _end(proc: subprocess.Popen[bytes]) -> None:
    """Never leave the frozen consumer behind (stopped or not)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
