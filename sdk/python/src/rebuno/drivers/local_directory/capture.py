"""Capturing a workspace: hash its tree into the store and write its manifest.

A capture re-reads only files whose size, times, inode or mode changed since
the handle's last capture (see `RACY_NS`), and reuses their manifest entries
as serialised then. Its new objects and manifest are staged in `tmp/`, made
durable, and renamed into the store (`Batch`) before the ref is returned.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import time
import uuid

from .durable import CHUNK, O_CLOEXEC, Syncer, read_upto, write_all
from .handle import DirKey, Known, LocalDirectoryHandle
from .layout import StoreLayout
from .manifest import PERMISSION_BITS, assemble, entry_bytes, utf8_name

__all__ = ["capture", "RACY_NS"]

# A file whose times fall this close to a capture's start is always hashed
# again by the next capture (the "racy" case: a change within the clock's
# granularity could leave size and times unchanged).
RACY_NS = 100_000_000


def is_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


class ObjectChecks:
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

    def __init__(self, objects: str, trusted: dict[str, DirKey], settled: int) -> None:
        self._objects = objects + "/"
        self._trusted = trusted  # the handle's record from earlier captures
        self._settled = settled
        self._seen: dict[str, DirKey | None] = {}
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

    def still_there(self, known: Known) -> bool:
        """Whether an object an earlier capture saw is still in the store."""
        if known.fan not in self._seen:
            self._look(known.fan)
        return known.fan in self._unchanged or is_file(known.obj)

    def present(self, fan: str, obj: str) -> bool:
        """Whether the store has an object."""
        if fan not in self._seen:
            self._look(fan)
        return is_file(obj)

    def record(self, stored_into: set[str]) -> dict[str, DirKey]:
        """The record for the next capture, once this one is durable."""
        return {fan: key for fan, key in self._seen.items()
                if key is not None and fan not in stored_into and max(key[0], key[1]) < self._settled}


class Batch:
    """New store files, published together: each is written to `tmp/`, then
    all are made durable, renamed into place, and the renames made durable.
    Until it is committed, nothing in the store refers to a file that a
    crash could lose, and `close` removes whatever was not published."""

    def __init__(self, tmp: str) -> None:
        self._tmp = tmp
        self._staged: list[tuple[str, str]] = []  # (temp file, final path)
        self._finals: set[str] = set()
        self._syncer: Syncer | None = None
        self.renamed_into: set[str] = set()  # directories that gained a file

    def __contains__(self, final: str) -> bool:
        return final in self._finals

    def _open(self, final: str) -> int:
        if self._syncer is None:  # before the first write, so that syncfs reports its errors
            self._syncer = Syncer(self._tmp)
        tmp = os.path.join(self._tmp, uuid.uuid4().hex)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_CLOEXEC, 0o600)
        self._staged.append((tmp, final))
        self._finals.add(final)
        return fd

    def add(self, data: bytes, final: str) -> None:
        """Stage a read-only file holding `data`."""
        fd = self._open(final)
        try:
            write_all(fd, data)
            os.fchmod(fd, 0o444)
        finally:
            os.close(fd)

    def add_copy(self, dir_fd: int, name: str, rel: str, digest: str, final: str) -> None:
        """Stage a read-only copy of a file, checking that what was copied
        still has the hash computed before."""
        h = hashlib.sha256()
        fd = self._open(final)
        try:
            src = os.open(name, os.O_RDONLY | O_CLOEXEC, dir_fd=dir_fd)
            try:
                while chunk := os.read(src, CHUNK):
                    h.update(chunk)
                    write_all(fd, chunk)
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


def capture(store: StoreLayout, handle: LocalDirectoryHandle) -> str:
    """Snapshot a workspace into the store; return `sha256:<hex of the manifest>`."""
    if not isinstance(handle, LocalDirectoryHandle):
        raise TypeError(f"not a LocalDirectory handle: {handle!r}")
    store.prepare()
    if not os.path.isdir(handle.path):
        raise FileNotFoundError(errno.ENOENT, "the workspace directory is gone", handle.path)
    started = time.time_ns()
    settled = started - RACY_NS
    checks = ObjectChecks(store.objects, handle._fans, settled)
    batch = Batch(store.tmp)
    try:
        parts: list[tuple[bytes, bytes]] = []
        known: dict[str, Known] = {}
        # Relative to directory descriptors: one name to look up per stat, not the whole path.
        fd = os.open(handle.path, os.O_RDONLY | os.O_DIRECTORY | O_CLOEXEC)
        try:
            _walk(store, handle._hashes, fd, "", parts, known, settled, checks, batch)
        finally:
            os.close(fd)
        data = assemble(parts)
        digest = hashlib.sha256(data).hexdigest()
        final = os.path.join(store.snapshots, digest + ".json")
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

def _walk(store: StoreLayout, cache: dict[str, Known], dir_fd: int, prefix: str, parts: list[tuple[bytes, bytes]],
          known: dict[str, Known], settled: int, checks: ObjectChecks, batch: Batch) -> None:
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
        utf8_name(name, rel)
        if stat.S_ISLNK(mode):
            target = os.readlink(name, dir_fd=dir_fd)
            utf8_name(target, rel)
            parts.append((rel.encode("utf-8"), entry_bytes({"path": rel, "target": target, "type": "symlink"})))
        elif stat.S_ISDIR(mode):
            parts.append((rel.encode("utf-8"), entry_bytes({"mode": mode & PERMISSION_BITS, "path": rel,
                                                            "type": "dir"})))
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | O_CLOEXEC, dir_fd=dir_fd)
            try:
                _walk(store, cache, sub, rel + "/", parts, known, settled, checks, batch)
            finally:
                os.close(sub)
        elif stat.S_ISREG(mode):
            hashed = _store_object(store, dir_fd, name, rel, st, checks, batch)
            parts.append((hashed.path, hashed.entry))
            if max(st.st_mtime_ns, st.st_ctime_ns) < settled:
                known[rel] = hashed
        else:
            raise ValueError(f"{rel}: cannot capture a FIFO, socket or device file")

def _store_object(store: StoreLayout, dir_fd: int, name: str, rel: str, st: os.stat_result, checks: ObjectChecks,
                  batch: Batch) -> Known:
    """Hash a file and stage its object unless the store has it. A small
    file is read once, and what is staged is what was hashed."""
    key = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
    data: bytes | None = None
    fd = os.open(name, os.O_RDONLY | O_CLOEXEC, dir_fd=dir_fd)
    try:
        if st.st_size <= CHUNK:
            data = read_upto(fd, st.st_size)
            digest = hashlib.sha256(data).hexdigest()
        else:
            h = hashlib.sha256()
            while chunk := os.read(fd, CHUNK):
                h.update(chunk)
            digest = h.hexdigest()
    finally:
        os.close(fd)
    fan = digest[:2]
    obj = store.object_path(digest)
    if obj not in batch and not checks.present(fan, obj):
        if data is None:
            batch.add_copy(dir_fd, name, rel, digest, obj)
        elif len(data) == st.st_size:
            batch.add(data, obj)
    after = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if (data is not None and len(data) != st.st_size) or \
            (after.st_mode, after.st_size, after.st_mtime_ns, after.st_ctime_ns, after.st_ino, after.st_dev) != key:
        raise ValueError(f"{rel}: the file changed while it was captured")
    entry = entry_bytes({"mode": st.st_mode & PERMISSION_BITS, "path": rel, "sha256": digest, "size": st.st_size,
                         "type": "file"})
    return Known(key, rel.encode("utf-8"), entry, fan, obj)
