"""Where a `LocalDirectory` keeps its workspaces and its store, under `root`."""

from __future__ import annotations

import os

from .durable import make_dirs, spread_subdirectories
from .manifest import REF

__all__ = ["StoreLayout"]


class StoreLayout:
    """The paths under `root`, and creating them:

    | path                              | holds                                  |
    |-----------------------------------|----------------------------------------|
    | `workspaces/<uuid>/`              | live directories, one per `create`     |
    | `store/objects/<2 hex>/<62 hex>`  | file contents by SHA-256, read-only    |
    | `store/snapshots/<64 hex>.json`   | manifests                              |
    | `tmp/`                            | staging: written, synced, renamed      |
    """

    root: str
    _spread = False  # whether prepare has marked tmp/ (a hint: once per instance is enough)

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
        m = REF.fullmatch(ref)
        if m is None:
            raise ValueError(f"not a local snapshot ref: {ref!r}")
        return os.path.join(self.snapshots, m.group(1) + ".json")

    def prepare(self) -> None:
        """Create the directories that do not exist yet."""
        if not os.path.isdir(self.root):
            make_dirs(self.root, 0o700)
            os.chmod(self.root, 0o700)
            spread_subdirectories(self.root)  # tmp/, where captures create files, then starts in a group of its own
        for d in (self.workspaces, self.objects, self.snapshots, self.tmp):
            if not os.path.isdir(d):
                make_dirs(d, 0o777)
        if not self._spread:
            spread_subdirectories(self.tmp)  # every staged workspace is a tree of its own
            self._spread = True
