"""A small directory resource driver for the compatibility suite, written for the
test tree (docs/protocol/sdk.md §5 gives the idea; this is not that driver).

The published client (``rebuno`` 0.29.2) calls ``create(ref)``, ``open(binding)``
and ``checkpoint(handle)`` and reads ``driver_id``, ``configuration`` and
``coverage_reuse``. Every method here is synchronous: the client runs it in a
worker thread.

Layout under the test-owned ``root``:

- ``workspaces/<uuid>/``: one live directory per ``create``;
- ``objects/<sha256>``: file contents, stored once;
- ``snapshots/<sha256>.json``: one manifest per distinct tree, whose hash is the
  checkpoint ref ``dir:<sha256>``.

Restoring copies the objects (never links them), so a later write in the
workspace cannot change a checkpoint. A missing or damaged manifest or object
raises the published client's ``CheckpointUnavailable``. The test process imports
this module too, to materialise refs and read trees.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import uuid
from pathlib import Path
from typing import Any

from rebuno import CheckpointUnavailable

DRIVER_ID = "compat.dirdriver.v1"
_REF = re.compile(r"^dir:([0-9a-f]{64})$")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_atomic(path: Path, data: bytes, tmp: Path) -> None:
    """Writes ``data`` to ``path`` through a temporary file in ``tmp`` and a
    rename, with fsync, so a reader never sees half a file."""
    tmp.mkdir(parents=True, exist_ok=True)
    part = tmp / f"{uuid.uuid4().hex}.part"
    with open(part, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, path)


def read_tree(path: str | Path) -> dict[str, str]:
    """Every regular file below ``path``, as relative ``/``-path → text."""
    base = Path(path)
    out: dict[str, str] = {}
    for p in sorted(base.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[p.relative_to(base).as_posix()] = p.read_text("utf-8")
    return out


class Workspace:
    """The handle tools use: one directory, with paths kept inside it."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def _resolve(self, rel: str) -> Path:
        target = (self.path / rel.lstrip("/")).resolve()
        if target != self.path.resolve() and self.path.resolve() not in target.parents:
            raise PermissionError(f"{rel!r} is outside the workspace")
        return target

    def write(self, rel: str, text: str) -> None:
        target = self._resolve(rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".{target.name}.{uuid.uuid4().hex}.part"
        tmp.write_text(text, "utf-8")
        os.replace(tmp, target)

    def read(self, rel: str) -> str:
        return self._resolve(rel).read_text("utf-8")

    def files(self) -> dict[str, str]:
        return read_tree(self.path)


class DirDriver:
    """create/open/checkpoint of plain directories under ``root``."""

    driver_id = DRIVER_ID

    def __init__(self, root: str | Path, *, coverage_reuse: bool = False):
        self.root = Path(root).resolve()
        self.coverage_reuse = coverage_reuse
        # Behaviour, not placement: the root stays out of it, so a fork on
        # another machine with another root matches the registration.
        self.configuration = {"format": "compat-dir-1"}

    # -- paths --

    @property
    def _objects(self) -> Path:
        return self.root / "objects"

    @property
    def _snapshots(self) -> Path:
        return self.root / "snapshots"

    @property
    def _tmp(self) -> Path:
        return self.root / "tmp"

    def manifest_path(self, ref: str) -> Path:
        m = _REF.match(ref)
        if not m:
            raise ValueError(f"not a checkpoint ref of this driver: {ref!r}")
        return self._snapshots / f"{m.group(1)}.json"

    # -- the driver contract --

    def create(self, checkpoint_ref: str | None = None) -> tuple[Workspace, dict[str, Any]]:
        ws = self.root / "workspaces" / uuid.uuid4().hex
        if checkpoint_ref is None:
            ws.mkdir(parents=True)
        else:
            self._restore(checkpoint_ref, ws)
        return Workspace(ws), {"path": str(ws)}

    def open(self, binding: dict[str, Any]) -> Workspace:
        path = Path(binding["path"])
        if not path.is_dir():
            raise FileNotFoundError(f"workspace {path} is gone")
        return Workspace(path)

    def checkpoint(self, handle: Workspace) -> str:
        entries = []
        for p in sorted(handle.path.rglob("*"), key=lambda q: q.relative_to(handle.path).as_posix().encode()):
            rel = p.relative_to(handle.path).as_posix()
            st = p.lstat()
            if stat.S_ISDIR(st.st_mode):
                entries.append({"path": rel, "type": "dir"})
            elif stat.S_ISREG(st.st_mode):
                data = p.read_bytes()
                digest = _sha256(data)
                obj = self._objects / digest
                if not obj.exists():
                    self._objects.mkdir(parents=True, exist_ok=True)
                    _write_atomic(obj, data, self._tmp)
                entries.append({"path": rel, "type": "file", "sha256": digest, "size": len(data)})
            else:
                raise OSError(f"cannot capture {rel}: not a file or directory")
        manifest = json.dumps({"driver": DRIVER_ID, "entries": entries}, sort_keys=True, separators=(",", ":")).encode()
        digest = _sha256(manifest)
        self._snapshots.mkdir(parents=True, exist_ok=True)
        target = self._snapshots / f"{digest}.json"
        if not target.exists():
            _write_atomic(target, manifest, self._tmp)
        return f"dir:{digest}"

    # -- restore --

    def _restore(self, ref: str, ws: Path) -> None:
        def unavailable(detail: str) -> CheckpointUnavailable:
            return CheckpointUnavailable(f"directory snapshot {ref} is missing or damaged: {detail}")

        m = _REF.match(ref)
        if not m:
            raise unavailable("malformed ref")
        try:
            raw = (self._snapshots / f"{m.group(1)}.json").read_bytes()
        except FileNotFoundError:
            raise unavailable("no manifest") from None
        if _sha256(raw) != m.group(1):
            raise unavailable("manifest hash mismatch")
        try:
            entries = json.loads(raw)["entries"]
        except (ValueError, KeyError, TypeError):
            raise unavailable("unreadable manifest") from None
        staging = self._tmp / f"restore-{uuid.uuid4().hex}"
        staging.mkdir(parents=True)
        for e in entries:
            rel = e.get("path", "")
            parts = rel.split("/")
            if not rel or any(s in ("", ".", "..") or "\0" in s for s in parts):
                raise unavailable(f"bad path {rel!r}")
            dest = staging.joinpath(*parts)
            if e.get("type") == "dir":
                dest.mkdir(parents=True, exist_ok=True)
                continue
            try:
                data = (self._objects / e["sha256"]).read_bytes()
            except (FileNotFoundError, KeyError):
                raise unavailable(f"object of {rel!r} is missing") from None
            if _sha256(data) != e["sha256"]:
                raise unavailable(f"object of {rel!r} is damaged")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        ws.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging, ws)
