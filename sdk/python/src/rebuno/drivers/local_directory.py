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
| `tmp/`                            | staging: every write is temp, fsync, rename |

A checkpoint ref is `sha256:<hex of the manifest bytes>`, so an unchanged
tree yields the same ref, and identical files are stored once. Restores copy
(never link) every object, verifying its hash, so writes in a restored
workspace can never change a checkpoint. A malformed ref, a missing or
damaged manifest or object, or a manifest entry that would escape the
workspace raises `CheckpointUnavailable`.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import functools
import hashlib
import json
import os
import re
import shutil
import stat
import sys
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
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
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


def _sort_name(entry: os.DirEntry[str]) -> bytes:
    return entry.name.encode("utf-8", "surrogateescape")


@functools.cache
def _syncfs() -> Callable[[int], int] | None:
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
    return fn  # type: ignore[no-any-return]


class _Syncer:
    """Makes a batch of new files and directories durable.

    fsync of each costs one flush of the disk's write cache apiece: about a
    millisecond on this project's test machine, 0.3 s for a 1,000-file
    restore, and batching the fsyncs after all writes (or issuing them from
    threads) still costs 0.1 to 0.3 s. So beyond _FSYNC_MAX paths, one
    syncfs of the filesystem the batch lives on (about 10 ms for 1,000 files)
    writes back everything dirty on it and flushes once; the price is that it
    also writes other processes' dirty data on that filesystem.

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
            _syncfs.cache_clear()
        for path in files:
            _fsync_file(path)
        for path in dirs:
            _fsync_dir(path)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


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


class LocalDirectoryHandle:
    """A live workspace: `path` is the directory, `files` the file API."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.files = LocalFiles(path)
        # (path) → ((size, mtime_ns, ctime_ns, inode, device), sha256) of files
        # hashed by an earlier capture of this handle.
        self._hashes: dict[str, tuple[tuple[int, int, int, int, int], str]] = {}

    def __repr__(self) -> str:
        return f"LocalDirectoryHandle({self.path!r})"


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
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            os.chmod(self.root, 0o700)
        for d in (self.workspaces, self.objects, self.snapshots, self.tmp):
            os.makedirs(d, exist_ok=True)

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
        staging = os.path.join(self.tmp, uuid.uuid4().hex)
        try:
            if self.template is not None:
                _copy_tree(self.template, staging)
            else:
                os.mkdir(staging)
            return self._publish_workspace(staging)
        except BaseException:
            if os.path.lexists(staging):
                _force_rmtree(staging)
            raise

    def _publish_workspace(self, staging: str) -> str:
        """fsync a staged tree, then rename it into `workspaces/`."""
        for dirpath, _dirs, _files in os.walk(staging, topdown=False):
            _fsync_dir(dirpath)
        final = os.path.join(self.workspaces, str(uuid.uuid4()))
        os.rename(staging, final)
        _fsync_dir(self.workspaces)
        return final

    def _restore(self, ref: str) -> str:
        try:
            entries = self._read_manifest(ref)
        except _Damaged as e:
            raise CheckpointUnavailable(f"local snapshot {ref} is missing or damaged: {e}") from None
        staging = os.path.join(self.tmp, uuid.uuid4().hex)
        os.mkdir(staging)
        try:
            self._materialise(entries, staging)
            return self._publish_workspace(staging)
        except _Damaged as e:
            _force_rmtree(staging)
            raise CheckpointUnavailable(f"local snapshot {ref} is missing or damaged: {e}") from None
        except BaseException:
            _force_rmtree(staging)
            raise

    def _read_manifest(self, ref: Any) -> list[dict[str, Any]]:
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
        entries = _parse_manifest(data)
        for e in entries:
            if e["type"] == "file" and not os.path.isfile(self.object_path(e["sha256"])):
                raise _Damaged(f"object {e['sha256']} of {e['path']!r} does not exist")
        return entries

    def _materialise(self, entries: list[dict[str, Any]], staging: str) -> None:
        dirs: list[tuple[str, int]] = []
        for e in sorted(entries, key=lambda x: str(x["path"]).encode("utf-8")):
            dest = os.path.join(staging, *e["path"].split("/"))
            parent = os.path.dirname(dest)
            if not os.path.isdir(parent):
                os.makedirs(parent)
            if e["type"] == "dir":
                os.mkdir(dest, 0o700)
                dirs.append((dest, e["mode"]))
            elif e["type"] == "symlink":
                os.symlink(e["target"], dest)
            else:
                self._copy_object(e["sha256"], e["size"], dest)
                os.chmod(dest, e["mode"])
        for dest, mode in reversed(dirs):  # deepest first, so no parent turns read-only too early
            os.chmod(dest, mode)

    def _copy_object(self, digest: str, size: int, dest: str) -> None:
        h = hashlib.sha256()
        n = 0
        try:
            src = open(self.object_path(digest), "rb")
        except FileNotFoundError:
            raise _Damaged(f"object {digest} does not exist") from None
        with src:
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                while chunk := src.read(_CHUNK):
                    h.update(chunk)
                    n += len(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
        if h.hexdigest() != digest or n != size:
            raise _Damaged(f"object {digest} is damaged")

    # ------------------------------------------------------ checkpoint

    def _checkpoint(self, handle: LocalDirectoryHandle) -> str:
        if not isinstance(handle, LocalDirectoryHandle):
            raise TypeError(f"not a LocalDirectory handle: {handle!r}")
        self._layout()
        if not os.path.isdir(handle.path):
            raise FileNotFoundError(errno.ENOENT, "the workspace directory is gone", handle.path)
        started = time.time_ns()
        entries: list[dict[str, Any]] = []
        seen: set[str] = set()
        self._walk(handle, handle.path, "", entries, seen, started)
        for gone in set(handle._hashes) - seen:
            del handle._hashes[gone]
        data = manifest_bytes(entries)
        digest = hashlib.sha256(data).hexdigest()
        final = os.path.join(self.snapshots, digest + ".json")
        if not os.path.isfile(final):
            self._store_file(data, final)
        return "sha256:" + digest

    def _walk(self, handle: LocalDirectoryHandle, directory: str, prefix: str, entries: list[dict[str, Any]],
              seen: set[str], started: int) -> None:
        with os.scandir(directory) as it:
            children = sorted(it, key=lambda d: d.name.encode("utf-8", "surrogateescape"))
        for child in children:
            rel = child.name if not prefix else prefix + "/" + child.name
            _utf8_name(child.name, rel)
            st = child.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(child.path)
                _utf8_name(target, rel)
                entries.append({"path": rel, "target": target, "type": "symlink"})
            elif stat.S_ISDIR(st.st_mode):
                entries.append({"mode": stat.S_IMODE(st.st_mode), "path": rel, "type": "dir"})
                self._walk(handle, child.path, rel, entries, seen, started)
            elif stat.S_ISREG(st.st_mode):
                seen.add(rel)
                digest, size = self._store_object(handle, child.path, rel, st, started)
                entries.append({"mode": stat.S_IMODE(st.st_mode), "path": rel, "sha256": digest, "size": size,
                                "type": "file"})
            else:
                raise ValueError(f"{rel}: cannot capture a FIFO, socket or device file")

    def _store_object(self, handle: LocalDirectoryHandle, path: str, rel: str, st: os.stat_result,
                      started: int) -> tuple[str, int]:
        key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
        cached = handle._hashes.get(rel)
        if cached is not None and cached[0] == key and os.path.isfile(self.object_path(cached[1])):
            return cached[1], st.st_size
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        digest = h.hexdigest()
        obj = self.object_path(digest)
        if not os.path.isfile(obj):
            self._copy_in(path, digest, obj)
        after = os.lstat(path)
        now_key = (after.st_size, after.st_mtime_ns, after.st_ctime_ns, after.st_ino, after.st_dev)
        if now_key != key:
            raise ValueError(f"{rel}: the file changed while it was captured")
        if max(st.st_mtime_ns, st.st_ctime_ns) < started - _RACY_NS:
            handle._hashes[rel] = (key, digest)
        else:
            handle._hashes.pop(rel, None)
        return digest, st.st_size

    def _copy_in(self, path: str, digest: str, obj: str) -> None:
        """Copy a file into the object store through `tmp/`, checking that
        what was copied still has the hash computed before."""
        tmp = os.path.join(self.tmp, uuid.uuid4().hex)
        h = hashlib.sha256()
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with open(path, "rb") as src, os.fdopen(fd, "wb") as out:
                while chunk := src.read(_CHUNK):
                    h.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            if h.hexdigest() != digest:
                raise ValueError(f"{path}: the file changed while it was captured")
            os.chmod(tmp, 0o444)
            os.makedirs(os.path.dirname(obj), exist_ok=True)
            os.replace(tmp, obj)
        except BaseException:
            if os.path.lexists(tmp):
                os.unlink(tmp)
            raise
        _fsync_dir(os.path.dirname(obj))

    def _store_file(self, data: bytes, final: str) -> None:
        tmp = os.path.join(self.tmp, uuid.uuid4().hex)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, 0o444)
            os.replace(tmp, final)
        except BaseException:
            if os.path.lexists(tmp):
                os.unlink(tmp)
            raise
        _fsync_dir(os.path.dirname(final))


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
        if not isinstance(e, dict) or e.get("type") not in _ENTRY_KEYS or set(e) != _ENTRY_KEYS[e["type"]]:
            raise _Damaged(f"invalid entry {e!r}")
        path = e["path"]
        if not isinstance(path, str) or not _valid_path(path):
            raise _Damaged(f"invalid path {path!r}")
        if path in types:
            raise _Damaged(f"duplicate path {path!r}")
        types[path] = e["type"]
        if e["type"] in ("dir", "file"):
            mode = e["mode"]
            if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o777:
                raise _Damaged(f"invalid mode {mode!r} of {path!r}")
        if e["type"] == "file":
            if not isinstance(e["sha256"], str) or _HEX.fullmatch(e["sha256"]) is None:
                raise _Damaged(f"invalid object hash of {path!r}")
            size = e["size"]
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise _Damaged(f"invalid size of {path!r}")
        if e["type"] == "symlink":
            target = e["target"]
            if not isinstance(target, str) or not target or "\x00" in target:
                raise _Damaged(f"invalid symlink target of {path!r}")
    for path in types:
        parts = path.split("/")
        for i in range(1, len(parts)):
            if types.get("/".join(parts[:i]), "dir") != "dir":
                raise _Damaged(f"{path!r} lies below a {types['/'.join(parts[:i])]}")
    return entries


def _valid_path(path: str) -> bool:
    if not path or path.startswith("/") or "\x00" in path:
        return False
    return all(seg not in ("", ".", "..") for seg in path.split("/"))


def _copy_tree(src: str, dst: str) -> None:
    """Copy a template: directories, regular files and symlinks, with their
    modes; anything else is refused."""
    st = os.stat(src)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "the template is not a directory", src)
    os.mkdir(dst, 0o700)
    dirs: list[tuple[str, int]] = [(dst, stat.S_IMODE(st.st_mode))]
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
                fd = os.open(d, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            else:
                raise ValueError(f"{s}: cannot copy a FIFO, socket or device file")
        # os.walk does not descend into symlinked directories: they stay links.
        dirnames[:] = [n for n in dirnames if not os.path.islink(os.path.join(dirpath, n))]
    for d, mode in reversed(dirs):
        os.chmod(d, mode)
