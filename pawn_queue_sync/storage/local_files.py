"""Files of the local store (:mod:`.local`): durable writes (``F_FULLFSYNC`` or
fsync), OS errors as storage errors (a full disk as :class:`StoreFull`), the registry
of held lock descriptors a forked child closes, and temp files named after their
writer so that those of dead writers can be removed."""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import logging
import os
import re
import socket
import stat
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType

from ..errors import StoreFull
from .base import ConditionFailed, StorageError

log = logging.getLogger("pawn_queue_sync.storage.local")

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # Windows: LocalStore() says so; importing still works
    fcntl = None

#: A temp file whose writer cannot be checked (another host or PID namespace, or a name
#: from an older version) is left over from a crashed writer once it is this old.
STALE_TEMP_SECONDS = 3600.0

#: Errors that mean the disk (or the user's quota) is full.
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})

#: ``{host}-{pid}-{random}.tmp``: the name of a temp file being written.
_TEMP_RE = re.compile(r"(?P<host>[0-9a-f]{12})-(?P<pid>[0-9]{1,10})-[0-9a-f]{32}\.tmp")

_CHUNK = 1 << 20


def _utcnow() -> datetime:
    """The machine's time, aware UTC."""
    return datetime.now(timezone.utc)


def _mtime(st: os.stat_result) -> datetime:
    """A file's mtime as an aware UTC datetime."""
    return datetime.fromtimestamp(st.st_mtime_ns / 1e9, tz=timezone.utc)


def _describe_oserror(exc: OSError) -> str:
    """A short description of an OSError without the (absolute) file names."""
    name = errno.errorcode.get(exc.errno or 0, "") if exc.errno else ""
    text = exc.strerror or exc.__class__.__name__
    return f"{text} [{name}]" if name else text


def _is_full(exc: OSError) -> bool:
    """Whether an OSError says the disk (or quota) is full."""
    return exc.errno in _FULL_ERRNOS


def _translated(op: str, exc: OSError, key: str | None) -> StorageError:
    """The StorageError for an OSError of ``op``: :class:`StoreFull` for a full disk."""
    if _is_full(exc):
        return StoreFull(
            f"{op} failed: disk full ({_describe_oserror(exc)}); reads, listings and "
            "deletes still work: ack or delete messages, or free space",
            key=key,
        )
    return StorageError(f"{op} failed: {_describe_oserror(exc)}", key=key)


def _flush(fd: int) -> None:
    """Make what was written to ``fd`` (a file or a directory) durable.

    On macOS ``fsync`` only hands the data to the drive, whose cache may lose it on
    power loss; ``F_FULLFSYNC`` flushes that cache too. Where a platform has it, it is
    used, falling back to ``fsync`` when the file system refuses it (some network file
    systems do).
    """
    full_fsync = getattr(fcntl, "F_FULLFSYNC", None)
    if fcntl is not None and full_fsync is not None:
        try:
            fcntl.fcntl(fd, full_fsync)
            return
        except OSError:
            pass
    os.fsync(fd)


# -- locks across fork ------------------------------------------------------------------
#
# A flock belongs to the open file description, which a forked child shares: a lock a
# thread held at the fork would stay held until the child exited (the parent's close
# no longer releases it), so the child would block on its own inherited lock and the
# parent on that stripe. Every descriptor of a lock file this process holds is in
# _HELD_LOCK_FDS; a fork waits for _FORK_GUARD (held only while a descriptor is opened
# and registered, or unregistered and closed, never while waiting for a flock), and the
# child closes its copies of them, which leaves the parent's locks to the parent.

_FORK_GUARD = threading.Lock()
_HELD_LOCK_FDS: set[int] = set()


def _before_fork() -> None:
    _FORK_GUARD.acquire()


def _after_fork_in_parent() -> None:
    _FORK_GUARD.release()


def _after_fork_in_child() -> None:
    for fd in _HELD_LOCK_FDS:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD_LOCK_FDS.clear()
    _FORK_GUARD.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )


# -- temp files and their writers ------------------------------------------------------


@functools.cache
def _host_token() -> str:
    """12 hex digits naming this host's process-id space, so a temp file's PID is
    checked only where it means the same process: the host name and, on Linux, the
    boot and the PID namespace (containers sharing a directory have their own)."""
    parts = [socket.gethostname()]
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    with contextlib.suppress(OSError):
        ns = os.stat("/proc/self/ns/pid")
        parts.append(f"{ns.st_dev}:{ns.st_ino}")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def _temp_name() -> str:
    """A fresh temp file name naming its writer (host token and PID)."""
    return f"{_host_token()}-{os.getpid()}-{uuid.uuid4().hex}.tmp"


