"""A full disk, simulated for the local store's tests, and files placed behind the
store's back as a sync tool would."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def enospc(path: object = None) -> OSError:
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
            return enospc(path)

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


def place(root: Path, key: str, body: bytes) -> None:
    """Put a file where the store keeps ``key``, as a sync tool would (not through the
    store: no lock file of its stripe is created)."""
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
