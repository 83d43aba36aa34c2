"""Regressions of the embedded local store (``pawn_queue_sync.storage.local``).

Each test reproduces one defect found in the field:

* a full disk wedged the store (now: reads, listings and deletes go on, writes raise
  :class:`StoreFull`, the conditions are known without a probe write, and the temp
  files of dead writers are swept to make room);
* a fork while another thread held a key's lock hung the child, and blocked the
  parent on that lock stripe for as long as the child lived;
* the temp files of killed writers stayed an hour.

Case-insensitive file systems, OS litter, Windows and macOS: test_local_platforms.py.

A full disk cannot be mounted here, so it is simulated: ``tests.local_disk.FullDisk``
makes the system calls that need free space fail with ENOSPC. Forks and killed
writers are real processes; every wait on them has a timeout, so a regression fails
instead of hanging.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from pathlib import Path

import pytest

from pawn_queue_sync.errors import (
    ConditionFailed,
    StorageError,
    StoreFull,
)
from pawn_queue_sync.storage import local_files
from pawn_queue_sync.storage.local import PRIVATE_DIR, LocalStore

from .local_disk import FullDisk, place
from .store_helpers import keys_of

#: Seconds any wait on another process or thread may take before the test fails.
WAIT = 30.0

#: Forking while threads run is what these tests are about (Python 3.12+ warns).
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*use of fork\\(\\) may lead to deadlocks:DeprecationWarning"
)


# -- 1. a full disk ---------------------------------------------------------------------


def test_full_disk_writes_raise_store_full_naming_enospc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path / "store")
    store.put("t/messages/old.json", b"old")
    FullDisk(monkeypatch)
    for write in (
        lambda: store.put("t/leases/new.lease", b"lease", if_none_match=True),
        lambda: store.put("t/messages/old.json", b"new"),
        lambda: store.put("brand/new/dir", b"x"),
        lambda: store.copy("t/messages/old.json", "t/dead-letter/old.json"),
    ):
        with pytest.raises(StoreFull) as info:
            write()
        assert isinstance(info.value, StorageError)
        text = str(info.value)
        assert "disk full" in text and "ENOSPC" in text, text
    assert list((tmp_path / "store" / PRIVATE_DIR / "tmp").iterdir()) == []


def test_full_disk_reads_listings_and_deletes_keep_working(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What an operator needs to get out: stats, reading held messages, acking them
    (deletes, also If-Match ones), a new store (worker) on the directory. The objects
    were placed by another tool, so no lock file of theirs existed before the store
    was opened."""
    root = tmp_path / "store"
    names = [f"t/messages/m{i}.json" for i in range(12)]
    for name in names:
        place(root, name, name.encode())
    place(root, "t/leases/m0.lease", b"lease")
    LocalStore(root)  # the directory was opened once while there was room
    disk = FullDisk(monkeypatch)

    store = LocalStore(root)  # a worker starting on the full disk
    assert keys_of(store.list("t/messages/")) == sorted(names)
    assert store.get(names[0]).body == names[0].encode()
    assert store.head(names[1]).size == len(names[1])
    lease = store.head("t/leases/m0.lease")
    with pytest.raises(ConditionFailed):
        store.delete("t/leases/m0.lease", if_match="0" * 32)
    store.delete("t/leases/m0.lease", if_match=lease.etag)
    for name in names[:6]:
        store.delete(name)
    assert store.delete_many(names[6:]) == []
    assert store.list("t/").objects == []
    assert disk.refused == [], "a read or delete needed free space"


def test_full_disk_conditions_are_known_without_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The capability probe writes scratch objects; on a full disk that failed, so no
    worker (nor ``pawnq topics --stats``) could start. The local store states what it
    enforces, and the statement is true."""
    store = LocalStore(tmp_path / "store")
    first = store.put("k", b"1")
    with pytest.raises(ConditionFailed):
        store.put("k", b"2", if_none_match=True)
    with pytest.raises(ConditionFailed):
        store.put("k", b"2", if_match="0" * 32)
    with pytest.raises(ConditionFailed):
        store.delete("k", if_match="0" * 32)
    assert store.get("k").etag == first.etag

    disk = FullDisk(monkeypatch)
    known = LocalStore(tmp_path / "store").known_conditions()
    assert (known.if_none_match, known.if_match) == (True, True)
    assert disk.refused == []


def _writer_stuck_in_fsync(store: LocalStore, key: str) -> int:
    """Fork a process that writes ``key`` through ``store`` and stops inside the fsync
    of its temp file (so the temp exists); returns its pid. (The child does not open a
    store of its own, which would clean up the temps of writers killed before.)"""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(ready_r)
            signal.alarm(int(WAIT * 4))  # never outlive a failed test

            def stuck(fd: int) -> None:
                os.write(ready_w, b"!")
                while True:
                    time.sleep(3600)

            os.fsync = stuck
            local_files._flush = stuck  # type: ignore[attr-defined]  (F_FULLFSYNC on macOS)
            store.put(key, b"x" * 4096)
        finally:
            os._exit(1)
    os.close(ready_w)
    try:
        ready, _, _ = select.select([ready_r], [], [], WAIT)
        if not ready:
            _kill(pid)
            pytest.fail("the writer never reached fsync")
        os.read(ready_r, 1)
    finally:
        os.close(ready_r)
    return pid


def _kill(pid: int) -> None:
    """SIGKILL ``pid`` and reap it (a zombie would still look alive)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    os.waitpid(pid, 0)


