"""A directory on disk as an object store: the embedded default backend.

Key ``"a/b/c.json"`` is the file ``ROOT/a/b/c.json``, so a store written here can be
inspected (or synced to S3) with ordinary tools. The store is safe for many threads and
many processes on one machine:

* every write goes to a temp file in ``ROOT/.pawnq/tmp/``, is fsynced, then published
  atomically with ``os.replace`` (overwrite) or ``os.link`` (create-only: fails if the
  key exists), and the directory is fsynced;
* every write and delete of a key holds an ``fcntl.flock`` on one of
  :data:`LOCK_STRIPES` lock files in ``ROOT/.pawnq/locks/`` chosen by a hash of the key,
  so If-Match checks and the write they guard are atomic across processes;
* no file stays open between calls, and a lock another thread holds when the process
  forks is closed in the child (``os.register_at_fork``), so an instance keeps working
  in a forked child and the parent is never blocked by one;
* on a full disk (ENOSPC, or EDQUOT) writes raise :class:`StoreFull`, while reads,
  listings and deletes need no free space, so consumers can ack what they hold; the
  store's conditions are known without a probe write (:meth:`LocalStore.known_conditions`);
* temp files carry their writer's PID and a token of the host's process-id space; the
  temp of a writer that is no longer running (killed) is removed when a store opens
  the directory and when a write finds the disk full, any other after an hour;
* on file systems that ignore case (macOS and Windows defaults) a key whose directories
  exist in another letter case raises :class:`CaseCollision` when written and is
  absent when read, so topics ``Orders`` and ``orders`` never share a directory;
* files and directories operating systems leave behind (``.DS_Store``, ``._*``,
  ``Thumbs.db``, ``.Spotlight-V100``, ...) are not objects: never listed, not keys;
* fsync is ``F_FULLFSYNC`` where the platform has it (macOS), else ``os.fsync``.

It needs ``fcntl``, so not Windows: constructing one there raises
:class:`PlatformNotSupported` (importing this module works everywhere).

Differences from S3 that follow from using a file system: a key cannot also be a
"directory" of other keys (``"a"`` and ``"a/b"`` cannot both exist; the second write
raises :class:`StorageError`), key components are limited to the file system's
name length (usually 255 bytes), OS litter names are not keys, and on a file system
that ignores case, keys whose *last* components differ only in case name one file.
Directories are never removed, so listings skip them.
"""

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
import unicodedata
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType

import attrs

from ..errors import CaseCollision, PlatformNotSupported, StoreFull
from .base import (
    ConditionFailed,
    DeadlineExceeded,
    GetResult,
    Listing,
    ObjectInfo,
    ObjectNotFound,
    PutResult,
    StorageError,
    normalize_etag,
    time_left,
)

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # Windows: LocalStore() says so; build_listing still works
    fcntl = None

__all__ = [
    "LOCK_STRIPES",
    "PRIVATE_DIR",
    "KnownConditions",
    "LocalStore",
    "build_listing",
    "is_os_litter",
    "validate_key",
]

log = logging.getLogger(__name__)

#: Name of the store's private directory under the root; never listed, never a key.
PRIVATE_DIR = ".pawnq"

#: Number of lock files writes are striped over (by a hash of the key).
LOCK_STRIPES = 64

#: S3's limit on the UTF-8 length of a key.
MAX_KEY_BYTES = 1024

#: A temp file whose writer cannot be checked (another host or PID namespace, or a name
#: from an older version) is left over from a crashed writer once it is this old.
STALE_TEMP_SECONDS = 3600.0

#: Errors that mean the disk (or the user's quota) is full.
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})

