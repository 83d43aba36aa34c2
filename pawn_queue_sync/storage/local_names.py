"""Keys and file names of the local store (:mod:`.local`): which keys are valid, which
names operating systems leave behind, how names compare on case-insensitive file
systems, and the walk that yields a directory tree's keys in S3's (byte) order."""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..errors import CaseCollision
from .base import StorageError

__all__ = [
    "MAX_KEY_BYTES",
    "OS_LITTER_DIRS",
    "OS_LITTER_FILES",
    "PRIVATE_DIR",
    "CaseGuard",
    "is_os_litter",
    "sorted_entries",
    "validate_key",
    "walk_keys",
]

#: Name of the store's private directory under the root; never listed, never a key.
PRIVATE_DIR = ".pawnq"

#: S3's limit on the UTF-8 length of a key.
MAX_KEY_BYTES = 1024

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


def _has_control_chars(text: str) -> bool:
    """Whether ``text`` has a control character (NUL included), which no key has."""
    return _CONTROL_RE.search(text) is not None


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



class CaseGuard:
    """Keys against a file system that may ignore case under ``root`` (found once:
    ``.pawnq`` is also ``.PAWNQ``): a key whose directories are on disk in another
    letter case is another key's, so it is refused when written and absent when read."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self.insensitive = _is_case_insensitive(root)
        #: Directories (relative paths) seen on disk spelled exactly as keys spell them.
        self._spelled_dirs: set[str] = set()

    def clash(self, key: str) -> str | None:
        """On a case-insensitive file system: the first directory of ``key`` that is on
        disk in another letter case, as it is spelled there (so the key's object cannot
        exist); None when there is none, and always on a case-sensitive one."""
        return self.dir_clash(key.split("/")[:-1])

    def dir_clash(self, dirs: Sequence[str]) -> str | None:
        """:meth:`clash` for the directory path ``dirs`` (components)."""
        if not self.insensitive:
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

    def refuse_collision(self, key: str) -> None:
        """Raise :class:`CaseCollision` if ``key``'s directories are on disk in another
        letter case: written, it would land among another key's objects."""
        clash = self.clash(key)
        if clash is not None:
            raise CaseCollision(
                f"this file system is case-insensitive and {clash!r} exists: keys whose "
                "directories differ only in case would share it (topics 'Orders' and "
                "'orders' cannot both exist in a local store on it)",
                key=key,
            )


# -- walking a directory tree --------------------------------------------------------


def walk_keys(directory: Path, key_base: str) -> Iterator[str]:
    """Every key under ``directory`` in ascending byte order (depth first)."""
    for name, is_dir in sorted_entries(directory, at_root=False):
        if is_dir:
            yield from walk_keys(directory / name, key_base + name + "/")
        else:
            yield key_base + name

def sorted_entries(directory: Path, *, at_root: bool) -> list[tuple[str, bool]]:
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


