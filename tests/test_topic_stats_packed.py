"""``PawnQueue.topic_stats`` and ``pawnq topics --stats`` on packed topics (issue 14), on
SeaweedFS: segment counts come from the keys (no segment is read), and ``pending``
subtracts what the segment leases recorded settled. Plain topics keep their three keys.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pawn_queue_sync import PawnQueue, layout, packing
from pawn_queue_sync.protocol.segments import Progress, SegmentLease

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def put_segment(pq: PawnQueue, topic: str, count: int, ts: str = "20260102T030405_000000"
                ) -> str:
    """Write a well-formed segment of ``count`` messages straight to the store; its id."""
    sid = str(uuid.uuid4())
    lines = [packing.encode_line(str(uuid.uuid4()), None, layout.iso(NOW), {"n": i})
             for i in range(count)]
    body = packing.encode_segment(topic, sid, None, layout.iso(NOW), lines)
    pq.store.put(layout.segment_key(topic, ts, sid, count), body)
    return sid


def put_lease(pq: PawnQueue, topic: str, sid: str, count: int, progress: Progress) -> None:
    key = layout.segment_key(topic, "20260102T030405_000000", sid, count)
    lease = SegmentLease.new("consumer", sid, key, NOW, 60.0, progress)
    pq.store.put(layout.segment_lease_key(topic, sid), lease.encode())


def test_plain_topic_stats_are_unchanged(real_s3_config: dict[str, Any]) -> None:
    with PawnQueue.from_config(real_s3_config) as pq:
        pq.create_topic("plain")
        pq.register_producer("p").publish_batch("plain", [1, 2, 3])
        assert pq.topic_stats("plain") == {"pending": 3, "leased": 0, "dead_letter": 0}


def test_packed_stats_count_from_keys_and_subtract_settled(
    real_s3_config: dict[str, Any]
) -> None:
    with PawnQueue.from_config(real_s3_config) as pq:
        pq.create_topic("stats", packed=True)
        assert pq.topic_stats("stats") == {
            "pending": 0, "leased": 0, "dead_letter": 0, "packed": True, "segments": 0,
            "segment_messages": 0, "segments_leased": 0,
        }
        a = put_segment(pq, "stats", 50)
        b = put_segment(pq, "stats", 30)
        put_segment(pq, "stats", 20)
        # a single message from before the switch still counts
        pq.store.put(layout.message_key("stats", "20260101T000000_000000", str(uuid.uuid4())),
                     b"{}")
        # a: 10 settled in two ranges, 5 merely delivered; b: nothing settled yet
        put_lease(pq, "stats", a, 50, Progress(count=50).settle([*range(0, 7), 40, 41, 42])
                  .hand_out(range(7, 12), 5)[0])
        put_lease(pq, "stats", b, 30, Progress(count=30).hand_out(range(30), 5)[0])
        # a lease whose segment is gone settles nothing that is counted
        put_lease(pq, "stats", str(uuid.uuid4()), 99, Progress(count=99).settle(range(99)))
        # foreign objects under segments/ are not segments
        pq.store.put("stats/segments/notes.txt", b"hello")
        # the counts come from the keys: a segment whose body is garbage counts the same
        pq.store.put(layout.segment_key("stats", "20260102T030406_000000",
                                        str(uuid.uuid4()), 7), b"\x00garbage")
        got = pq.topic_stats("stats")
    assert got == {
        "pending": 1 + (50 + 30 + 20 + 7) - 10, "leased": 0, "dead_letter": 0,
        "packed": True, "segments": 4, "segment_messages": 107, "segments_leased": 3,
    }


def test_packed_stats_pending_follows_acks_recorded_by_a_consumer(
    real_s3_config: dict[str, Any]
) -> None:
    with PawnQueue.from_config(real_s3_config) as pq:
        pq.create_topic("acked", packed=True)
        put_segment(pq, "acked", 40)
        consumer = pq.register_consumer("c", ["acked"])
        got = consumer.poll(10)
        assert len(got) == 10
        consumer.ack_many(got[:6])  # recorded in the segment's lease before returning
        stats = pq.topic_stats("acked")
        assert stats["pending"] == 34 and stats["segments_leased"] == 1
        consumer.ack_many(got[6:])
        assert pq.topic_stats("acked")["pending"] == 30


def test_cli_topics_stats_show_packed_counts(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PAWNQUEUE_", "AWS_"))}
    env["PAWNQUEUE_LOCAL_PATH"] = str(tmp_path / "store")

    def pawnq(*args: str, stdin: str | None = None) -> str:
        proc = subprocess.run([sys.executable, "-m", "pawn_queue_sync", *args], input=stdin,
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert "events: created" in pawnq("topics", "--create", "events", "--packed")
    pawnq("topics", "--create", "plain")
    pawnq("publish", "events", stdin='{"n": 1}\n{"n": 2}\n"three"\n')
    lines = pawnq("topics", "--stats").splitlines()
    assert "plain\tpending=0\tleased=0\tdead_letter=0" in lines
    events = next(line for line in lines if line.startswith("events\t"))
    fields = dict(f.split("=") for f in events.split("\t")[1:])
    assert fields["packed"] == "True" and fields["pending"] == "3"
    assert fields["segment_messages"] == "3" and int(fields["segments"]) >= 1
