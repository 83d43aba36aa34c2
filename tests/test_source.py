"""The message source seam (pawn_queue_sync.queue.source): a consumer polls each topic
through its topic's source and hands each message back to it to settle, so a second
format sits beside the per-object one without either knowing about the other."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from pawn_queue_sync import LeaseLostError, Message, StorageError
from pawn_queue_sync.queue.consumer import Consumer
from pawn_queue_sync.queue.objects import ObjectSource
from pawn_queue_sync.queue.source import MessageSource
from pawn_queue_sync.testing import memory_queue


class FakeSource:
    """A second source: hands out made-up messages of its topic, records settlements."""

    def __init__(self, consumer: Consumer, fail_ack: Exception | None = None) -> None:
        self.consumer = consumer
        self.fail_ack = fail_ack
        self.calls: list[tuple[str, list[str]]] = []

    def message(self, topic: str, n: int) -> Message:
        return Message(id=f"seg-{n}", topic=topic, producer_id=None, created_at="",
                       payload={"segment": n}, key=f"{topic}/segments/x", lease_key="l",
                       lease_token="t", lease_written_at=0.0, consumer=self.consumer)

    def poll(self, topic: str, want: int) -> list[Message]:
        self.calls.append(("poll", [topic, str(want)]))
        return [self.message(topic, n) for n in range(min(want, 2))]

    def janitor(self, topic: str) -> int:
        self.calls.append(("janitor", [topic]))
        return 7

    def ack_many(self, msgs: Sequence[Message]) -> None:
        self.calls.append(("ack_many", [m.id for m in msgs]))
        if self.fail_ack is not None:
            raise self.fail_ack

    def nack(self, msg: Message, reason: str | None) -> None:
        self.calls.append(("nack", [msg.id, str(reason)]))

    def retry(self, msg: Message, error: str | None) -> None:
        self.calls.append(("retry", [msg.id, str(error)]))

    def release(self, msg: Message) -> None:
        self.calls.append(("release", [msg.id]))

    def refresh(self, msg: Message) -> None:
        self.calls.append(("refresh", [msg.id]))


def with_fake(consumer: Consumer, fake: FakeSource) -> None:
    source: MessageSource = fake  # the Protocol, as a type checker sees it
    consumer._sources["packed"] = source


def test_each_topic_is_polled_and_settled_by_its_own_source() -> None:
    with memory_queue(topics=["objects", "packed"]) as pq:
        pq.register_producer("p").publish("objects", {"n": 1})
        consumer = pq.register_consumer("c", ["objects", "packed"])
        assert isinstance(consumer._sources["objects"], ObjectSource)
        fake = FakeSource(consumer)
        with_fake(consumer, fake)
        got = consumer.poll(10)
        assert sorted(m.id.startswith("seg-") for m in got) == [False, True, True]
        assert fake.calls[0][0] == "poll" and fake.calls[0][1][0] == "packed"
        ours = [m for m in got if m.topic == "objects"]
        segs = [m for m in got if m.topic == "packed"]
        consumer.ack_many(got)
        assert ("ack_many", ["seg-0", "seg-1"]) in fake.calls
        assert ours[0].state == "acked"
        assert pq.store.list("objects/messages/").objects == []
        segs[0].nack("bad")
        segs[1].release()
        consumer.retry(segs[1], "err")
        consumer.refresh(segs[0])
        assert fake.calls[-4:] == [("nack", ["seg-0", "bad"]), ("release", ["seg-1"]),
                                   ("retry", ["seg-1", "err"]), ("refresh", ["seg-0"])]
        assert consumer.janitor("packed") == 7
        assert consumer.janitor() == 7  # the object topic has no lease left


@pytest.mark.parametrize("error", [LeaseLostError("seg-0", "taken"), StorageError("down")])
def test_an_ack_failing_in_one_source_still_acks_the_others_and_raises(
    error: Exception,
) -> None:
    with memory_queue(topics=["objects", "packed"]) as pq:
        pq.register_producer("p").publish("objects", {"n": 1})
        consumer = pq.register_consumer("c", ["objects", "packed"])
        with_fake(consumer, FakeSource(consumer, fail_ack=error))
        got = consumer.poll(10)
        with pytest.raises(type(error)) as info:
            consumer.ack_many(got)
        assert info.value is error
        assert [m.state for m in got if m.topic == "objects"] == ["acked"]
