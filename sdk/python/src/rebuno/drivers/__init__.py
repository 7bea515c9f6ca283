"""Resource drivers shipped with the SDK.

    from rebuno.drivers import LocalDirectory

`LocalDirectory` keeps a resource as a directory on the local disk, with
content-addressed snapshots as checkpoints, so resources, checkpoints and
forks work without a cloud account.
"""

from .local_directory import LocalDirectory, LocalDirectoryHandle, LocalFiles

__all__ = ["LocalDirectory", "LocalDirectoryHandle", "LocalFiles"]