def _pid_running(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (a zombie counts: not yet reaped;
    a process of another user counts: we may not signal it)."""
    if pid <= 0:
        return True  # not a writer's PID: cannot tell
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _temp_is_dead(name: str, mtime: float, now: float) -> bool:
    """Whether a temp file is left over from a writer that cannot finish: its writer
    (same host token) is no longer running, or, when that cannot be checked, it is
    :data:`STALE_TEMP_SECONDS` old."""
    match = _TEMP_RE.fullmatch(name)
    if match is not None and match["host"] == _host_token():
        pid = int(match["pid"])
        if pid != os.getpid() and not _pid_running(pid):
            return True
    return mtime < now - STALE_TEMP_SECONDS


def read_file(path: Path) -> tuple[bytes, os.stat_result] | None:
    """Body and stat of a regular file, or None if there is no object there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        chunks = []
        while chunk := os.read(fd, _CHUNK):
            chunks.append(chunk)
        return b"".join(chunks), st
    finally:
        os.close(fd)


def _unlink_quietly(path: Path) -> None:
    """Remove a temp file; it may already be gone."""
    with contextlib.suppress(OSError):
        os.unlink(path)




# -- publishing a temp file atomically -------------------------------------------------


def write_temp(tmp_dir: Path, data: bytes, *, fsync: bool) -> Path:
    """Write ``data`` to a new private temp file (fsynced) and return its path."""
    tmp = tmp_dir / _temp_name()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if fsync:
            _flush(fd)
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp)
        raise
    os.close(fd)
    return tmp


def link_new(tmp: Path, path: Path, key: str) -> None:
    """Publish ``tmp`` at ``path`` only if nothing is there (atomic)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        if path.is_dir():
            raise StorageError(
                "key is a prefix of other keys; a local store cannot hold both", key=key
            ) from None
        raise ConditionFailed("If-None-Match: the key exists", key=key) from None


def replace_with(tmp: Path, path: Path, key: str) -> None:
    """Publish ``tmp`` at ``path``, replacing whatever object is there (atomic)."""
    try:
        os.replace(tmp, path)
    except IsADirectoryError:
        raise StorageError(
            "key is a prefix of other keys; a local store cannot hold both", key=key
        ) from None


def ensure_dir(root: Path, directory: Path, key: str, *, fsync: bool) -> None:
    """Create ``directory`` and missing parents, fsyncing each new entry's parent."""
    if directory.is_dir():
        return
    if directory == root:
        raise StorageError("store root has disappeared", key=key)
    ensure_dir(root, directory.parent, key, fsync=fsync)
    try:
        directory.mkdir(exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise StorageError(
            "a prefix of the key is itself a key; a local store cannot hold both", key=key
        ) from None
    sync_dir(directory.parent, fsync=fsync)


def sync_dir(directory: Path, *, fsync: bool) -> None:
    """fsync a directory so a rename, link or unlink in it is durable."""
    if not fsync:
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _flush(fd)
    finally:
        os.close(fd)


# -- striped locks --------------------------------------------------------------------

#: Number of lock files writes are striped over (by a hash of the key).
LOCK_STRIPES = 64


class StripedLocks:
    """:data:`LOCK_STRIPES` lock files in ``directory``; a key's writes and deletes hold
    the flock of the stripe its hash picks (threads and processes alike)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _lock_file(self, stripe: int) -> Path:
        """The lock file of a stripe."""
        return self.directory / f"{stripe:02d}.lock"

    def create_files(self) -> None:
        """Create every stripe's lock file now, so that deleting a key later never
        needs free space (a lock file made on demand would, and acks on a full disk
        would fail). Best effort: a read-only or full disk makes them on demand."""
        for stripe in range(LOCK_STRIPES):
            path = self._lock_file(stripe)
            if path.exists():
                continue
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
            except OSError as exc:
                log.debug("lock files of %s left for later: %s", self.directory,
                          _describe_oserror(exc))
                return

    @contextlib.contextmanager
    def locked(self, key: str) -> Iterator[None]:
        """Hold the exclusive flock of the key's stripe (threads and processes). The
        descriptor is registered while open, so a forked child closes its copy (see
        _after_fork_in_child) instead of keeping the lock."""
        assert fcntl is not None  # LocalStore() checks it
        stripe = int.from_bytes(hashlib.md5(key.encode("utf-8")).digest()[:4], "big")
        path = self._lock_file(stripe % LOCK_STRIPES)
        with _FORK_GUARD:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            _HELD_LOCK_FDS.add(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            with _FORK_GUARD:
                _HELD_LOCK_FDS.discard(fd)
                os.close(fd)  # releases the flock


def remove_dead_temps(tmp: Path) -> int:
    """Delete the temp files of writers that cannot finish (see
    :func:`_temp_is_dead`); returns how many were removed."""
    now = time.time()
    removed = 0
    try:
        with os.scandir(tmp) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    mtime = entry.stat(follow_symlinks=False).st_mtime
                    if _temp_is_dead(entry.name, mtime, now):
                        os.unlink(entry.path)
                        removed += 1
    except OSError as exc:
        log.warning("could not clean %s: %s", tmp, _describe_oserror(exc))
    return removed
