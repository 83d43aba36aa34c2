"""Regressions of the embedded local store (``pawn_queue_sync.storage.local``).

Each test reproduces one defect found in the field:

* a full disk wedged the store (now: reads, listings and deletes go on, writes raise
  :class:`StoreFull`, the conditions are known without a probe write, and the temp
  files of dead writers are swept to make room);
* a fork while another thread held a key's lock hung the child, and blocked the
  parent on that lock stripe for as long as the child lived;
* the temp files of killed writers stayed an hour;
* on a case-insensitive file system ``Orders`` and ``orders`` shared a directory;
* OS litter (``.DS_Store``, ``Thumbs.db``, ``._*``) was listed, so consumers
  dead-lettered it as a foreign object;
* without ``fcntl`` (Windows) importing even the memory store failed, and the local
  store gave no clear error;
* on macOS, ``os.fsync`` without ``F_FULLFSYNC`` is not durable.

A full disk and case-insensitive file systems cannot be mounted here, so they are
simulated: :class:`FullDisk` makes the system calls that need free space fail with
ENOSPC, and a ``.PAWNQ`` symlink makes the store's own case check see what a
case-insensitive file system shows. Forks and killed writers are real processes; every
wait on them has a timeout, so a regression fails instead of hanging.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
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
    StoreFull,
)
from pawn_queue_sync.storage import local as local_mod
from pawn_queue_sync.storage import local_files
from pawn_queue_sync.storage.base import Listing
from pawn_queue_sync.storage.local import PRIVATE_DIR, LocalStore

#: Seconds any wait on another process or thread may take before the test fails.
WAIT = 30.0

#: Forking while threads run is what these tests are about (Python 3.12+ warns).
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*use of fork\\(\\) may lead to deadlocks:DeprecationWarning"
)


def keys_of(listing: Listing) -> list[str]:
    return [o.key for o in listing.objects]


def _enospc(path: object = None) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)


class FullDisk:
    """Make the system calls that need free space fail with ENOSPC, as on a full disk:
    writing bytes, creating a file, directory or link, renaming. Opening an existing
    file, reading, fsync, utime and unlink still work. ``full()`` says whether the disk
    is full at the moment of the call (always, by default)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, full: Callable[[], bool] = lambda: True):
        self.full = full
        self.refused: list[str] = []
        real_open, real_write, real_mkdir = os.open, os.write, os.mkdir
        real_link, real_replace, real_rename = os.link, os.replace, os.rename

        def refuse(what: str, path: object = None) -> OSError:
            self.refused.append(what)
            return _enospc(path)

        def fake_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if flags & os.O_CREAT and self.full() and not os.path.lexists(path):
                raise refuse("create", path)
            return real_open(path, flags, *args, **kwargs)

        def fake_write(fd: int, data: Any) -> int:
            if self.full() and len(data):
                raise refuse("write")
            return real_write(fd, data)

        def fake_mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
            if self.full() and not os.path.lexists(path):
                raise refuse("mkdir", path)
            real_mkdir(path, *args, **kwargs)

        def guarded(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                if self.full():
                    raise refuse(name, args[-1] if args else None)
                return real(*args, **kwargs)

            return call

        monkeypatch.setattr(os, "open", fake_open)
        monkeypatch.setattr(os, "write", fake_write)
        monkeypatch.setattr(os, "mkdir", fake_mkdir)
        monkeypatch.setattr(os, "link", guarded("link", real_link))
        monkeypatch.setattr(os, "replace", guarded("replace", real_replace))
        monkeypatch.setattr(os, "rename", guarded("rename", real_rename))


def _place(root: Path, key: str, body: bytes) -> None:
    """Put a file where the store keeps ``key``, as a sync tool would (not through the
    store: no lock file of its stripe is created)."""
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)


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
        _place(root, name, name.encode())
    _place(root, "t/leases/m0.lease", b"lease")
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
        _place(root, f"t/messages/{name}", b"junk")
        _place(root, name, b"junk")
    for name in LITTER_DIRS:
        _place(root, f"{name}/inside", b"junk")
        _place(root, f"t/{name}/inside", b"junk")
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
            _place(root, f"jobs/messages/{name}", b"\x00\x05Bud1 finder junk")
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