#: Files that operating systems and file managers drop into folders they show
#: (compared ignoring case): Finder's ``.DS_Store``, Windows' thumbnail caches and
#: folder settings, KDE's ``.directory``. Nobody wrote them through a store.
OS_LITTER_FILES = frozenset(
    {".ds_store", "thumbs.db", "ehthumbs.db", "ehthumbs_vista.db", "desktop.ini", ".directory"}
)
#: Such files by name pattern: macOS AppleDouble files (``._name``, on file systems
#: without extended attributes), NFS "silly renames" and FUSE's hidden files of
#: deleted-but-open files.
_OS_LITTER_FILE_RE = re.compile(
    r"\._.*|\.nfs[0-9a-f]{8,}|\.fuse_hidden[0-9a-f]+", re.IGNORECASE | re.DOTALL
)
#: Directories that operating systems create (compared ignoring case): Spotlight and
#: FSEvents indexes, Trash folders, the recycle bin, Synology thumbnails, netatalk.
OS_LITTER_DIRS = frozenset(
    {
        ".spotlight-v100",
        ".trashes",
        ".fseventsd",
        ".temporaryitems",
        ".documentrevisions-v100",
        ".appledouble",
        ".appledb",
        ".appledesktop",
        "$recycle.bin",
        "system volume information",
        "@eadir",
    }
)

#: ``{host}-{pid}-{random}.tmp``: the name of a temp file being written.
_TEMP_RE = re.compile(r"(?P<host>[0-9a-f]{12})-(?P<pid>[0-9]{1,10})-[0-9a-f]{32}\.tmp")

_CHUNK = 1 << 20


#: Control characters (NUL included): no key has them.
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
#: What makes a file name unusable as a key component: a control character, or a lone
#: surrogate (how Python decodes a name that is not valid UTF-8).
_UNUSABLE_NAME_RE = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")
#: The first characters of every litter name (to skip the rest quickly).
_LITTER_INITIALS = frozenset(
    ch for name in OS_LITTER_FILES | OS_LITTER_DIRS | {"."} for ch in (name[0], name[0].upper())
)


def is_os_litter(name: str, *, is_dir: bool) -> bool:
    """Whether a file (or directory) name is one operating systems leave behind."""
    if not name or name[0] not in _LITTER_INITIALS:
        return False  # most names: listings call this for every entry
    if is_dir:
        return name.casefold() in OS_LITTER_DIRS
    return name.casefold() in OS_LITTER_FILES or _OS_LITTER_FILE_RE.fullmatch(name) is not None


@attrs.frozen
class KnownConditions:
    """The conditional requests a store enforces, known without probing it."""

    if_none_match: bool
    if_match: bool


def validate_key(key: object) -> str:
    """Return ``key`` if it is safe as a relative file path, else raise StorageError.

    Rejected: non-strings, empty keys, a leading ``/``, empty, ``.`` or ``..``
    components, control characters (NUL included), text that is not valid UTF-8, keys
    longer than :data:`MAX_KEY_BYTES`, keys inside the private ``.pawnq`` directory (in
    any letter case), and OS litter names (:func:`is_os_litter`): listings never show
    such files, so they cannot be objects.
    """
    if not isinstance(key, str):
        raise StorageError(f"key must be a string, not {type(key).__name__}")
    if not key:
        raise StorageError("key must not be empty", key=key)
    if _has_control_chars(key):
        raise StorageError("key must not contain control characters", key=key)
    try:
        encoded = key.encode("utf-8")
    except UnicodeEncodeError:
        raise StorageError("key is not valid UTF-8", key=key) from None
    if len(encoded) > MAX_KEY_BYTES:
        raise StorageError(f"key is longer than {MAX_KEY_BYTES} bytes", key=key)
    if key.startswith("/"):
        raise StorageError("key must not start with '/'", key=key)
    parts = key.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise StorageError("key must not have empty, '.' or '..' components", key=key)
    if parts[0].casefold() == PRIVATE_DIR:
        raise StorageError(f"keys under {PRIVATE_DIR!r} are reserved", key=key)
    if is_os_litter(parts[-1], is_dir=False) or any(
        is_os_litter(part, is_dir=True) for part in parts[:-1]
    ):
        raise StorageError(
            "key names a file operating systems leave behind (.DS_Store, ._*, "
            "Thumbs.db, ...); the local store never lists those",
            key=key,
        )
    return key


