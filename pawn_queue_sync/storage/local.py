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
* nothing is cached and no file stays open between calls, so an instance keeps working
  in a forked child.

Differences from S3 that follow from using a file system: a key cannot also be a
"directory" of other keys (``"a"`` and ``"a/b"`` cannot both exist; the second write
raises :class:`StorageError`), and key components are limited to the file system's
name length (usually 255 bytes). Directories are never removed, so listings skip them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import stat
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path

from .base import (
    ConditionFailed,
    GetResult,
    Listing,
    ObjectInfo,
    ObjectNotFound,
    PutResult,
    StorageError,
    normalize_etag,
)

__all__ = ["LOCK_STRIPES", "PRIVATE_DIR", "LocalStore", "build_listing", "validate_key"]

log = logging.getLogger(__name__)

#: Name of the store's private directory under the root; never listed, never a key.
PRIVATE_DIR = ".pawnq"

#: Number of lock files writes are striped over (by a hash of the key).
LOCK_STRIPES = 64

#: S3's limit on the UTF-8 length of a key.
MAX_KEY_BYTES = 1024

#: Temp files older than this are left over from a crashed writer and removed at startup.
STALE_TEMP_SECONDS = 3600.0

_CHUNK = 1 << 20


def validate_key(key: object) -> str:
    """Return ``key`` if it is safe as a relative file path, else raise StorageError.

    Rejected: non-strings, empty keys, a leading ``/``, empty, ``.`` or ``..``
    components, control characters (NUL included), text that is not valid UTF-8, keys
    longer than :data:`MAX_KEY_BYTES`, and keys inside the private ``.pawnq`` directory.
    """
    if not isinstance(key, str):
        raise StorageError(f"key must be a string, not {type(key).__name__}")
    if not key:
        raise StorageError("key must not be empty", key=key)
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in key):
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
    if parts[0] == PRIVATE_DIR:
        raise StorageError(f"keys under {PRIVATE_DIR!r} are reserved", key=key)
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


class LocalStore:
    """An object store in a directory; see the module docstring for the guarantees."""

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
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
            raise StorageError(
                f"cannot create store directory {str(self._root)!r}: {_describe_oserror(exc)}"
            ) from exc
        self._remove_stale_temps()

    # -- the Store protocol -----------------------------------------------------------

    def put(
        self,
        key: str,
        body: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> PutResult:
        """Write ``body`` atomically; create-only with ``if_none_match``, replace-only
        the version with ETag ``if_match``. Raises ConditionFailed otherwise."""
        path = self._path(key)
        if not isinstance(body, bytes | bytearray | memoryview):
            raise StorageError(f"body must be bytes, not {type(body).__name__}", key=key)
        data = bytes(body)
        etag = hashlib.md5(data).hexdigest()
        with self._translate("put", key):
            tmp: Path | None = self._write_temp(data)
            try:
                with self._locked(key):
                    self._ensure_dir(path.parent, key)
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
            found = self._read(path)
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
            info = self._info(key, path)
        if info is None:
            raise ObjectNotFound("no such key", key=key)
        return info

    def delete(self, key: str, *, if_match: str | None = None) -> None:
        """Delete; a missing key is fine without ``if_match`` and ConditionFailed with it."""
        path = self._path(key)
        with self._translate("delete", key), self._locked(key):
            if if_match is not None and self._current_etag(path) != normalize_etag(if_match):
                raise ConditionFailed("If-Match did not hold", key=key)
            try:
                os.unlink(path)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                return  # no such object (a directory is not an object)
            self._sync_dir(path.parent)

    def delete_many(self, keys: Iterable[str]) -> list[str]:
        """Delete each key unconditionally; returns the keys that could not be deleted."""
        failed: list[str] = []
        for key in keys:
            try:
                self.delete(key)
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
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in prefix):
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
        """Turn any OSError into a StorageError naming the operation and key."""
        try:
            yield
        except OSError as exc:
            raise StorageError(f"{op} failed: {_describe_oserror(exc)}", key=key) from exc

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        """Hold the exclusive flock of the key's stripe (threads and processes)."""
        stripe = int.from_bytes(hashlib.md5(key.encode("utf-8")).digest()[:4], "big")
        path = self._locks / f"{stripe % LOCK_STRIPES:02d}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock

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

    def _write_temp(self, data: bytes) -> Path:
        """Write ``data`` to a new private temp file (fsynced) and return its path."""
        tmp = self._tmp / f"{uuid.uuid4().hex}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if self._fsync:
                os.fsync(fd)
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
            os.fsync(fd)
        finally:
            os.close(fd)

    def _remove_stale_temps(self) -> None:
        """Delete temp files a crashed writer left behind (old enough to be dead)."""
        cutoff = time.time() - STALE_TEMP_SECONDS
        try:
            with os.scandir(self._tmp) as entries:
                for entry in entries:
                    with contextlib.suppress(OSError):
                        if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                            os.unlink(entry.path)
        except OSError as exc:
            log.warning("could not clean %s: %s", self._tmp, _describe_oserror(exc))

    # -- listing ----------------------------------------------------------------------

    def _iter_keys(self, prefix: str, *, collapse_dirs: bool) -> Iterator[str]:
        """Keys starting with ``prefix`` in ascending order, walking only the directory
        the prefix names. With ``collapse_dirs``, each directory directly in it yields
        only its first key (enough for a ``"/"`` delimiter to fold it)."""
        dir_part, _, name_prefix = prefix.rpartition("/")
        parts = dir_part.split("/") if dir_part else []
        if any(p in ("", ".", "..") for p in parts) or (parts and parts[0] == PRIVATE_DIR):
            return  # no valid key lives there
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
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if at_root and entry.name == PRIVATE_DIR:
                        continue
                    if not _is_utf8(entry.name):
                        continue  # written by another tool; cannot be a key
                    if entry.is_dir(follow_symlinks=False):
                        found.append((entry.name, True))
                    elif entry.is_file(follow_symlinks=False):
                        found.append((entry.name, False))
        except (FileNotFoundError, NotADirectoryError):
            return []
        found.sort(key=lambda e: e[0] + "/" if e[1] else e[0])
        return found


def _unlink_quietly(path: Path) -> None:
    """Remove a temp file; it may already be gone."""
    with contextlib.suppress(OSError):
        os.unlink(path)


def _is_utf8(name: str) -> bool:
    """Whether a file name decoded from disk is valid UTF-8 (no surrogate escapes)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