def _temps(root: Path) -> list[str]:
    return sorted(p.name for p in (root / PRIVATE_DIR / "tmp").iterdir())


def test_full_disk_write_sweeps_dead_writers_temps_and_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed writers' temp files are what filled the disk: a write that finds the disk
    full removes them and tries once more."""
    root = tmp_path / "store"
    store = LocalStore(root)
    _kill(_writer_stuck_in_fsync(store, "t/messages/big.json"))
    (dead_temp,) = _temps(root)
    FullDisk(monkeypatch, full=lambda: (root / PRIVATE_DIR / "tmp" / dead_temp).exists())
    store.put("t/leases/a.lease", b"lease", if_none_match=True)
    assert store.get("t/leases/a.lease").body == b"lease"
    assert _temps(root) == []


# -- 2. fork while a thread holds a key's lock -----------------------------------------------


def test_fork_while_a_thread_holds_a_key_lock(tmp_path: Path) -> None:
    """A thread holds the lock of a key (as during a put) when another thread forks.
    The child must be able to write and read that key once the parent's thread lets
    go, and the parent must not be blocked on it while the child lives."""
    store = LocalStore(tmp_path / "store")
    key = "t/messages/contended.json"
    store.put(key, b"before")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store._locked(key):  # what put and delete hold while they act
            held.set()
            release.wait(WAIT * 4)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(WAIT)
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            signal.alarm(int(WAIT * 4))
            os.close(to_child_w)
            os.close(from_child_r)
            store.put(key, b"child")
            os.write(from_child_w, store.get(key).body)
            os.read(to_child_r, 1)  # live on until the parent has written the key
            code = 0
        finally:
            os._exit(code)
    os.close(to_child_r)
    os.close(from_child_w)
    try:
        release.set()
        holder.join(WAIT)
        ready, _, _ = select.select([from_child_r], [], [], WAIT)
        assert ready, "the forked child could not write the key the parent's thread held"
        assert os.read(from_child_r, 64) == b"child"

        written = threading.Event()

        def parent_put() -> None:
            store.put(key, b"parent")
            written.set()

        threading.Thread(target=parent_put, daemon=True).start()
        assert written.wait(WAIT), "the parent is blocked on the key while the child lives"
        assert store.get(key).body == b"parent"
        os.write(to_child_w, b"x")
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                assert os.waitstatus_to_exitcode(status) == 0
                pid = 0
                break
            time.sleep(0.05)
        assert pid == 0, "the child did not exit"
    finally:
        release.set()
        os.close(to_child_w)
        os.close(from_child_r)
        if pid:
            _kill(pid)


# -- 3. temp files of killed writers ---------------------------------------------------------


def test_temps_of_killed_writers_go_at_once_and_live_writers_stay(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = LocalStore(root)
    live = _writer_stuck_in_fsync(store, "t/messages/live.json")
    try:
        (live_temp,) = _temps(root)
        for i in range(3):
            _kill(_writer_stuck_in_fsync(store, f"t/messages/killed{i}.json"))
        assert len(_temps(root)) == 4
        LocalStore(root)  # a worker starts (e.g. to replace the killed ones)
        assert _temps(root) == [live_temp]
    finally:
        _kill(live)


def test_temps_of_other_hosts_and_old_versions_wait_for_their_age(tmp_path: Path) -> None:
    """A temp whose writer cannot be checked (another host or PID namespace, or a name
    from an older version) is removed only once it is an hour old."""
    root = tmp_path / "store"
    LocalStore(root)
    tmp_dir = root / PRIVATE_DIR / "tmp"
    foreign = [
        f"{'f' * 12}-{os.getpid() + 1_000_000}-{'0' * 32}.tmp",  # other host, dead-looking pid
        f"{'1' * 32}.tmp",  # the old naming: no writer recorded
    ]
    for name in foreign:
        (tmp_dir / name).write_bytes(b"partial")
    LocalStore(root)
    assert _temps(root) == sorted(foreign)
    hour_ago = time.time() - local_files.STALE_TEMP_SECONDS - 60
    for name in foreign:
        os.utime(tmp_dir / name, (hour_ago, hour_ago))
    LocalStore(root)
    assert _temps(root) == []