def build_listing(
    keys: Iterable[str],
    info: Callable[[str], ObjectInfo | None],
    prefix: str,
    limit: int | None,
    delimiter: str | None,
    server_time: datetime | None,
    start_after: str | None = None,
) -> Listing:
    """Turn keys in ascending order into a :class:`Listing`, the way S3 does.

    Keys not starting with ``prefix`` are skipped. With a ``delimiter``, a key whose
    rest (after the prefix) contains it is folded into the common prefix up to and
    including the delimiter's first occurrence. ``limit`` counts objects only, as the
    protocol says: the listing stops right after the ``limit``-th object (so it holds
    the common prefixes before it), and ``truncated`` says whether anything (an object
    or a new common prefix) follows, which is what S3's IsTruncated reports when paging
    with MaxKeys = objects still wanted. ``info`` returns None for a key that vanished
    meanwhile (it is then skipped). Keys up to ``start_after`` (in code point order,
    which is UTF-8 byte order) are skipped.
    """
    objects: list[ObjectInfo] = []
    prefixes: list[str] = []
    budget = None if limit is None else max(0, limit)
    last_prefix: str | None = None
    truncated = False
    for key in keys:
        if not key.startswith(prefix) or (start_after is not None and key <= start_after):
            continue
        common: str | None = None
        if delimiter:
            at = key.find(delimiter, len(prefix))
            if at >= 0:
                common = key[: at + len(delimiter)]
                if common == last_prefix:
                    continue
        if budget is not None and len(objects) >= budget:
            truncated = True
            break
        if common is not None:
            last_prefix = common
            prefixes.append(common)
            continue
        obj = info(key)
        if obj is not None:
            objects.append(obj)
    return Listing(objects=objects, prefixes=prefixes, server_time=server_time, truncated=truncated)


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


# -- case-insensitive file systems -----------------------------------------------------


def _is_case_insensitive(directory: Path) -> bool:
    """Whether names in ``directory`` are looked up ignoring case: its ``.pawnq``
    entry is found as ``.PAWNQ``. Reads only (works on a full or read-only disk)."""
    try:
        lower = os.stat(directory / PRIVATE_DIR)
        upper = os.stat(directory / PRIVATE_DIR.upper())
    except OSError:
        return False
    return (lower.st_dev, lower.st_ino) == (upper.st_dev, upper.st_ino)


def _nfc(name: str) -> str:
    """A name in NFC: HFS+ lists names decomposed (NFD); they are the same name."""
    return unicodedata.normalize("NFC", name)


def _entry_like(directory: Path, name: str) -> str | None:
    """The name of the entry of ``directory`` equal to ``name`` ignoring case (itself if
    it is there as spelled), None if there is none or no such directory."""
    wanted = _nfc(name).casefold()
    found: str | None = None
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if _nfc(entry.name) == _nfc(name):
                    return entry.name
                if found is None and _nfc(entry.name).casefold() == wanted:
                    found = entry.name
    except (FileNotFoundError, NotADirectoryError):
        return None
    return found


