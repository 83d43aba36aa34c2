"""Store tests of one store each: LocalStore (processes racing, key validation, temp
files, the private directory) and MemoryStore (fault hooks, injected clock). The
contract every store meets is test_store_contract.py."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from pawn_queue_sync.clock import FakeClock
from pawn_queue_sync.storage.base import ConditionFailed, ObjectNotFound, StorageError
from pawn_queue_sync.storage.local import PRIVATE_DIR, LocalStore
from pawn_queue_sync.storage.memory import MemoryStore

from .store_helpers import JOIN_TIMEOUT, keys_of, md5

# -- LocalStore only ------------------------------------------------------------------


@pytest.fixture
def local_store(tmp_path: Path) -> LocalStore:
    """A LocalStore in a fresh directory."""
    return LocalStore(tmp_path / "store")


def _create_race_worker(root: str, keys: list[str], who: int, barrier: Any, results: Any) -> None:
    """One process of the create-only race: try every key, report what it won."""
    store = LocalStore(root)
    won: list[str] = []
    errors: list[str] = []
    barrier.wait(timeout=JOIN_TIMEOUT)
    for key in keys:
        try:
            store.put(key, f"process {who}".encode(), if_none_match=True)
            won.append(key)
        except ConditionFailed:
            pass
        except Exception as exc:
            errors.append(f"{key}: {exc!r}")
    results.put((who, won, errors))


def test_local_processes_racing_create_only_each_key_won_once(tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    LocalStore(root)
    keys = [f"mp/{i % 7}/k{i:03d}" for i in range(200)]
    ctx = multiprocessing.get_context("spawn")
    n = 3
    barrier = ctx.Barrier(n)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_create_race_worker, args=(root, keys, who, barrier, results))
        for who in range(n)
    ]
    for p in procs:
        p.start()
    reports = [results.get(timeout=JOIN_TIMEOUT) for _ in procs]
    for p in procs:
        p.join(JOIN_TIMEOUT)
        assert p.exitcode == 0

    wins: Counter[str] = Counter()
    owner: dict[str, int] = {}
    for who, won, errors in reports:
        assert errors == []
        wins.update(won)
        owner.update(dict.fromkeys(won, who))
    assert set(wins) == set(keys)
    assert all(count == 1 for count in wins.values()), wins.most_common(3)
    store = LocalStore(root)
    for key in keys:
        assert store.get(key).body == f"process {owner[key]}".encode()


BAD_KEYS = [
    "",
    "/abs",
    "a//b",
    "a/",
    "a/../b",
    "..",
    "../escape",
    "./a",
    "a/.",
    "a\x00b",
    "a\nb",
    "tab\there",
    "del\x7f",
    f"{PRIVATE_DIR}/tmp/x",
    PRIVATE_DIR,
    "x" * 1025,
    "bad\udcffsurrogate",
]


@pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
def test_local_rejects_bad_keys(local_store: LocalStore, key: str) -> None:
    def plain(op: Callable[[], object]) -> None:
        with pytest.raises(StorageError) as info:
            op()
        assert not isinstance(info.value, ObjectNotFound | ConditionFailed), info.value

    plain(lambda: local_store.put(key, b"v"))
    plain(lambda: local_store.put(key, b"v", if_none_match=True))
    plain(lambda: local_store.get(key))
    plain(lambda: local_store.head(key))
    plain(lambda: local_store.delete(key))
    plain(lambda: local_store.copy(key, "ok"))
    assert local_store.delete_many([key]) == [key]
    local_store.put("ok", b"v")
    plain(lambda: local_store.copy("ok", key))


def test_local_keys_with_dots_and_unicode_are_fine(local_store: LocalStore) -> None:
    for key in ("a..b", ".hidden", "x/.pawnq/y", "x/...", "caf\u00e9/\U0001f600.json", "sp ace"):
        local_store.put(key, key.encode())
        assert local_store.get(key).body == key.encode()


def test_local_leaves_no_temp_files(local_store: LocalStore, tmp_path: Path) -> None:
    s = local_store
    s.put("a/b", b"1")
    s.put("a/b", b"2")
    with pytest.raises(ConditionFailed):
        s.put("a/b", b"3", if_none_match=True)
    with pytest.raises(ConditionFailed):
        s.put("a/b", b"3", if_match="0" * 32)
    s.put("a/b", b"4", if_match=md5(b"2"))
    s.copy("a/b", "a/c")
    with pytest.raises(ConditionFailed):
        s.copy("a/b", "a/c", if_none_match=True)
    with pytest.raises(StorageError):
        s.put("a/b/under-a-file", b"x")  # the key "a/b" is a file
    s.delete("a/c")
    s.delete_many(["a/b"])
    tmp_dir = tmp_path / "store" / PRIVATE_DIR / "tmp"
    assert tmp_dir.is_dir()
    assert list(tmp_dir.iterdir()) == []


def test_local_removes_only_stale_temp_files_at_startup(tmp_path: Path) -> None:
    LocalStore(tmp_path / "store")
    tmp_dir = tmp_path / "store" / PRIVATE_DIR / "tmp"
    stale = tmp_dir / "stale.tmp"
    fresh = tmp_dir / "fresh.tmp"
    stale.write_bytes(b"left by a crashed writer")
    fresh.write_bytes(b"being written right now")
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))
    LocalStore(tmp_path / "store")
    assert not stale.exists()
    assert fresh.exists()


def test_local_private_dir_never_listed(local_store: LocalStore) -> None:
    local_store.put("k", b"v")
    local_store.put("d/k", b"v")
    assert keys_of(local_store.list("")) == ["d/k", "k"]
    top = local_store.list("", delimiter="/")
    assert top.prefixes == ["d/"]
    assert keys_of(top) == ["k"]
    for prefix in (".", ".p", PRIVATE_DIR, f"{PRIVATE_DIR}/", f"{PRIVATE_DIR}/tmp/"):
        listing = local_store.list(prefix)
        assert listing.objects == [] and listing.prefixes == [], prefix


def test_local_uses_s3_key_layout(local_store: LocalStore, tmp_path: Path) -> None:
    local_store.put("a/b/c.json", b"{}")
    assert (tmp_path / "store" / "a" / "b" / "c.json").read_bytes() == b"{}"


def test_local_empty_directories_are_not_listed(local_store: LocalStore) -> None:
    local_store.put("e/sub/k", b"v")
    local_store.delete("e/sub/k")
    listing = local_store.list("e/", delimiter="/")
    assert listing.objects == [] and listing.prefixes == []
    assert local_store.list("").objects == []


def test_local_key_cannot_be_file_and_prefix(local_store: LocalStore) -> None:
    """A documented difference from S3: "a" and "a/b" cannot both exist on disk."""
    local_store.put("a/b", b"v")
    for op in (
        lambda: local_store.put("a", b"v"),
        lambda: local_store.put("a", b"v", if_none_match=True),
    ):
        with pytest.raises(StorageError) as info:
            op()
        assert not isinstance(info.value, ConditionFailed)
    with pytest.raises(ObjectNotFound):
        local_store.get("a")
    with pytest.raises(ObjectNotFound):
        local_store.get("a/b/c")
    local_store.delete("a")  # no such object: fine
    assert local_store.get("a/b").body == b"v"


def test_local_oserror_becomes_storage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(StorageError):
        LocalStore(blocker / "store")
    store = LocalStore(tmp_path / "store")
    with pytest.raises(StorageError) as info:
        store.put("n" * 300, b"v")  # a component longer than NAME_MAX
    assert not isinstance(info.value, ConditionFailed | ObjectNotFound)
    assert info.value.key == "n" * 300


def test_local_describe_and_root_creation(tmp_path: Path) -> None:
    root = tmp_path / "deep" / "er"
    store = LocalStore(root)
    assert root.is_dir()
    assert store.describe() == f"local:{root.absolute()}"


def test_local_works_in_a_forked_child(local_store: LocalStore) -> None:
    if not hasattr(os, "fork"):
        pytest.skip("no fork")
    local_store.put("fork/parent", b"p")
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=_forked_put, args=(local_store,))
    proc.start()
    proc.join(JOIN_TIMEOUT)
    assert proc.exitcode == 0
    assert local_store.get("fork/child").body == b"p"


def _forked_put(store: LocalStore) -> None:
    """Child of a fork: use the inherited store."""
    store.put("fork/child", store.get("fork/parent").body, if_none_match=True)


def test_local_without_fsync_still_works(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "nofsync", fsync=False)
    store.put("k", b"v", if_none_match=True)
    assert store.get("k").body == b"v"


# -- MemoryStore only -----------------------------------------------------------------


def test_memory_uses_injected_clock() -> None:
    clock = FakeClock(datetime(2030, 5, 1, tzinfo=timezone.utc))
    store = MemoryStore(clock)
    first = store.put("k", b"v")
    assert first.server_time == clock.now()
    assert store.head("k").last_modified == clock.now()
    clock.advance(90)
    assert store.server_time() == datetime(2030, 5, 1, 0, 1, 30, tzinfo=timezone.utc)
    store.put("k", b"w")
    assert store.head("k").last_modified == clock.now()


def test_memory_hooks_see_every_operation() -> None:
    calls: list[tuple[str, str]] = []
    store = MemoryStore(hooks=lambda op, key: calls.append((op, key)))
    store.put("a", b"v")
    store.get("a")
    store.head("a")
    store.copy("a", "b")
    store.list("p/")
    store.delete("a")
    store.delete_many(["b"])
    store.server_time()
    assert calls == [
        ("put", "a"),
        ("get", "a"),
        ("head", "a"),
        ("copy", "b"),
        ("list", "p/"),
        ("delete", "a"),
        ("delete_many", "b"),
        ("server_time", ""),
    ]


def test_memory_hook_can_fail_an_operation() -> None:
    def fail_puts_to_x(op: str, key: str) -> None:
        if op in ("put", "delete_many") and key.startswith("x"):
            raise StorageError("injected", key=key)

    store = MemoryStore(hooks=fail_puts_to_x)
    with pytest.raises(StorageError, match="injected"):
        store.put("x1", b"v")
    with pytest.raises(ObjectNotFound):
        store.get("x1")
    store.put("y1", b"v")
    assert store.delete_many(["x9", "y1"]) == ["x9"]
    with pytest.raises(ObjectNotFound):
        store.get("y1")


def test_memory_hook_can_block_an_operation() -> None:
    entered = threading.Event()
    release = threading.Event()

    def hold_gets(op: str, key: str) -> None:
        if op == "get":
            entered.set()
            assert release.wait(JOIN_TIMEOUT)

    store = MemoryStore(hooks=hold_gets)
    store.put("k", b"old")
    seen: list[bytes] = []
    reader = threading.Thread(target=lambda: seen.append(store.get("k").body), daemon=True)
    reader.start()
    assert entered.wait(JOIN_TIMEOUT)
    store.put("k", b"new")  # the store's lock is not held while the hook blocks
    assert seen == []
    release.set()
    reader.join(JOIN_TIMEOUT)
    assert seen == [b"new"]
