"""Making new files and directories durable, and the file I/O that captures
and restores share.

Everything a call of the driver writes is made durable together before
anything refers to it; see `Syncer` for how a batch is flushed.
"""

from __future__ import annotations

import array
import ctypes
import errno
import functools
import os
import platform
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = ["CHUNK", "O_CLOEXEC", "Syncer", "fsync_dir", "fsync_file", "read_upto", "write_all", "make_dirs",
           "force_rmtree", "spread_subdirectories"]

CHUNK = 1 << 20  # files above this size are read and copied in pieces of it
O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# Up to this many files and directories are made durable one fsync each;
# beyond it, by one syncfs (see Syncer). A capture of a few changed files
# then never waits for other processes' dirty data, and a restore of a
# thousand files pays for one flush of the disk's cache, not a thousand.
_FSYNC_MAX = 8
# FS_IOC_GETFLAGS and FS_IOC_SETFLAGS (_IOR/_IOW('f', 1/2, long)) on the
# machines whose ioctl numbers use the generic encoding with 8-byte longs,
# and FS_TOPDIR_FL, chattr's "T" (see spread_subdirectories).
_FS_IOC_FLAGS = {m: (0x80086601, 0x40086602) for m in ("x86_64", "aarch64", "arm64", "riscv64")}
_FS_TOPDIR_FL = 0x00020000


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_upto(fd: int, limit: int) -> bytes:
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


def write_all(fd: int, data: bytes) -> None:
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


class Syncer:
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
            self._fd = os.open(anchor, os.O_RDONLY | os.O_DIRECTORY | O_CLOEXEC)

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
            fsync_file(path)
        for path in dirs:
            fsync_dir(path)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def spread_subdirectories(path: str) -> None:
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
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | O_CLOEXEC)
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


def force_rmtree(path: str) -> None:
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


def make_dirs(path: str, mode: int) -> None:
    """os.makedirs, fsyncing the parent of each directory it creates, so
    that the store's directories outlast a crash like the files in them."""
    parent = os.path.dirname(path)
    if parent != path and not os.path.isdir(parent):
        make_dirs(parent, 0o777)
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
        return
    fsync_dir(parent)
