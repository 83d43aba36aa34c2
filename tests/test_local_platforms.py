"""Regressions of the local store on the file systems and platforms it meets, each
reproducing one defect found in the field:

* on a case-insensitive file system ``Orders`` and ``orders`` shared a directory;
* OS litter (``.DS_Store``, ``Thumbs.db``, ``._*``) was listed, so consumers
  dead-lettered it as a foreign object;
* without ``fcntl`` (Windows) importing even the memory store failed, and the local
  store gave no clear error;
* on macOS, ``os.fsync`` without ``F_FULLFSYNC`` is not durable.

A case-insensitive file system cannot be mounted here: a ``.PAWNQ`` symlink makes the
store's own case check see what one shows.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pawn_queue_sync import PawnQueue
from pawn_queue_sync.errors import (
    CaseCollision,
    ConditionFailed,
    ObjectNotFound,
    PlatformNotSupported,
    StorageError,
)
from pawn_queue_sync.storage import local as local_mod
from pawn_queue_sync.storage.local import PRIVATE_DIR, LocalStore

from .local_disk import FullDisk, place
from .store_helpers import keys_of

#: Seconds any wait on another process may take before the test fails.
WAIT = 30.0


# -- 4. case-insensitive file systems --------------------------------------------------------


def _ignores_case(directory: Path) -> bool:
    """Whether the file system of ``directory`` ignores case (macOS does by default)."""
    probe = directory / "case-probe"
    probe.write_bytes(b"")
    try:
        return (directory / "CASE-PROBE").exists()
    finally:
        probe.unlink()


@pytest.fixture
def folding_root(tmp_path: Path) -> Path:
    """A store root where looking up ``.PAWNQ`` finds ``.pawnq``, which is what the
    store sees on a case-insensitive file system (simulated with a symlink where the
    file system is case-sensitive)."""
    root = tmp_path / "store"
    (root / PRIVATE_DIR).mkdir(parents=True)
    if not (root / PRIVATE_DIR.upper()).exists():
        (root / PRIVATE_DIR.upper()).symlink_to(PRIVATE_DIR)
    return root


def test_case_insensitivity_is_detected(tmp_path: Path, folding_root: Path) -> None:
    assert LocalStore(tmp_path / "plain").case_insensitive is _ignores_case(tmp_path)
    assert LocalStore(folding_root).case_insensitive is True


def test_case_insensitive_fs_keys_differing_in_case_collide(folding_root: Path) -> None:
    store = LocalStore(folding_root)
    store.put("orders/.topic", b"{}", if_none_match=True)
    store.put("a/b/c", b"v")
    for key in ("Orders/.topic", "ORDERS/messages/m.json", "a/B/c", "A/b/d"):
        with pytest.raises(CaseCollision) as info:
            store.put(key, b"x", if_none_match=True)
        text = str(info.value)
        assert "case-insensitive" in text and key in text, text
    # the other spelling names nothing, as on S3: never the existing topic's objects
    with pytest.raises(ObjectNotFound):
        store.get("Orders/.topic")
    with pytest.raises(ObjectNotFound):
        store.head("Orders/.topic")
    assert store.list("Orders/").objects == []
    store.delete("Orders/.topic")  # nothing there: fine, and orders/.topic stays
    with pytest.raises(ConditionFailed):
        store.delete("Orders/.topic", if_match=store.head("orders/.topic").etag)
    assert store.get("orders/.topic").body == b"{}"
    assert not (folding_root / "Orders").exists()


def test_case_insensitive_fs_topic_in_other_case_is_refused(folding_root: Path) -> None:
    with PawnQueue.from_config({"local": {"path": str(folding_root)}}) as pq:
        assert pq.create_topic("orders") is True
        with pytest.raises(CaseCollision):
            pq.create_topic("Orders")
        assert pq.topic_exists("Orders") is False
        assert pq.list_topics() == ["orders"]


def test_keys_differing_in_case_are_distinct_unless_the_fs_ignores_case(
    tmp_path: Path,
) -> None:
    store = LocalStore(tmp_path / "store")
    store.put("orders/.topic", b"lower", if_none_match=True)
    if _ignores_case(tmp_path):  # e.g. macOS
        with pytest.raises(CaseCollision):
            store.put("Orders/.topic", b"upper", if_none_match=True)
        return
    store.put("Orders/.topic", b"upper", if_none_match=True)
    assert store.get("Orders/.topic").body == b"upper"
    assert keys_of(store.list("")) == ["Orders/.topic", "orders/.topic"]


# -- 5. OS litter ---------------------------------------------------------------------------

LITTER_FILES = [
    ".DS_Store",
    "Thumbs.db",
    "thumbs.db",
    "ehthumbs.db",
    "desktop.ini",
    ".directory",
    "Icon\r",
    "._20260101T000000_000000-6f1d5a46-0d77-4e4f-9a43-3c3c0ba3c8a1.json",
    "._.DS_Store",
]
LITTER_DIRS = [".Spotlight-V100", ".Trashes", ".fseventsd", "$RECYCLE.BIN", "@eaDir"]


def test_os_litter_is_not_listed_and_not_a_key(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = LocalStore(root)
    store.put("t/messages/m.json", b"m")
    store.put("t/.topic", b"{}")
    for name in LITTER_FILES:
        place(root, f"t/messages/{name}", b"junk")
        place(root, name, b"junk")
    for name in LITTER_DIRS:
        place(root, f"{name}/inside", b"junk")
        place(root, f"t/{name}/inside", b"junk")
    assert keys_of(store.list("t/messages/")) == ["t/messages/m.json"]
    assert keys_of(store.list("")) == ["t/.topic", "t/messages/m.json"]
    top = store.list("", delimiter="/")
    assert (top.prefixes, keys_of(top)) == (["t/"], [])
    under = store.list("t/", delimiter="/")
    assert (under.prefixes, keys_of(under)) == (["t/messages/"], ["t/.topic"])
    for name in [*LITTER_FILES, *(f"{d}/k" for d in LITTER_DIRS)]:
        with pytest.raises(StorageError) as info:
            store.put(f"t/{name}", b"x")
        assert not isinstance(info.value, ConditionFailed | ObjectNotFound)


def test_consumer_does_not_dead_letter_os_litter(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with PawnQueue.from_config({"local": {"path": str(root)}}) as pq:
        pq.create_topic("jobs")
        pq.register_producer("p").publish("jobs", {"n": 1})
        for name in (".DS_Store", "._x.json", "Thumbs.db"):
            place(root, f"jobs/messages/{name}", b"\x00\x05Bud1 finder junk")
        consumer = pq.register_consumer("c", topics=["jobs"])
        batch = consumer.poll()
        assert [m.payload for m in batch] == [{"n": 1}]
        for msg in batch:
            msg.ack()
        assert consumer.poll() == []
        assert pq.topic_stats("jobs") == {"pending": 0, "leased": 0, "dead_letter": 0}
    assert (root / "jobs" / "messages" / ".DS_Store").exists()


# -- 6. no fcntl (Windows) -------------------------------------------------------------------


def test_local_store_without_fcntl_raises_a_typed_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_mod, "fcntl", None)
    with pytest.raises(PlatformNotSupported) as info:
        LocalStore(tmp_path / "store")
    assert isinstance(info.value, ImportError) and isinstance(info.value, StorageError)
    assert "Windows" in str(info.value) and "fcntl" in str(info.value)
    assert not (tmp_path / "store").exists()


def test_without_fcntl_the_rest_of_the_library_imports(tmp_path: Path) -> None:
    """On Windows ``import fcntl`` fails; the memory and S3 stores must not need it."""
    code = (
        "import sys; sys.modules['fcntl'] = None\n"
        "import pawn_queue_sync\n"
        "from pawn_queue_sync.storage.memory import MemoryStore\n"
        "from pawn_queue_sync.storage.s3 import S3Store\n"
        "from pawn_queue_sync.storage.local import LocalStore\n"
        "from pawn_queue_sync.errors import PlatformNotSupported\n"
        "MemoryStore().put('k', b'v')\n"
        "try:\n"
        f"    LocalStore({str(tmp_path / 'store')!r})\n"
        "except PlatformNotSupported as exc:\n"
        "    print('refused:', exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=WAIT * 2
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused:") and "Windows" in done.stdout


# -- 7. F_FULLFSYNC ---------------------------------------------------------------------------

_FAKE_F_FULLFSYNC = 51  # its value on macOS


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str]]]:
    """Record each flush as ("fsync" | "fullfsync", "file" | "dir"); F_FULLFSYNC as on
    macOS (the test may make it fail or remove it)."""
    calls: list[tuple[str, str]] = []
    real_fcntl = fcntl.fcntl

    def kind(fd: int) -> str:
        return "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"

    def fake_fcntl(fd: int, cmd: int, arg: Any = 0) -> Any:
        if cmd == _FAKE_F_FULLFSYNC:
            calls.append(("fullfsync", kind(fd)))
            return 0
        return real_fcntl(fd, cmd, arg)

    monkeypatch.setattr(fcntl, "F_FULLFSYNC", _FAKE_F_FULLFSYNC, raising=False)
    monkeypatch.setattr(fcntl, "fcntl", fake_fcntl)
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(("fsync", kind(fd))))
    yield calls


def test_fsync_uses_f_fullfsync_where_the_platform_has_it(
    tmp_path: Path, syncs: list[tuple[str, str]]
) -> None:
    store = LocalStore(tmp_path / "store")
    store.put("a/b.json", b"v")
    store.delete("a/b.json")
    assert ("fullfsync", "file") in syncs and ("fullfsync", "dir") in syncs, syncs
    assert [c for c in syncs if c[0] == "fsync"] == []


def test_fsync_falls_back_when_f_fullfsync_fails_or_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, syncs: list[tuple[str, str]]
) -> None:
    store = LocalStore(tmp_path / "store")
    faked = fcntl.fcntl

    def unsupported(fd: int, cmd: int, arg: Any = 0) -> Any:
        if cmd == _FAKE_F_FULLFSYNC:
            faked(fd, cmd, arg)  # recorded as tried
            raise OSError(errno.ENOTSUP, os.strerror(errno.ENOTSUP))
        return faked(fd, cmd, arg)

    monkeypatch.setattr(fcntl, "fcntl", unsupported)
    store.put("a/b.json", b"v")
    assert ("fsync", "file") in syncs and ("fsync", "dir") in syncs, syncs
    syncs.clear()
    monkeypatch.delattr(fcntl, "F_FULLFSYNC")
    store.put("a/c.json", b"v")
    assert {c[0] for c in syncs} == {"fsync"}, syncs


def test_no_flush_at_all_without_fsync(tmp_path: Path, syncs: list[tuple[str, str]]) -> None:
    store = LocalStore(tmp_path / "store", fsync=False)
    store.put("a/b.json", b"v")
    store.delete("a/b.json")
    assert syncs == []


def test_full_disk_queue_starts_reports_stats_and_acks_held_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new process on a full disk still sets up (the local store is not probed with
    a write), reports stats and acks what it holds; publishing says the disk is full."""
    from pawn_queue_sync import PawnQueue, PublishError, StoreFull
    from pawn_queue_sync.protocol.probe import clear_cache

    config = {"local": {"path": str(tmp_path / "store")}}
    with PawnQueue.from_config(config) as pq:
        pq.create_topic("jobs")
        pq.register_producer("p").publish_batch("jobs", [{"n": i} for i in range(3)])
        consumer = pq.register_consumer("c", topics=["jobs"])
        held = consumer.poll()
        assert len(held) == 3
        disk = FullDisk(monkeypatch)
        for msg in held:
            msg.ack()
        with pytest.raises(PublishError) as info:
            pq.register_producer("p").publish("jobs", {"n": 9})
        assert isinstance(info.value.__cause__, StoreFull) and "disk full" in str(info.value)
    clear_cache()  # as in a new process: a new worker, or `pawnq topics --stats`
    with PawnQueue.from_config(config) as pq:
        assert pq.topic_stats("jobs") == {"pending": 0, "leased": 0, "dead_letter": 0}
    assert disk.refused  # the publish was refused
