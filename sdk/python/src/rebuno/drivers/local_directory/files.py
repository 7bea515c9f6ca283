"""`LocalFiles`: the `files` API of a `LocalDirectory` workspace."""

from __future__ import annotations

import asyncio
import errno
import os
import re
import shutil
import stat
import uuid

__all__ = ["LocalFiles", "remove_interrupted_writes"]

# A write goes to a temporary file beside its target, then is renamed over it.
# A crash between the two leaves the temporary file behind; its name says so.
_INTERRUPTED = re.compile(r"\..+\.[0-9a-f]{32}\.rebuno-tmp", re.DOTALL)


def _temp_path(parent: str, name: str) -> str:
    return os.path.join(parent, f".{name}.{uuid.uuid4().hex}.rebuno-tmp")


def remove_interrupted_writes(root: str) -> None:
    """Delete the temporary files of writes that a crash cut short, so that a
    reopened workspace holds only files written whole (the write is run
    again when its step replays). Symlinked directories are not followed.
    Best effort: a directory it may not read or change keeps what it holds."""
    for parent, _dirs, names in os.walk(root):
        for name in names:
            if _INTERRUPTED.fullmatch(name):
                try:
                    os.unlink(os.path.join(parent, name))
                except OSError:
                    pass


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
            tmp = _temp_path(parent, os.path.basename(real))
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
