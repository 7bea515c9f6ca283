"""`LocalDirectoryHandle`: a live workspace, and what its captures remember."""

from __future__ import annotations

from typing import NamedTuple

from .files import LocalFiles

__all__ = ["LocalDirectoryHandle", "Known", "DirKey"]

DirKey = tuple[int, int, int, int]  # (mtime_ns, ctime_ns, inode, device) of a fan-out directory


class Known(NamedTuple):
    """A file hashed by an earlier capture of a handle."""
    key: tuple[int, int, int, int, int, int]  # (st_mode, size, mtime_ns, ctime_ns, inode, device) then
    path: bytes  # the path as UTF-8: the manifest's sort key
    entry: bytes  # the file's manifest entry, serialised
    fan: str  # its object's fan-out directory (the digest's first two hex digits)
    obj: str  # its object's path


class LocalDirectoryHandle:
    """A live workspace: `path` is the directory, `files` the file API."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.files = LocalFiles(path)
        # path → what an earlier capture of this handle learnt of the file;
        # only files whose times were outside the racy window then.
        self._hashes: dict[str, Known] = {}
        # fan-out directory → its stat when every object of _hashes in it was
        # last seen to exist (see ObjectChecks).
        self._fans: dict[str, DirKey] = {}

    def __repr__(self) -> str:
        return f"LocalDirectoryHandle({self.path!r})"