class LocalStore:
    """An object store in a directory; see the module docstring for the guarantees."""

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        if fcntl is None:
            raise PlatformNotSupported(
                "the local store needs POSIX file locks (the fcntl module), which "
                "Windows does not have: use an S3 store there (MinIO or SeaweedFS run "
                "locally), or run under WSL"
            )
        self._root = Path(root).absolute()
        self._fsync = fsync
        self._private = self._root / PRIVATE_DIR
        self._tmp = self._private / "tmp"
        self._locks = self._private / "locks"
        try:
            self._root.mkdir(parents=True, exist_ok=True)
            self._tmp.mkdir(parents=True, exist_ok=True)
            self._locks.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            where = f"creating the store directory {str(self._root)!r}"
            raise _translated(where, exc, None) from exc
        self._create_lock_files()
        self._case_insensitive = _is_case_insensitive(self._root)
        #: Directories (relative paths) seen on disk spelled exactly as keys spell them.
        self._spelled_dirs: set[str] = set()
        self._remove_stale_temps()

    @property
    def case_insensitive(self) -> bool:
        """Whether the file system ignores case in names under the root (found at
        construction: ``.pawnq`` is also ``.PAWNQ``)."""
        return self._case_insensitive

    def known_conditions(self) -> KnownConditions:
        """What this store enforces: If-None-Match (create by link) and If-Match (under
        the key's lock), always. A capability probe would have to write, which fails on
        a full disk and would stop every new worker; use this instead."""
        return KnownConditions(if_none_match=True, if_match=True)

    # -- the Store protocol -----------------------------------------------------------

    def put(
        self,
        key: str,
        body: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
        deadline: float | None = None,
    ) -> PutResult:
        """Write ``body`` atomically; create-only with ``if_none_match``, replace-only
        the version with ETag ``if_match``. Raises ConditionFailed otherwise, and
        DeadlineExceeded if ``deadline`` (monotonic) passed before the key's lock came."""
        path = self._path(key)
        if not isinstance(body, bytes | bytearray | memoryview):
            raise StorageError(f"body must be bytes, not {type(body).__name__}", key=key)
        data = bytes(body)
        etag = hashlib.md5(data).hexdigest()
        with self._translate("put", key):
            self._refuse_case_collision(key)
            tmp: Path | None = self._write_temp_making_room(data)
            try:
                with self._locked(key):
                    time_left(deadline, time.monotonic(), "put", key)
                    self._ensure_dir(path.parent, key)
                    self._refuse_case_collision(key)  # a directory made meanwhile
                    if if_match is not None and self._current_etag(path) != normalize_etag(
                        if_match
                    ):
                        raise ConditionFailed("If-Match did not hold", key=key)
                    os.utime(tmp)  # last_modified = publication, not the wait for the lock
                    if if_none_match:
                        self._link_new(tmp, path, key)
                    else:
                        self._replace(tmp, path, key)
                        tmp = None
                    self._sync_dir(path.parent)
            finally:
                if tmp is not None:
                    _unlink_quietly(tmp)
        return PutResult(key=key, etag=etag, server_time=_utcnow())

    def get(self, key: str) -> GetResult:
        """Read a whole object. Raises ObjectNotFound."""
        path = self._path(key)
        with self._translate("get", key):
            found = None if self._case_clash(key) else self._read(path)
        if found is None:
            raise ObjectNotFound("no such key", key=key)
        data, st = found
        return GetResult(
            key=key,
            body=data,
            etag=hashlib.md5(data).hexdigest(),
            last_modified=_mtime(st),
            server_time=_utcnow(),
        )

    def head(self, key: str) -> ObjectInfo:
        """Read an object's metadata (the ETag needs the whole body). Raises ObjectNotFound."""
        path = self._path(key)
        with self._translate("head", key):
            info = None if self._case_clash(key) else self._info(key, path)
        if info is None:
            raise ObjectNotFound("no such key", key=key)
        return info

    def delete(
        self, key: str, *, if_match: str | None = None, deadline: float | None = None
    ) -> None:
        """Delete; a missing key is fine without ``if_match`` and ConditionFailed with it;
        DeadlineExceeded if ``deadline`` (monotonic) passed before the key's lock came."""
        path = self._path(key)
        with self._translate("delete", key), self._locked(key):
            time_left(deadline, time.monotonic(), "delete", key)
            if self._case_clash(key):  # no such object: another key's directory
                if if_match is not None:
                    raise ConditionFailed("If-Match did not hold", key=key)
                return
            if if_match is not None and self._current_etag(path) != normalize_etag(if_match):
                raise ConditionFailed("If-Match did not hold", key=key)
            try:
                os.unlink(path)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                return  # no such object (a directory is not an object)
            self._sync_dir(path.parent)

    def delete_many(
        self, keys: Iterable[str], *, deadline: float | None = None,
        etags: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Delete each key (only while its ETag is ``etags[key]``, if given; a missing
        key is no failure); returns the keys not deleted (another version, or an
        error). Past ``deadline`` (monotonic), raises DeadlineExceeded (earlier keys
        are gone)."""
        failed: list[str] = []
        for key in keys:
            try:
                self.delete(key, deadline=deadline, if_match=(etags or {}).get(key))
            except DeadlineExceeded:
                raise
            except ConditionFailed:
                with contextlib.suppress(ObjectNotFound):
                    self.head(key)
                    failed.append(key)  # another version
            except StorageError as exc:
                log.warning("delete_many: could not delete %r: %s", key, exc)
                failed.append(key)
        return failed

    def copy(self, src: str, dst: str, *, if_none_match: bool = False) -> PutResult:
        """Copy ``src`` to ``dst`` (create-only with ``if_none_match``). Raises
        ObjectNotFound for a missing source."""
        self._path(dst)
        body = self.get(src).body
        return self.put(dst, body, if_none_match=if_none_match)

    def list(
        self,
        prefix: str,
        *,
        limit: int | None = None,
        delimiter: str | None = None,
        start_after: str | None = None,
    ) -> Listing:
        """Keys under ``prefix`` in ascending byte order; walks only the directory the
        prefix names, and with delimiter ``"/"`` does not descend below it."""
        if not isinstance(prefix, str):
            raise StorageError(f"prefix must be a string, not {type(prefix).__name__}")
        if _has_control_chars(prefix):
            raise StorageError("prefix must not contain control characters", key=prefix)
        with self._translate("list", prefix):
            keys = self._iter_keys(prefix, collapse_dirs=delimiter == "/")
            return build_listing(
                keys,
                lambda k: self._info(k, self._root / k),
                prefix,
                limit,
                delimiter,
                _utcnow(),
                start_after,
            )

    def server_time(self) -> datetime:
        """This machine's time: the store shares it."""
        return _utcnow()

    def close(self) -> None:
        """Nothing to release: files are opened per call."""

    def describe(self) -> str:
        """``local:/abs/path``."""
        return f"local:{self._root}"

    def __repr__(self) -> str:
        return f"LocalStore({str(self._root)!r}, fsync={self._fsync})"

    # -- paths, locks, errors ---------------------------------------------------------

    def _path(self, key: str) -> Path:
        """The file of a validated key."""
        return self._root / validate_key(key)

    @contextlib.contextmanager
    def _translate(self, op: str, key: str) -> Iterator[None]:
        """Turn any OSError into a StorageError naming the operation and key
        (:class:`StoreFull` when the disk is full)."""
        try:
            yield
        except OSError as exc:
            raise _translated(op, exc, key) from exc

    def _lock_file(self, stripe: int) -> Path:
        """The lock file of a stripe."""
        return self._locks / f"{stripe:02d}.lock"

    def _create_lock_files(self) -> None:
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
                log.debug("lock files of %s left for later: %s", self._root,
                          _describe_oserror(exc))
                return

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        """Hold the exclusive flock of the key's stripe (threads and processes). The
        descriptor is registered while open, so a forked child closes its copy (see
        _after_fork_in_child) instead of keeping the lock."""
        assert fcntl is not None  # checked in __init__
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

    def _case_clash(self, key: str) -> str | None:
        """On a case-insensitive file system: the first directory of ``key`` that is on
        disk in another letter case, as it is spelled there (so the key's object cannot
        exist); None when there is none, and always on a case-sensitive one."""
        return self._dir_case_clash(key.split("/")[:-1])

    def _dir_case_clash(self, dirs: Sequence[str]) -> str | None:
        """:meth:`_case_clash` for the directory path ``dirs`` (components)."""
        if not self._case_insensitive:
            return None
        rel = ""
        for part in dirs:
            parent, rel = rel, f"{rel}/{part}" if rel else part
            if rel in self._spelled_dirs:
                continue
            on_disk = _entry_like(self._root / parent if parent else self._root, part)
            if on_disk is None:
                return None  # not there, nor anything below it
            if _nfc(on_disk) != _nfc(part):
                return f"{parent}/{on_disk}" if parent else on_disk
            self._spelled_dirs.add(rel)  # directories are never renamed or removed
        return None

    def _refuse_case_collision(self, key: str) -> None:
        """Raise :class:`CaseCollision` if ``key``'s directories are on disk in another
        letter case: written, it would land among another key's objects."""
        clash = self._case_clash(key)
        if clash is not None:
            raise CaseCollision(
                f"this file system is case-insensitive and {clash!r} exists: keys whose "
                "directories differ only in case would share it (topics 'Orders' and "
                "'orders' cannot both exist in a local store on it)",
                key=key,
            )

    # -- reading ----------------------------------------------------------------------

    def _read(self, path: Path) -> tuple[bytes, os.stat_result] | None:
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

    def _current_etag(self, path: Path) -> str | None:
        """The ETag of the object at ``path``, None if there is none."""
        found = self._read(path)
        return None if found is None else hashlib.md5(found[0]).hexdigest()

    def _info(self, key: str, path: Path) -> ObjectInfo | None:
        """Metadata of the object at ``path``, None if there is none."""
        found = self._read(path)
        if found is None:
            return None
        data, st = found
        return ObjectInfo(
            key=key,
            etag=hashlib.md5(data).hexdigest(),
            size=len(data),
            last_modified=_mtime(st),
        )

    # -- writing ----------------------------------------------------------------------

    def _write_temp_making_room(self, data: bytes) -> Path:
        """:meth:`_write_temp`; if the disk is full, remove the temp files of dead
        writers (often what filled it) and, if there were any, try once more."""
        try:
            return self._write_temp(data)
        except OSError as exc:
            if not _is_full(exc) or not self._remove_stale_temps():
                raise
            log.warning("%s: disk full; removed temp files of dead writers, retrying",
                        self.describe())
        return self._write_temp(data)

    def _write_temp(self, data: bytes) -> Path:
        """Write ``data`` to a new private temp file (fsynced) and return its path."""
        tmp = self._tmp / _temp_name()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if self._fsync:
                _flush(fd)
        except BaseException:
            os.close(fd)
            _unlink_quietly(tmp)
            raise
        os.close(fd)
        return tmp

    def _link_new(self, tmp: Path, path: Path, key: str) -> None:
        """Publish ``tmp`` at ``path`` only if nothing is there (atomic)."""
        try:
            os.link(tmp, path)
        except FileExistsError:
            if path.is_dir():
                raise StorageError(
                    "key is a prefix of other keys; a local store cannot hold both", key=key
                ) from None
            raise ConditionFailed("If-None-Match: the key exists", key=key) from None

    def _replace(self, tmp: Path, path: Path, key: str) -> None:
        """Publish ``tmp`` at ``path``, replacing whatever object is there (atomic)."""
        try:
            os.replace(tmp, path)
        except IsADirectoryError:
            raise StorageError(
                "key is a prefix of other keys; a local store cannot hold both", key=key
            ) from None

    def _ensure_dir(self, directory: Path, key: str) -> None:
        """Create ``directory`` and missing parents, fsyncing each new entry's parent."""
        if directory.is_dir():
            return
        if directory == self._root:
            raise StorageError("store root has disappeared", key=key)
        self._ensure_dir(directory.parent, key)
        try:
            directory.mkdir(exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise StorageError(
                "a prefix of the key is itself a key; a local store cannot hold both", key=key
            ) from None
        self._sync_dir(directory.parent)

    def _sync_dir(self, directory: Path) -> None:
        """fsync a directory so a rename, link or unlink in it is durable."""
        if not self._fsync:
            return
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _flush(fd)
        finally:
            os.close(fd)

    def _remove_stale_temps(self) -> int:
        """Delete the temp files of writers that cannot finish (see
        :func:`_temp_is_dead`); returns how many were removed."""
        now = time.time()
        removed = 0
        try:
            with os.scandir(self._tmp) as entries:
                for entry in entries:
                    with contextlib.suppress(OSError):
                        mtime = entry.stat(follow_symlinks=False).st_mtime
                        if _temp_is_dead(entry.name, mtime, now):
                            os.unlink(entry.path)
                            removed += 1
        except OSError as exc:
            log.warning("could not clean %s: %s", self._tmp, _describe_oserror(exc))
        return removed

    # -- listing ----------------------------------------------------------------------

    def _iter_keys(self, prefix: str, *, collapse_dirs: bool) -> Iterator[str]:
        """Keys starting with ``prefix`` in ascending order, walking only the directory
        the prefix names. With ``collapse_dirs``, each directory directly in it yields
        only its first key (enough for a ``"/"`` delimiter to fold it)."""
        dir_part, _, name_prefix = prefix.rpartition("/")
        parts = dir_part.split("/") if dir_part else []
        if any(p in ("", ".", "..") for p in parts) or (
            parts and parts[0].casefold() == PRIVATE_DIR
        ):
            return  # no valid key lives there
        if self._dir_case_clash(parts) is not None:
            return  # another key's directory, in another letter case
        base = self._root.joinpath(*parts)
        key_base = dir_part + "/" if dir_part else ""
        for name, is_dir in self._sorted_entries(base, at_root=not parts):
            if not name.startswith(name_prefix):
                continue
            key = key_base + name
            if not is_dir:
                yield key
            elif collapse_dirs:
                first = next(self._walk(base / name, key + "/"), None)
                if first is not None:
                    yield first
            else:
                yield from self._walk(base / name, key + "/")

    def _walk(self, directory: Path, key_base: str) -> Iterator[str]:
        """Every key under ``directory`` in ascending byte order (depth first)."""
        for name, is_dir in self._sorted_entries(directory, at_root=False):
            if is_dir:
                yield from self._walk(directory / name, key_base + name + "/")
            else:
                yield key_base + name

    def _sorted_entries(self, directory: Path, *, at_root: bool) -> list[tuple[str, bool]]:
        """Regular files and directories in ``directory`` ordered so that a depth-first
        walk yields keys in byte order: a directory sorts as ``name + "/"``."""
        found: list[tuple[str, bool]] = []
        unusable = _UNUSABLE_NAME_RE.search  # this loop runs for every entry
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    name = entry.name
                    if unusable(name) is not None:
                        continue  # written by another tool; cannot be a key
                    if entry.is_dir(follow_symlinks=False):
                        is_dir = True
                    elif entry.is_file(follow_symlinks=False):
                        is_dir = False
                    else:
                        continue  # a symlink, socket, ...: not an object
                    if name[0] in _LITTER_INITIALS and (
                        is_os_litter(name, is_dir=is_dir)
                        or (at_root and name.casefold() == PRIVATE_DIR)
                    ):
                        continue
                    found.append((name, is_dir))
        except (FileNotFoundError, NotADirectoryError):
            return []
        found.sort(key=lambda e: e[0] + "/" if e[1] else e[0])
        return found


def _unlink_quietly(path: Path) -> None:
    """Remove a temp file; it may already be gone."""
    with contextlib.suppress(OSError):
        os.unlink(path)


def _has_control_chars(text: str) -> bool:
    """Whether ``text`` has a control character (NUL included), which no key has."""
    return _CONTROL_RE.search(text) is not None
