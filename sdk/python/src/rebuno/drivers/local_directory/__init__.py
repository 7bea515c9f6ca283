"""`LocalDirectory`: a resource driver whose resource is a directory on the
local disk, with content-addressed snapshots as checkpoints
(docs/protocol/sdk.md §5).

    workspace = await resource("workspace", driver=LocalDirectory())
    await workspace.files.write("notes.txt", "hello")

A checkpoint ref is `sha256:<hex of the manifest bytes>`, so an unchanged
tree yields the same ref, and identical files are stored once. Restores copy
(never link) every object, verifying its hash, so writes in a restored
workspace can never change a checkpoint. A malformed ref, a missing or
damaged manifest or object, or a manifest entry that would escape the
workspace raises `CheckpointUnavailable`.

The modules, one concern each:

| module     | holds                                                              |
|------------|--------------------------------------------------------------------|
| `driver`   | `LocalDirectory`: create, open, checkpoint                         |
| `layout`   | where workspaces, objects, manifests and staging live under `root` |
| `handle`   | `LocalDirectoryHandle`, and what its captures remember             |
| `files`    | `LocalFiles`, the workspace's `files` API                          |
| `manifest` | the snapshot format: its exact bytes, and validating one           |
| `capture`  | hashing a workspace into the store                                 |
| `restore`  | building a workspace from a snapshot or a template                 |
| `durable`  | making new files and directories durable; shared file I/O          |
"""

from .driver import DRIVER_ID, LocalDirectory
from .files import LocalFiles
from .handle import LocalDirectoryHandle
from .manifest import FORMAT, manifest_bytes

__all__ = ["LocalDirectory", "LocalDirectoryHandle", "LocalFiles", "FORMAT", "DRIVER_ID", "manifest_bytes"]
