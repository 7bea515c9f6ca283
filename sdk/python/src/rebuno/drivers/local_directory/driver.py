"""`LocalDirectory`: the driver's create, open and checkpoint."""

from __future__ import annotations

import asyncio
import errno
import os
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from ...errors import CheckpointUnavailable
from .capture import capture
from .durable import Syncer, force_rmtree, fsync_dir
from .files import remove_interrupted_writes
from .handle import LocalDirectoryHandle
from .layout import StoreLayout
from .manifest import Damaged
from .restore import copy_tree, materialise, read_manifest

__all__ = ["LocalDirectory", "DRIVER_ID"]

DRIVER_ID = "rebuno.local_directory.v1"
ENV_ROOT = "REBUNO_LOCAL_RESOURCES"
DEFAULT_ROOT = os.path.join(".rebuno", "resources")


class LocalDirectory(StoreLayout):
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

    # ----------------------------------------------------------- driver

    async def create(self, checkpoint_ref: str | None = None) -> tuple[LocalDirectoryHandle, dict[str, str]]:
        """A new directory under `workspaces/`: from the checkpoint, else the
        template, else empty. Returns the handle and `{"path": <directory>}`."""
        path = await asyncio.to_thread(self._create, checkpoint_ref)
        return LocalDirectoryHandle(path), {"path": path}

    async def open(self, binding: Any) -> LocalDirectoryHandle:
        """The handle of a recorded workspace; `FileNotFoundError` when its
        directory is gone. A workspace is reopened after its agent stopped,
        perhaps mid-write: the temporary files of such writes are removed."""
        if not isinstance(binding, dict) or not isinstance(binding.get("path"), str):
            raise ValueError(f'a LocalDirectory binding is {{"path": "<directory>"}}, not {binding!r}')
        path = binding["path"]
        if not await asyncio.to_thread(os.path.isdir, path):
            raise FileNotFoundError(errno.ENOENT, "the workspace directory is gone", path)
        await asyncio.to_thread(remove_interrupted_writes, path)
        return LocalDirectoryHandle(path)

    async def checkpoint(self, handle: LocalDirectoryHandle) -> str:
        """Snapshot the workspace; return `sha256:<hex of the manifest>`."""
        return await asyncio.to_thread(capture, self, handle)

    # ---------------------------------------------------------- create

    def _create(self, ref: str | None) -> str:
        self.prepare()
        if ref is not None:
            return self._restore(ref)
        syncer = Syncer(self.tmp)
        staging = os.path.join(self.tmp, uuid.uuid4().hex)
        try:
            if self.template is not None:
                files, dirs = copy_tree(self.template, staging)
            else:
                os.mkdir(staging)
                files, dirs = [], [staging]
            return self._publish_workspace(staging, files, dirs, syncer)
        except BaseException:
            if os.path.lexists(staging):
                force_rmtree(staging)
            raise
        finally:
            syncer.close()

    def _publish_workspace(self, staging: str, files: Sequence[str], dirs: Iterable[str], syncer: Syncer) -> str:
        """Make a staged tree durable, then rename it into `workspaces/`: a
        directory there is always complete."""
        syncer.sync(files, dirs)
        final = os.path.join(self.workspaces, str(uuid.uuid4()))
        os.rename(staging, final)
        fsync_dir(self.workspaces)
        return final

    def _restore(self, ref: str) -> str:
        try:
            entries = read_manifest(self, ref)
        except Damaged as e:
            raise CheckpointUnavailable(f"local snapshot {ref} is missing or damaged: {e}") from None
        syncer = Syncer(self.tmp)
        staging = os.path.join(self.tmp, uuid.uuid4().hex)
        os.mkdir(staging)
        try:
            files, dirs = materialise(self, entries, staging)
            return self._publish_workspace(staging, files, dirs, syncer)
        except Damaged as e:
            force_rmtree(staging)
            raise CheckpointUnavailable(f"local snapshot {ref} is missing or damaged: {e}") from None
        except BaseException:
            force_rmtree(staging)
            raise
        finally:
            syncer.close()
