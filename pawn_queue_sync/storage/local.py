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
import hashlib
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from types import ModuleType

import attrs

from ..errors import PlatformNotSupported
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
from .listing import build_listing
from .local_files import (
    LOCK_STRIPES,
    StripedLocks,
    _is_full,
    _mtime,
    _translated,
    _unlink_quietly,
    _utcnow,
    ensure_dir,
    link_new,
    read_file,
    remove_dead_temps,
    replace_with,
    sync_dir,
    write_temp,
)
from .local_names import (
    PRIVATE_DIR,
    CaseGuard,
    _has_control_chars,
    is_os_litter,
    sorted_entries,
    validate_key,
    walk_keys,
)

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # Windows: LocalStore() says so; importing still works
    fcntl = None

__all__ = [
    "LOCK_STRIPES",
    "PRIVATE_DIR",
    "KnownConditions",
    "LocalStore",
    "is_os_litter",
    "validate_key",
]

log = logging.getLogger(__name__)


@attrs.frozen
class KnownConditions:
    """The conditional requests a store enforces, known without probing it."""

    if_none_match: bool
    if_match: bool


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
        self._stripes = StripedLocks(self._private / "locks")
        try:
            self._root.mkdir(parents=True, exist_ok=True)
            self._tmp.mkdir(parents=True, exist_ok=True)
            self._stripes.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            where = f"creating the store directory {str(self._root)!r}"
            raise _translated(where, exc, None) from exc
        self._stripes.create_files()
        self._case = CaseGuard(self._root)
        remove_dead_temps(self._tmp)

    @property
    def case_insensitive(self) -> bool:
        """Whether the file system ignores case in names under the root (found at
        construction: ``.pawnq`` is also ``.PAWNQ``)."""
        return self._case.insensitive

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
        retry_by: float | None = None,
    ) -> PutResult:
        """Write ``body`` atomically; create-only with ``if_none_match``, replace-only
        the version with ETag ``if_match``. Raises ConditionFailed otherwise, and
        DeadlineExceeded if ``deadline`` (monotonic) passed before the key's lock came.
        One attempt: no retry for ``retry_by`` to bound."""
        path = self._path(key)
        if not isinstance(body, bytes | bytearray | memoryview):
            raise StorageError(f"body must be bytes, not {type(body).__name__}", key=key)
        data = bytes(body)
        etag = hashlib.md5(data).hexdigest()
        with self._translate("put", key):
            self._case.refuse_collision(key)
            tmp: Path | None = self._write_temp_making_room(data)
            try:
                with self._locked(key):
                    time_left(deadline, time.monotonic(), "put", key)
                    ensure_dir(self._root, path.parent, key, fsync=self._fsync)
                    self._case.refuse_collision(key)  # a directory made meanwhile
                    if if_match is not None and self._current_etag(path) != normalize_etag(
                        if_match
                    ):
                        raise ConditionFailed("If-Match did not hold", key=key)
                    os.utime(tmp)  # last_modified = publication, not the wait for the lock
                    if if_none_match:
                        link_new(tmp, path, key)
                    else:
                        replace_with(tmp, path, key)
                        tmp = None
                    sync_dir(path.parent, fsync=self._fsync)
            finally:
                if tmp is not None:
                    _unlink_quietly(tmp)
        return PutResult(key=key, etag=etag, server_time=_utcnow())

    def get(self, key: str) -> GetResult:
        """Read a whole object. Raises ObjectNotFound."""
        path = self._path(key)
        with self._translate("get", key):
            found = None if self._case.clash(key) else read_file(path)
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
            info = None if self._case.clash(key) else self._info(key, path)
        if info is None:
            raise ObjectNotFound("no such key", key=key)
        return info

    def delete(
        self, key: str, *, if_match: str | None = None, deadline: float | None = None,
        retry_by: float | None = None,
    ) -> None:
        """Delete; a missing key is fine without ``if_match`` and ConditionFailed with it;
        DeadlineExceeded if ``deadline`` (monotonic) passed before the key's lock came;
        ``retry_by`` as for :meth:`put`."""
        path = self._path(key)
        with self._translate("delete", key), self._locked(key):
            time_left(deadline, time.monotonic(), "delete", key)
            if self._case.clash(key):  # no such object: another key's directory
                if if_match is not None:
                    raise ConditionFailed("If-Match did not hold", key=key)
                return
            if if_match is not None and self._current_etag(path) != normalize_etag(if_match):
                raise ConditionFailed("If-Match did not hold", key=key)
            try:
                os.unlink(path)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                return  # no such object (a directory is not an object)
            sync_dir(path.parent, fsync=self._fsync)

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

    def _locked(self, key: str) -> contextlib.AbstractContextManager[None]:
        """Hold the exclusive flock of the key's stripe (see :class:`StripedLocks`)."""
        assert fcntl is not None  # checked in __init__
        return self._stripes.locked(key)

    # -- reading ----------------------------------------------------------------------

    def _current_etag(self, path: Path) -> str | None:
        """The ETag of the object at ``path``, None if there is none."""
        found = read_file(path)
        return None if found is None else hashlib.md5(found[0]).hexdigest()

    def _info(self, key: str, path: Path) -> ObjectInfo | None:
        """Metadata of the object at ``path``, None if there is none."""
        found = read_file(path)
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
        """:func:`write_temp`; if the disk is full, remove the temp files of dead
        writers (often what filled it) and, if there were any, try once more."""
        try:
            return write_temp(self._tmp, data, fsync=self._fsync)
        except OSError as exc:
            if not _is_full(exc) or not remove_dead_temps(self._tmp):
                raise
            log.warning("%s: disk full; removed temp files of dead writers, retrying",
                        self.describe())
        return write_temp(self._tmp, data, fsync=self._fsync)

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
        if self._case.dir_clash(parts) is not None:
            return  # another key's directory, in another letter case
        base = self._root.joinpath(*parts)
        key_base = dir_part + "/" if dir_part else ""
        for name, is_dir in sorted_entries(base, at_root=not parts):
            if not name.startswith(name_prefix):
                continue
            key = key_base + name
            if not is_dir:
                yield key
            elif collapse_dirs:
                first = next(walk_keys(base / name, key + "/"), None)
                if first is not None:
                    yield first
            else:
                yield from walk_keys(base / name, key + "/")
