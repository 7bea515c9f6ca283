"""`LocalDirectory`: a resource driver whose resource is a directory on the
local disk, with content-addressed snapshots as checkpoints
(RESOURCES-AND-FORKS.md §6).

    workspace = await resource("workspace", driver=LocalDirectory())
    await workspace.files.write("notes.txt", "hello")

Layout under `root`:

| path                              | holds                                  |
|-----------------------------------|----------------------------------------|
| `workspaces/<uuid>/`              | live directories, one per `create`     |
| `store/objects/<2 hex>/<62 hex>`  | file contents by SHA-256, read-only    |
| `store/snapshots/<64 hex>.json`   | manifests                              |
| `tmp/`                            | staging: written, synced, renamed      |

A checkpoint ref is `sha256:<hex of the manifest bytes>`, so an unchanged
tree yields the same ref, and identical files are stored once. Restores copy
(never link) every object, verifying its hash, so writes in a restored
workspace can never change a checkpoint. A malformed ref, a missing or
damaged manifest or object, or a manifest entry that would escape the
workspace raises `CheckpointUnavailable`.

Everything a call writes is made durable together (see `_Syncer`) before
anything refers to it: a capture's new objects and manifest before they are
renamed into the store, the renames before the ref is returned; a new
workspace before it is renamed into `workspaces/`, the rename before
`create` returns. A capture re-reads only files whose size, times, inode or
mode changed since the handle's last capture (see `_RACY_NS`), and reuses
their manifest entries as serialised then.
"""

from __future__ import annotations

import array
import asyncio
import concurrent.futures
import ctypes
import errno
import functools
import hashlib
import json
import os
import platform
import re
import shutil
import stat
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from ..errors import CheckpointUnavailable

__all__ = ["LocalDirectory", "LocalDirectoryHandle", "LocalFiles", "FORMAT", "manifest_bytes"]

FORMAT = "rebuno.local_directory.v1"
DRIVER_ID = "rebuno.local_directory.v1"
ENV_ROOT = "REBUNO_LOCAL_RESOURCES"
DEFAULT_ROOT = os.path.join(".rebuno", "resources")

_REF = re.compile(r"sha256:([0-9a-f]{64})")
_HEX = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20
# A file whose times fall this close to a capture's start is always hashed
# again by the next capture (the "racy" case: a change within the clock's
# granularity could leave size and times unchanged).
_RACY_NS = 100_000_000
# Up to this many files and directories are made durable one fsync each;
# beyond it, by one syncfs (see _Syncer). A capture of a few changed files
# then never waits for other processes' dirty data, and a restore of a
# thousand files pays for one flush of the disk's cache, not a thousand.
_FSYNC_MAX = 8
# Restores of fewer files copy them on one thread (see _copy_objects).
_PARALLEL_MIN = 64
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# FS_IOC_GETFLAGS and FS_IOC_SETFLAGS (_IOR/_IOW('f', 1/2, long)) on the
# machines whose ioctl numbers use the generic encoding with 8-byte longs,
# and FS_TOPDIR_FL, chattr's "T" (see _spread_subdirectories).
_FS_IOC_FLAGS = {m: (0x80086601, 0x40086602) for m in ("x86_64", "aarch64", "arm64", "riscv64")}
_FS_TOPDIR_FL = 0x00020000
# The manifest around its entries: manifest_bytes with the entries spliced
# in, so that entries serialised by earlier captures can be reused.
_MANIFEST_HEAD = b'{"entries":['
_MANIFEST_TAIL = b'],"format":' + json.dumps(FORMAT).encode("utf-8") + b"}"

_ENTRY_KEYS = {
    "dir": {"mode", "path", "type"},
    "file": {"mode", "path", "sha256", "size", "type"},
    "symlink": {"path", "target", "type"},
}


class _Damaged(Exception):
    """A snapshot that cannot be restored exactly (turned into CheckpointUnavailable)."""


def manifest_bytes(entries: list[dict[str, Any]]) -> bytes:
    """The manifest of a tree: keys sorted, no whitespace, non-ASCII raw,
    entries sorted by the UTF-8 bytes of their paths."""
    ordered = sorted(entries, key=lambda e: str(e["path"]).encode("utf-8"))
    doc = {"entries": ordered, "format": FORMAT}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _entry_bytes(entry: dict[str, Any]) -> bytes:
    """One entry exactly as manifest_bytes writes it inside the list."""
    return json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _assemble(parts: list[tuple[bytes, bytes]]) -> bytes:
    """The manifest of (UTF-8 path, serialised entry) pairs: the same bytes as
    manifest_bytes of the entries (a test holds the two together)."""
    parts.sort()
    return _MANIFEST_HEAD + b",".join([entry for _path, entry in parts]) + _MANIFEST_TAIL


