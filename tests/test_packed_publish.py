"""Packed topics, the publishing side: the manifest and topic kind, group commit of
``publish()`` into segments, ``publish_batch`` cutting full segments, limits and
failures; on MemoryStore and on SeaweedFS."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from pawn_queue_sync import PawnQueue, layout
from pawn_queue_sync.cli import main
from pawn_queue_sync.clock import FakeClock
from pawn_queue_sync.config import load_config
from pawn_queue_sync.errors import ObjectNotFound
from pawn_queue_sync.queue.context import PACKED_RECHECK_SECONDS
from pawn_queue_sync.queue.topics import PACKED_FORMAT, PACKED_VERSION
from pawn_queue_sync.storage.memory import MemoryStore

TOPIC = "events"


def memory_queue(
    publishing: dict[str, Any] | None = None, store: MemoryStore | None = None, **kw: Any
) -> PawnQueue:
    cfg = load_config({"publishing": publishing or {}}, env={})
    return PawnQueue(cfg, store=store or MemoryStore(), **kw).setup()


@pytest.fixture(params=["memory", "seaweedfs"])
def make_queue(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A factory of started queues over one store: MemoryStore, or a SeaweedFS bucket."""
    opened: list[PawnQueue] = []
    store = MemoryStore() if request.param == "memory" else None
    base = {} if store is not None else request.getfixturevalue("real_s3_config")

    def make(publishing: dict[str, Any] | None = None) -> PawnQueue:
        cfg = load_config({**base, "publishing": publishing or {}}, env={})
        pq = PawnQueue(cfg, store=store).setup()
        opened.append(pq)
        return pq

    yield make
    for pq in opened:
        pq.teardown()


# --------------------------------------------------------------------------- topic kind


def test_create_topic_packed_writes_the_manifest_once(make_queue: Any) -> None:
    pq = make_queue()
    assert pq.create_topic(TOPIC, packed=True) is True
    key = layout.packed_manifest_key(TOPIC)
    first = pq.store.get(key)
    manifest = json.loads(first.body)
    assert manifest["format"] == PACKED_FORMAT and manifest["version"] == PACKED_VERSION
    assert set(manifest) == {"format", "version", "created_at"}
    assert first.body == layout.canonical_json(manifest)
    assert pq.context.topic_packed(TOPIC) is True
    # again, from another client: not created, the manifest is left as it was
    other = make_queue()
    assert other.create_topic(TOPIC, packed=True) is False
    assert other.store.get(key).etag == first.etag
    assert other.context.topic_packed(TOPIC) is True


def test_packed_on_a_plain_topic_switches_it(make_queue: Any) -> None:
    pq = make_queue()
    assert pq.create_topic(TOPIC) is True
    assert pq.context.topic_packed(TOPIC) is False
    with pytest.raises(ObjectNotFound):
        pq.store.head(layout.packed_manifest_key(TOPIC))
    assert pq.create_topic(TOPIC, packed=True) is False  # the topic existed
    assert pq.context.topic_packed(TOPIC) is True
    pq.store.head(layout.packed_manifest_key(TOPIC))


def test_the_manifest_is_written_once_without_if_none_match() -> None:
    """Where the server lacks If-None-Match: HEAD, then PUT only if missing."""
    store = MemoryStore()
    pq = memory_queue(store=store)
    pq.context.caps = attrs.evolve(pq.context.caps, if_none_match=False)
    assert pq.create_topic(TOPIC, packed=True) is True
    etag = store.head(layout.packed_manifest_key(TOPIC)).etag
    assert pq.create_topic(TOPIC, packed=True) is False
    assert store.head(layout.packed_manifest_key(TOPIC)).etag == etag


def test_topic_packed_is_cached_false_for_a_while_true_for_good() -> None:
    store = MemoryStore()
    clock = FakeClock()
    reader = memory_queue(store=store, clock=clock)
    writer = memory_queue(store=store)
    writer.create_topic(TOPIC)
    heads: list[str] = []
    real_head = store.head

    def counting_head(key: str) -> Any:
        heads.append(key)
        return real_head(key)

    store.head = counting_head  # type: ignore[method-assign]
    manifest = layout.packed_manifest_key(TOPIC)
    assert reader.context.topic_packed(TOPIC) is False
    writer.create_topic(TOPIC, packed=True)  # switched by another process
    assert reader.context.topic_packed(TOPIC) is False  # still cached as plain
    assert heads.count(manifest) == 1
    clock.advance(PACKED_RECHECK_SECONDS)
    assert reader.context.topic_packed(TOPIC) is True  # looked again
    assert heads.count(manifest) == 2
    clock.advance(10 * PACKED_RECHECK_SECONDS)
    assert reader.context.topic_packed(TOPIC) is True
    assert heads.count(manifest) == 2  # a packed topic stays packed: never asked again


def test_cli_creates_packed_topics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"local:\n  path: {tmp_path / 'store'}\n")
    assert main(["--config", str(cfg), "topics", "--create", "a", "b", "--packed"]) == 0
    assert main(["--config", str(cfg), "topics", "--create", "c"]) == 0
    out = capsys.readouterr().out
    assert "a: created (packed)" in out and "b: created (packed)" in out
    assert "c: created" in out and "c: created (packed)" not in out
    assert main(["--config", str(cfg), "topics", "--packed"]) == 2
    assert "--packed goes with --create" in capsys.readouterr().err
    with PawnQueue(load_config({"local": {"path": str(tmp_path / "store")}}, env={})) as pq:
        packed = {t: pq.context.topic_packed(t) for t in ("a", "b", "c")}
    assert packed == {"a": True, "b": True, "c": False}