def _utf8_name(name: str, where: str) -> None:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{where}: file name is not valid UTF-8: {name!r}") from None


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _read_upto(fd: int, limit: int) -> bytes:
    """Up to `limit` bytes, fewer only at the end of the file."""
    data = os.read(fd, limit)
    if 0 < len(data) < limit:  # a short read need not be the end: go on until it is
        chunks = [data]
        got = len(data)
        while got < limit and (chunk := os.read(fd, limit - got)):
            chunks.append(chunk)
            got += len(chunk)
        data = b"".join(chunks)
    return data


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


_syncfs_refused = False


def _syncfs() -> Callable[[int], int] | None:
    return None if _syncfs_refused else _load_syncfs()


@functools.cache
def _load_syncfs() -> Callable[[int], int] | None:
    """Linux's syncfs(2), when it reports writeback errors (Linux 5.8 and
    later; earlier kernels returned success regardless); else None."""
    if not sys.platform.startswith("linux"):
        return None
    m = re.match(r"(\d+)\.(\d+)", os.uname().release)
    if m is None or (int(m.group(1)), int(m.group(2))) < (5, 8):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


class _Syncer:
    """Makes a batch of new files and directories durable.

    An fsync costs a flush of the disk's write cache: 0.3 s for the 1,000
    files of a restore on this project's test machine, still 0.3 s when the
    fsyncs follow all the writes, and 0.1 s from 16 threads. So beyond
    _FSYNC_MAX paths, one syncfs of the filesystem the batch lives on writes
    back everything dirty there and flushes once: 10 to 15 ms for those
    1,000 files. The price is that it also writes back other processes'
    dirty data on that filesystem, which is why small batches are fsynced.

    The descriptor syncfs is given is opened before the batch writes
    anything, because syncfs reports the writeback errors seen since its
    descriptor was opened. syncfs is followed by an fsync of that
    descriptor: on filesystems that keep metadata in the block device's page
    cache (ext2, ext4 without a journal, as on the test machine) syncfs
    writes those blocks after it has flushed the disk's cache, and the fsync's
    flush is what makes them durable. Without syncfs, every path is fsynced.
    """

    def __init__(self, anchor: str) -> None:
        self._fd = -1
        if _syncfs() is not None:
            self._fd = os.open(anchor, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)

    def sync(self, files: Sequence[str], dirs: Iterable[str]) -> None:
        dirs = list(dirs)
        fn = _syncfs()
        if fn is not None and self._fd >= 0 and len(files) + len(dirs) > _FSYNC_MAX:
            if fn(self._fd) == 0:
                os.fsync(self._fd)
                return
            err = ctypes.get_errno()
            if err not in (errno.ENOSYS, errno.EPERM):  # EPERM: a seccomp filter refused the call
                raise OSError(err, f"syncfs: {os.strerror(err)}")
            global _syncfs_refused
            _syncfs_refused = True
        for path in files:
            _fsync_file(path)
        for path in dirs:
            _fsync_dir(path)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _spread_subdirectories(path: str) -> None:
    """Mark a directory whose subdirectories are unrelated trees (chattr +T).

    ext2/3/4 then place each new subdirectory, and so the files created in
    it, in a lightly used block group instead of next to its parent. It
    matters most on ext4 without a journal (this project's test machine): to
    help recovery after a crash, its inode allocator passes over every inode
    of the group freed in the last minute (six while the inode's table block
    is not yet written back), one by one, for each new file. In a group
    where files were recently deleted, by anyone, creating a 1,000-file
    restore took 0.2 to 1.3 s; in a group of its own, 30 to 45 ms. A
    filesystem without the flag refuses it, and nothing else changes.
    """
    numbers = _FS_IOC_FLAGS.get(platform.machine()) if sys.platform.startswith("linux") else None
    if numbers is None:
        return
    import fcntl

    get_flags, set_flags = numbers
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
    except OSError:
        return
    try:
        flags = array.array("i", [0])  # the kernel reads and writes an int
        fcntl.ioctl(fd, get_flags, flags, True)
        if not flags[0] & _FS_TOPDIR_FL:
            flags[0] |= _FS_TOPDIR_FL
            fcntl.ioctl(fd, set_flags, flags)
    except OSError:
        pass
    finally:
        os.close(fd)


def _force_rmtree(path: str) -> None:
    """Remove a staging tree even when a restored mode made a directory read-only."""
    def retry(func: Any, p: str, _exc: Any) -> None:
        try:
            os.chmod(os.path.dirname(p), 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry)


class LocalFiles:
    """The part of E2B's `files` API the Resources docs use, on a local
    directory. Paths resolve inside the workspace (a leading `/` is its root);
    a `..` or a symlink that escapes it raises `PermissionError`. Text is
    UTF-8; a missing file raises `FileNotFoundError`."""

    def __init__(self, root: str) -> None:
        self._root = root

    def _resolve(self, path: str) -> str:
        if not isinstance(path, str):
            raise TypeError(f"path must be a string, not {type(path).__name__}")
        if "\x00" in path:
            raise ValueError("path contains NUL")
        real_root = os.path.realpath(self._root)
        real = os.path.realpath(os.path.join(real_root, path.lstrip("/")))
        if real != real_root and not real.startswith(real_root + os.sep):
            raise PermissionError(errno.EACCES, "path escapes the workspace", path)
        return real

    def _inner(self, path: str) -> str:
        """Resolve a path that must name something below the root."""
        real = self._resolve(path)
        if real == os.path.realpath(self._root):
            raise PermissionError(errno.EACCES, "the workspace root itself cannot be written or removed", path)
        return real

    async def read(self, path: str, format: str = "text") -> str | bytes:
        """The file's contents: `str` with `format="text"`, `bytes` with `"bytes"`."""
        if format not in ("text", "bytes"):
            raise ValueError(f"format must be 'text' or 'bytes', not {format!r}")
        real = self._resolve(path)

        def read() -> bytes:
            with open(real, "rb") as f:
                return f.read()

        data = await asyncio.to_thread(read)
        return data.decode("utf-8") if format == "text" else data

    async def write(self, path: str, data: str | bytes) -> None:
        """Write a file atomically (temp file + rename), creating parents."""
        if isinstance(data, str):
            content = data.encode("utf-8")
        elif isinstance(data, (bytes, bytearray, memoryview)):
            content = bytes(data)
        else:
            raise TypeError(f"data must be str or bytes, not {type(data).__name__}")
        real = self._inner(path)

        def write() -> None:
            parent = os.path.dirname(real)
            os.makedirs(parent, exist_ok=True)
            try:
                mode = stat.S_IMODE(os.stat(real).st_mode)
            except FileNotFoundError:
                mode = 0o644
            tmp = os.path.join(parent, f".{os.path.basename(real)}.{uuid.uuid4().hex}.rebuno-tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(content)
                os.chmod(tmp, mode)
                os.replace(tmp, real)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise

        await asyncio.to_thread(write)

    async def list(self, path: str = "/") -> list[str]:
        """The names in a directory, sorted."""
        real = self._resolve(path)
        return sorted(await asyncio.to_thread(os.listdir, real))

    async def exists(self, path: str) -> bool:
        real = self._resolve(path)
        return await asyncio.to_thread(os.path.lexists, real)

    async def remove(self, path: str) -> None:
        """Remove a file, a symlink or a directory tree."""
        real = self._inner(path)

        def remove() -> None:
            if os.path.isdir(real) and not os.path.islink(real):
                shutil.rmtree(real)
            else:
                os.unlink(real)

        await asyncio.to_thread(remove)

    async def make_dir(self, path: str) -> bool:
        """Create a directory and its parents; False when it already existed."""
        real = self._inner(path)

        def make() -> bool:
            if os.path.isdir(real):
                return False
            os.makedirs(real)
            return True

        return await asyncio.to_thread(make)


_DirKey = tuple[int, int, int, int]  # (mtime_ns, ctime_ns, inode, device) of a fan-out directory


class _Known(NamedTuple):
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
        self._hashes: dict[str, _Known] = {}
        # fan-out directory → its stat when every object of _hashes in it was
        # last seen to exist (see _ObjectChecks).
        self._fans: dict[str, _DirKey] = {}

    def __repr__(self) -> str:
        return f"LocalDirectoryHandle({self.path!r})"


class _ObjectChecks:
    """Whether the objects a capture names are in the store, at about one
    stat per fan-out directory rather than one per file.

    The driver never removes an object, but damage from outside must not
    yield a ref that cannot be restored. Removing or renaming an object
    changes its directory's mtime and ctime, so while a directory's stat is
    what it was when a capture last saw all of the handle's objects in it,
    they are all still there. A stat is only trusted once its times are
    outside the racy window, for the same reason as a file's; a directory
    this capture stores objects into is looked at afresh next time. Each
    directory is looked at before any of its objects is checked.
    """

    def __init__(self, objects: str, trusted: dict[str, _DirKey], settled: int) -> None:
        self._objects = objects + "/"
        self._trusted = trusted  # the handle's record from earlier captures
        self._settled = settled
        self._seen: dict[str, _DirKey | None] = {}
        self._unchanged: set[str] = set()

    def _look(self, fan: str) -> None:
        try:
            st = os.stat(self._objects + fan)
        except OSError:
            self._seen[fan] = None
            return
        key = (st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
        self._seen[fan] = key
        if self._trusted.get(fan) == key:
            self._unchanged.add(fan)

    def still_there(self, known: _Known) -> bool:
        """Whether an object an earlier capture saw is still in the store."""
        if known.fan not in self._seen:
            self._look(known.fan)
        return known.fan in self._unchanged or _is_file(known.obj)

    def present(self, fan: str, obj: str) -> bool:
        """Whether the store has an object."""
        if fan not in self._seen:
            self._look(fan)
        return _is_file(obj)

    def record(self, stored_into: set[str]) -> dict[str, _DirKey]:
        """The record for the next capture, once this one is durable."""
        return {fan: key for fan, key in self._seen.items()
                if key is not None and fan not in stored_into and max(key[0], key[1]) < self._settled}


class _Batch:
    """New store files, published together: each is written to `tmp/`, then
    all are made durable, renamed into place, and the renames made durable.
    Until it is committed, nothing in the store refers to a file that a
    crash could lose, and `close` removes whatever was not published."""

    def __init__(self, tmp: str) -> None:
        self._tmp = tmp
        self._staged: list[tuple[str, str]] = []  # (temp file, final path)
        self._finals: set[str] = set()
        self._syncer: _Syncer | None = None
        self.renamed_into: set[str] = set()  # directories that gained a file

    def __contains__(self, final: str) -> bool:
        return final in self._finals

    def _open(self, final: str) -> int:
        if self._syncer is None:  # before the first write, so that syncfs reports its errors
            self._syncer = _Syncer(self._tmp)
        tmp = os.path.join(self._tmp, uuid.uuid4().hex)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o600)
        self._staged.append((tmp, final))
        self._finals.add(final)
        return fd

    def add(self, data: bytes, final: str) -> None:
        """Stage a read-only file holding `data`."""
        fd = self._open(final)
        try:
            _write_all(fd, data)
            os.fchmod(fd, 0o444)
        finally:
            os.close(fd)

    def add_copy(self, dir_fd: int, name: str, rel: str, digest: str, final: str) -> None:
        """Stage a read-only copy of a file, checking that what was copied
        still has the hash computed before."""
        h = hashlib.sha256()
        fd = self._open(final)
        try:
            src = os.open(name, os.O_RDONLY | _O_CLOEXEC, dir_fd=dir_fd)
            try:
                while chunk := os.read(src, _CHUNK):
                    h.update(chunk)
                    _write_all(fd, chunk)
            finally:
                os.close(src)
            os.fchmod(fd, 0o444)
        finally:
            os.close(fd)
        if h.hexdigest() != digest:
            raise ValueError(f"{rel}: the file changed while it was captured")

    def commit(self) -> None:
        if not self._staged:
            return
        assert self._syncer is not None
        self._syncer.sync([tmp for tmp, _final in self._staged], ())
        dirs: set[str] = set()
        while self._staged:
            tmp, final = self._staged[0]
            parent = os.path.dirname(final)
            try:
                os.replace(tmp, final)
            except FileNotFoundError:
                if not os.path.lexists(tmp):
                    raise
                try:
                    os.mkdir(parent)  # an object's first fan-out directory
                except FileExistsError:
                    pass
                else:
                    dirs.add(os.path.dirname(parent))  # whose entry must last too
                os.replace(tmp, final)
            dirs.add(parent)
            self.renamed_into.add(parent)
            self._staged.pop(0)
        self._syncer.sync((), sorted(dirs))

    def close(self) -> None:
        for tmp, _final in self._staged:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        self._staged = []
        if self._syncer is not None:
            self._syncer.close()


class LocalDirectory:
    """A resource driver for a local directory (`driver_id`
    `"rebuno.local_directory.v1"`).

    `root` defaults to `$REBUNO_LOCAL_RESOURCES`, else `./.rebuno/resources`;
    `template` is a directory copied as the initial environment (otherwise
    empty). `coverage_reuse=True` keeps coverage across steps that do not
    declare the resource; use it when every change goes through declared
    tools and steps. The store is never garbage-collected.
    """

    driver_id = DRIVER_ID
    _spread = False  # whether _layout has marked tmp/ (a hint: once per instance is enough)

    def __init__(self, root: str | os.PathLike[str] | None = None, *,
                 template: str | os.PathLike[str] | None = None, coverage_reuse: bool = False) -> None:
        if root is None:
            root = os.environ.get(ENV_ROOT) or DEFAULT_ROOT
        if not isinstance(coverage_reuse, bool):
            raise TypeError("coverage_reuse must be a bool")
        self.root = os.path.abspath(os.fspath(root))
        self.template = None if template is None else os.path.abspath(os.fspath(template))
        self.coverage_reuse = coverage_reuse

    @property
    def configuration(self) -> dict[str, Any]:
        """`{"template": <absolute path or None>}`: the root is placement, not behaviour."""
        return {"template": self.template}

    def __repr__(self) -> str:
        return f"LocalDirectory(root={self.root!r}, template={self.template!r}, coverage_reuse={self.coverage_reuse})"

    # ----------------------------------------------------------- layout

    @property
    def workspaces(self) -> str:
        return os.path.join(self.root, "workspaces")

    @property
    def objects(self) -> str:
        return os.path.join(self.root, "store", "objects")

    @property
    def snapshots(self) -> str:
        return os.path.join(self.root, "store", "snapshots")

    @property
    def tmp(self) -> str:
        return os.path.join(self.root, "tmp")

    def object_path(self, digest: str) -> str:
        return os.path.join(self.objects, digest[:2], digest[2:])

    def snapshot_path(self, ref: str) -> str:
        """The manifest file of a ref (`sha256:<hex>`)."""
        m = _REF.fullmatch(ref)
        if m is None:
            raise ValueError(f"not a local snapshot ref: {ref!r}")
        return os.path.join(self.snapshots, m.group(1) + ".json")

    def _layout(self) -> None:
        if not os.path.isdir(self.root):
            _make_dirs(self.root, 0o700)
            os.chmod(self.root, 0o700)
            _spread_subdirectories(self.root)  # tmp/, where captures create files, then starts in a group of its own
        for d in (self.workspaces, self.objects, self.snapshots, self.tmp):
            if not os.path.isdir(d):
                _make_dirs(d, 0o777)
        if not self._spread:
            _spread_subdirectories(self.tmp)  # every staged workspace is a tree of its own
            self._spread = True

    # ----------------------------------------------------------- driver

    async def create(self, checkpoint_ref: str | None = None) -> tuple[LocalDirectoryHandle, dict[str, str]]:
        """A new directory under `workspaces/`: from the checkpoint, else the
        template, else empty. Returns the handle and `{"path": <directory>}`."""
        path = await asyncio.to_thread(self._create, checkpoint_ref)
        return LocalDirectoryHandle(path), {"path": path}

    async def open(self, binding: Any) -> LocalDirectoryHandle:
        """The handle of a recorded workspace; `FileNotFoundError` when its
        directory is gone."""
        if not isinstance(binding, dict) or not isinstance(binding.get("path"), str):
            raise ValueError(f'a LocalDirectory binding is {{"path": "<directory>"}}, not {binding!r}')
        path = binding["path"]
        if not await asyncio.to_thread(os.path.isdir, path):
            raise FileNotFoundError(errno.ENOENT, "the workspace directory is gone", path)
        return LocalDirectoryHandle(path)

    async def checkpoint(self, handle: LocalDirectoryHandle) -> str:
        """Snapshot the workspace; return `sha256:<hex of the manifest>`."""
        return await asyncio.to_thread(self._checkpoint, handle)

    # ---------------------------------------------------------- create

    def _create(self, ref: str | None) -> str:
        self._layout()
        if ref is not None:
            return self._restore(ref)
        syncer = _Syncer(self.tmp)
        staging = os.path.join(self.tmp, uuid.uuid4().hex)
        try:
            if self.template is not None:
                files, dirs = _copy_tree(self.template, staging)
            else:
                os.mkdir(staging)
                files, dirs = [], [staging]
            return self._publish_workspace(staging, files, dirs, syncer)
        except BaseException:
            if os.path.lexists(staging):
                _force_rmtree(staging)
            raise
        finally:
            syncer.close()

    def _publish_workspace(self, staging: str, files: Sequence[str], dirs: Iterable[str], syncer: _Syncer) -> str:
        """Make a staged tree durable, then rename it into `workspaces/`: a
        directory there is always complete."""
        syncer.sync(files, dirs)
        final = os.path.join(self.workspaces, str(uuid.uuid4()))
        os.rename(staging, final)
        _fsync_dir(self.workspaces)
        return final

    def _restore(self, ref: str) -> str:
        try:
            entries = self._read_manifest(ref)
        except _Damaged as e:
            raise CheckpointUnavailable(f"local snapshot {ref} is missing or damaged: {e}") from None
        syncer = _Syncer(self.tmp)
        staging = os.path.join(self.tmp, uuid.uuid4().hex)
        os.mkdir(staging)
        try:
            files, dirs = self._materialise(entries, staging)
            return self._publish_workspace(staging, files, dirs, syncer)
        except _Damaged as e:
            _force_rmtree(staging)
            raise CheckpointUnavailable(f"local snapshot {ref} is missing or damaged: {e}") from None
        except BaseException:
            _force_rmtree(staging)
            raise
        finally:
            syncer.close()

    def _read_manifest(self, ref: Any) -> list[dict[str, Any]]:
        """The validated entries of a ref. Whether each object exists is
        checked when it is opened to be copied (_copy_object): a second
        stat of every object here would cost as much again."""
        m = _REF.fullmatch(ref) if isinstance(ref, str) else None
        if m is None:
            raise _Damaged("the ref is not sha256:<64 lowercase hex digits>")
        digest = m.group(1)
        try:
            with open(os.path.join(self.snapshots, digest + ".json"), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise _Damaged("the manifest does not exist") from None
        except OSError as err:
            raise _Damaged(f"the manifest cannot be read: {err}") from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise _Damaged("the manifest does not match its hash")
        return _parse_manifest(data)

    def _materialise(self, entries: list[dict[str, Any]], staging: str) -> tuple[list[str], list[str]]:
        """Build the tree in `staging`; return its files and directories."""
        copies: list[tuple[str, str, int, str, int]] = []  # (object, digest, size, file, mode)
        made: set[str] = {staging}  # directories that exist
        dirs: list[tuple[str, int]] = []
        objects = self.objects + "/"
        for e in sorted(entries, key=lambda x: str(x["path"]).encode("utf-8")):
            dest = staging + "/" + e["path"]  # a validated relative path of "/"-separated names
            parent = dest.rpartition("/")[0]
            if parent not in made:  # a parent the manifest does not list
                os.makedirs(parent, exist_ok=True)
                while parent not in made:
                    made.add(parent)
                    parent = os.path.dirname(parent)
            kind = e["type"]
            if kind == "file":
                digest = e["sha256"]
                copies.append((objects + digest[:2] + "/" + digest[2:], digest, e["size"], dest, e["mode"]))
            elif kind == "dir":
                os.mkdir(dest, 0o700)
                made.add(dest)
                dirs.append((dest, e["mode"]))
            else:
                os.symlink(e["target"], dest)
        _copy_objects(copies)
        for dest, mode in reversed(dirs):  # deepest first, so no parent turns read-only too early
            os.chmod(dest, mode)
        return [c[3] for c in copies], list(made)

    # ------------------------------------------------------ checkpoint

    def _checkpoint(self, handle: LocalDirectoryHandle) -> str:
        if not isinstance(handle, LocalDirectoryHandle):
            raise TypeError(f"not a LocalDirectory handle: {handle!r}")
        self._layout()
        if not os.path.isdir(handle.path):
            raise FileNotFoundError(errno.ENOENT, "the workspace directory is gone", handle.path)
        started = time.time_ns()
        settled = started - _RACY_NS
        checks = _ObjectChecks(self.objects, handle._fans, settled)
        batch = _Batch(self.tmp)
        try:
            parts: list[tuple[bytes, bytes]] = []
            known: dict[str, _Known] = {}
            # Relative to directory descriptors: one name to look up per stat, not the whole path.
            fd = os.open(handle.path, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
            try:
                self._walk(handle._hashes, fd, "", parts, known, settled, checks, batch)
            finally:
                os.close(fd)
            data = _assemble(parts)
            digest = hashlib.sha256(data).hexdigest()
            final = os.path.join(self.snapshots, digest + ".json")
            if not os.path.isfile(final):
                batch.add(data, final)
            batch.commit()
        finally:
            batch.close()
        # Only now are the objects the new entries name durable; until then the
        # old entries, whose objects were, stay.
        handle._hashes = known
        handle._fans = checks.record({os.path.basename(d) for d in batch.renamed_into})
        return "sha256:" + digest

    def _walk(self, cache: dict[str, _Known], dir_fd: int, prefix: str, parts: list[tuple[bytes, bytes]],
              known: dict[str, _Known], settled: int, checks: _ObjectChecks, batch: _Batch) -> None:
        """Add the entries below a directory to `parts`, and the files hashed
        before `settled` (outside the racy window) to `known`."""
        with os.scandir(dir_fd) as it:
            # Code point order is UTF-8 byte order for every name a capture accepts.
            names = sorted([entry.name for entry in it])
        # The loop runs once per file of the workspace: names are bound
        # locally, and os.stat relative to the directory's descriptor costs a
        # third less than DirEntry.stat.
        lstat, get, append, still_there, is_reg = os.stat, cache.get, parts.append, checks.still_there, stat.S_ISREG
        for name in names:
            rel = prefix + name
            st = lstat(name, dir_fd=dir_fd, follow_symlinks=False)
            mode = st.st_mode
            if is_reg(mode):
                hit = get(rel)
                if hit is not None and hit.key == (mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino,
                                                   st.st_dev) and still_there(hit):
                    known[rel] = hit
                    append((hit.path, hit.entry))
                    continue
            _utf8_name(name, rel)
            if stat.S_ISLNK(mode):
                target = os.readlink(name, dir_fd=dir_fd)
                _utf8_name(target, rel)
                parts.append((rel.encode("utf-8"), _entry_bytes({"path": rel, "target": target, "type": "symlink"})))
            elif stat.S_ISDIR(mode):
                parts.append((rel.encode("utf-8"), _entry_bytes({"mode": stat.S_IMODE(mode), "path": rel,
                                                                 "type": "dir"})))
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _O_CLOEXEC, dir_fd=dir_fd)
                try:
                    self._walk(cache, sub, rel + "/", parts, known, settled, checks, batch)
                finally:
                    os.close(sub)
            elif stat.S_ISREG(mode):
                hashed = self._store_object(dir_fd, name, rel, st, checks, batch)
                parts.append((hashed.path, hashed.entry))
                if max(st.st_mtime_ns, st.st_ctime_ns) < settled:
                    known[rel] = hashed
            else:
                raise ValueError(f"{rel}: cannot capture a FIFO, socket or device file")

    def _store_object(self, dir_fd: int, name: str, rel: str, st: os.stat_result, checks: _ObjectChecks,
                      batch: _Batch) -> _Known:
        """Hash a file and stage its object unless the store has it. A small
        file is read once, and what is staged is what was hashed."""
        key = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
        data: bytes | None = None
        fd = os.open(name, os.O_RDONLY | _O_CLOEXEC, dir_fd=dir_fd)
        try:
            if st.st_size <= _CHUNK:
                data = _read_upto(fd, st.st_size)
                digest = hashlib.sha256(data).hexdigest()
            else:
                h = hashlib.sha256()
                while chunk := os.read(fd, _CHUNK):
                    h.update(chunk)
                digest = h.hexdigest()
        finally:
            os.close(fd)
        fan = digest[:2]
        obj = self.object_path(digest)
        if obj not in batch and not checks.present(fan, obj):
            if data is None:
                batch.add_copy(dir_fd, name, rel, digest, obj)
            elif len(data) == st.st_size:
                batch.add(data, obj)
        after = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if (data is not None and len(data) != st.st_size) or \
                (after.st_mode, after.st_size, after.st_mtime_ns, after.st_ctime_ns, after.st_ino, after.st_dev) != key:
            raise ValueError(f"{rel}: the file changed while it was captured")
        entry = _entry_bytes({"mode": stat.S_IMODE(st.st_mode), "path": rel, "sha256": digest, "size": st.st_size,
                              "type": "file"})
        return _Known(key, rel.encode("utf-8"), entry, fan, obj)


def _parse_manifest(data: bytes) -> list[dict[str, Any]]:
    """Validate a manifest: its format, and every entry's shape, path, hash
    and mode; no entry may lie below a symlink or a file."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _Damaged("the manifest is not valid JSON") from None
    if not isinstance(doc, dict) or set(doc) != {"entries", "format"} or doc["format"] != FORMAT:
        raise _Damaged(f"the manifest is not in the {FORMAT} format")
    entries = doc["entries"]
    if not isinstance(entries, list):
        raise _Damaged("the manifest's entries are not a list")
    types: dict[str, str] = {}
    for e in entries:
        kind = e.get("type") if isinstance(e, dict) else None
        keys = _ENTRY_KEYS.get(kind) if isinstance(kind, str) else None
        if keys is None or e.keys() != keys:
            raise _Damaged(f"invalid entry {e!r}")
        path = e["path"]
        if not isinstance(path, str) or not _valid_path(path):
            raise _Damaged(f"invalid path {path!r}")
        if path in types:
            raise _Damaged(f"duplicate path {path!r}")
        types[path] = e["type"]
        if kind in ("dir", "file"):
            mode = e["mode"]
            if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o777:
                raise _Damaged(f"invalid mode {mode!r} of {path!r}")
        if kind == "file":
            if not isinstance(e["sha256"], str) or _HEX.fullmatch(e["sha256"]) is None:
                raise _Damaged(f"invalid object hash of {path!r}")
            size = e["size"]
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise _Damaged(f"invalid size of {path!r}")
        elif kind == "symlink":
            target = e["target"]
            if not isinstance(target, str) or not target or "\x00" in target:
                raise _Damaged(f"invalid symlink target of {path!r}")
    for path in types:
        # Up to the nearest listed ancestor: that one's own ancestors are checked in its turn.
        i = path.rfind("/")
        while i > 0:
            above = types.get(path[:i])
            if above is not None:
                if above != "dir":
                    raise _Damaged(f"{path!r} lies below a {above}")
                break
            i = path.rfind("/", 0, i)
    return entries


def _valid_path(path: str) -> bool:
    if not path or path[0] == "/" or "\x00" in path:
        return False
    segments = path.split("/")
    return "" not in segments and "." not in segments and ".." not in segments


def _copy_objects(copies: list[tuple[str, str, int, str, int]]) -> None:
    """Copy objects into a staged tree (the bulk of a restore's time).

    Creating a file is mostly kernel time, during which a second thread can
    read, check and write other files: two threads restored 1,000 files in
    about 35 ms where one took 45 on the test machine. More do not help:
    creates in one directory take turns, and the rest holds the GIL.
    """
    umask = _umask()
    copiers = min(2, os.cpu_count() or 1)
    if copiers < 2 or len(copies) < _PARALLEL_MIN:
        for c in copies:
            _copy_object(*c, umask)
        return
    failed = threading.Event()

    def run(part: list[tuple[str, str, int, str, int]]) -> None:
        for c in part:
            if failed.is_set():
                return
            try:
                _copy_object(*c, umask)
            except BaseException:
                failed.set()
                raise

    with concurrent.futures.ThreadPoolExecutor(copiers, thread_name_prefix="rebuno-restore") as pool:
        done = [pool.submit(run, copies[i::copiers]) for i in range(copiers)]
    for future in done:
        future.result()


def _umask() -> int | None:
    """The process's umask, read without setting it (os.umask would change it
    for every thread for a moment); None where /proc does not tell."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _copy_object(obj: str, digest: str, size: int, dest: str, mode: int, umask: int | None) -> None:
    """Copy an object to a new file, checking it against its hash; small
    objects are checked before anything is written.

    A small object costs a restore its syscalls, so it gets no fstat (reading
    it tells whether it is a file of the right content) and no fchmod when the
    umask leaves its mode whole. Bytes past the recorded size are not read:
    what is restored is what the hash names."""
    try:
        # O_NONBLOCK: something other than a file put at an object's path
        # (a FIFO) must not hang the restore.
        src = os.open(obj, os.O_RDONLY | os.O_NONBLOCK | _O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise _Damaged(f"object {digest} does not exist") from None
    try:
        if size <= _CHUNK:
            try:
                data = _read_upto(src, size)
            except (IsADirectoryError, BlockingIOError):
                raise _Damaged(f"object {digest} does not exist") from None
            if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
                raise _Damaged(f"object {digest} is damaged")
            # Created in a staging folder only this process can enter.
            out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, mode)
            try:
                _write_all(out, data)
                if umask is None or mode & umask:
                    os.fchmod(out, mode)
            finally:
                os.close(out)
            return
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            raise _Damaged(f"object {digest} does not exist")
        if st.st_size != size:
            raise _Damaged(f"object {digest} is damaged")
        h = hashlib.sha256()
        n = 0
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o600)
        try:
            while chunk := os.read(src, _CHUNK):
                h.update(chunk)
                n += len(chunk)
                _write_all(out, chunk)
            os.fchmod(out, mode)
        finally:
            os.close(out)
        if h.hexdigest() != digest or n != size:
            raise _Damaged(f"object {digest} is damaged")
    finally:
        os.close(src)


def _make_dirs(path: str, mode: int) -> None:
    """os.makedirs, fsyncing the parent of each directory it creates, so
    that the store's directories outlast a crash like the files in them."""
    parent = os.path.dirname(path)
    if parent != path and not os.path.isdir(parent):
        _make_dirs(parent, 0o777)
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
        return
    _fsync_dir(parent)


def _copy_tree(src: str, dst: str) -> tuple[list[str], list[str]]:
    """Copy a template: directories, regular files and symlinks, with their
    modes; anything else is refused. Returns the files and directories
    copied, to be made durable by the caller."""
    st = os.stat(src)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "the template is not a directory", src)
    os.mkdir(dst, 0o700)
    dirs: list[tuple[str, int]] = [(dst, stat.S_IMODE(st.st_mode))]
    files: list[str] = []
    for dirpath, dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        target_dir = dst if rel == "." else os.path.join(dst, rel)
        for name in sorted(dirnames + filenames):
            s = os.path.join(dirpath, name)
            d = os.path.join(target_dir, name)
            lst = os.lstat(s)
            if stat.S_ISLNK(lst.st_mode):
                os.symlink(os.readlink(s), d)
            elif stat.S_ISDIR(lst.st_mode):
                os.mkdir(d, 0o700)
                dirs.append((d, stat.S_IMODE(lst.st_mode)))
            elif stat.S_ISREG(lst.st_mode):
                shutil.copyfile(s, d, follow_symlinks=False)
                os.chmod(d, stat.S_IMODE(lst.st_mode))
                files.append(d)
            else:
                raise ValueError(f"{s}: cannot copy a FIFO, socket or device file")
        # os.walk does not descend into symlinked directories: they stay links.
        dirnames[:] = [n for n in dirnames if not os.path.islink(os.path.join(dirpath, n))]
    for d, mode in reversed(dirs):
        os.chmod(d, mode)
    return files, [d for d, _mode in dirs]
