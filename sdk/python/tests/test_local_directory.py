"""`rebuno.drivers.LocalDirectory` (docs/protocol/sdk.md §5): the manifest
golden vector, content-addressed snapshots, restores, damaged snapshots and
the `files` API."""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rebuno import CheckpointUnavailable
from rebuno.drivers import LocalDirectory, LocalDirectoryHandle
from rebuno.drivers.local_directory import capture, durable, manifest_bytes, restore
from rebuno.drivers.local_directory.files import _temp_path

from .vectors import load

MANIFESTS = load("local-directory")["cases"]
GOLDEN = MANIFESTS[0]
GOLDEN_REF = GOLDEN["ref"]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    os.chmod(path, mode)


def tree(root: str) -> dict[str, Any]:
    """Everything under a directory: path → ("dir", mode) / ("file", mode, bytes) / ("symlink", target)."""
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("symlink", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = ("file", stat.S_IMODE(st.st_mode), Path(p).read_bytes())
    return out


def objects(driver: LocalDirectory) -> list[str]:
    found = []
    for dirpath, _, filenames in os.walk(driver.objects):
        found += [os.path.basename(dirpath) + f for f in filenames]
    return sorted(found)


@pytest.fixture
def driver(tmp_path: Path) -> LocalDirectory:
    return LocalDirectory(tmp_path / "res")


def build(root: Path, files: list[dict[str, Any]]) -> None:
    """Make the tree a vector describes (parents before children, modes last)."""
    for f in files:
        p = root / f["path"]
        if f["type"] == "dir":
            p.mkdir(parents=True, exist_ok=True)
        elif f["type"] == "file":
            write(p, f["content"], f["mode"])
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(f["target"], p)
    for f in files:
        if f["type"] == "dir":
            os.chmod(root / f["path"], f["mode"])


async def golden(driver: LocalDirectory) -> tuple[LocalDirectoryHandle, str]:
    h, _ = await driver.create()
    build(Path(h.path), GOLDEN["files"])
    return h, await driver.checkpoint(h)


# --------------------------------------------------------------- the format


@pytest.mark.parametrize("case", MANIFESTS, ids=lambda c: c["name"])
async def test_manifest_vectors(driver: LocalDirectory, case: dict[str, Any]) -> None:
    h, _ = await driver.create()
    build(Path(h.path), case["files"])
    ref = await driver.checkpoint(h)
    assert ref == case["ref"]
    data = Path(driver.snapshot_path(ref)).read_bytes()
    assert data == case["manifest"].encode("utf-8") and len(data) == case["manifest_length"]
    assert "sha256:" + sha(data) == ref
    # The pure serialisation gives the same bytes whatever the input order.
    entries = json.loads(data)["entries"]
    assert manifest_bytes(list(reversed(entries))) == data


def test_identity_and_configuration(tmp_path: Path) -> None:
    d = LocalDirectory(tmp_path / "r", template=tmp_path / "tpl", coverage_reuse=True)
    assert d.driver_id == "rebuno.local_directory.v1"
    assert d.configuration == {"template": str(tmp_path / "tpl")}  # the root is not part of it
    assert d.coverage_reuse is True
    assert LocalDirectory(tmp_path / "other").configuration == {"template": None}
    assert LocalDirectory().coverage_reuse is False
    with pytest.raises(TypeError):
        LocalDirectory(coverage_reuse="yes")  # type: ignore[arg-type]


def test_root_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REBUNO_LOCAL_RESOURCES", str(tmp_path / "from-env"))
    assert LocalDirectory().root == str(tmp_path / "from-env")
    monkeypatch.delenv("REBUNO_LOCAL_RESOURCES")
    monkeypatch.chdir(tmp_path)
    assert LocalDirectory().root == str(tmp_path / ".rebuno" / "resources")
    assert LocalDirectory("rel").root == str(tmp_path / "rel")  # resolved to an absolute path


async def test_a_created_root_is_private(tmp_path: Path) -> None:
    d = LocalDirectory(tmp_path / "new-root")
    await d.create()
    assert stat.S_IMODE(os.stat(d.root).st_mode) == 0o700
    assert sorted(os.listdir(d.root)) == ["store", "tmp", "workspaces"]


# ----------------------------------------------------------------- captures


async def test_unchanged_trees_share_a_ref_and_identical_files_are_stored_once(driver: LocalDirectory) -> None:
    h, ref = await golden(driver)
    assert await driver.checkpoint(h) == ref  # unchanged: same ref, the handle still usable
    write(Path(h.path) / "copy.txt", "hi\n")  # the same bytes as hello.txt
    ref2 = await driver.checkpoint(h)
    assert ref2 != ref and len(objects(driver)) == 2
    write(Path(h.path) / "hello.txt", "changed\n")
    ref3 = await driver.checkpoint(h)
    assert len(objects(driver)) == 3 and len({ref, ref2, ref3}) == 3
    for digest in objects(driver):  # objects and manifests are read-only
        assert stat.S_IMODE(os.stat(driver.object_path(digest)).st_mode) == 0o444
    assert stat.S_IMODE(os.stat(driver.snapshot_path(ref3)).st_mode) == 0o444
    assert os.listdir(driver.tmp) == []


async def test_a_same_size_change_is_seen_by_the_next_capture(driver: LocalDirectory,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    h, _ = await driver.create()
    f = Path(h.path) / "a.txt"
    write(f, "aaaa")
    monkeypatch.setattr(capture, "RACY_NS", 0)  # cache every file written before the capture
    first = await driver.checkpoint(h)
    assert "a.txt" in h._hashes
    old = 1_600_000_000
    write(f, "bbbb")
    os.utime(f, (old, old))
    second = await driver.checkpoint(h)  # same size; the inode or ctime differs
    assert first != second
    with open(f, "r+b") as fh:  # rewrite in place: same inode and size, mtime put back
        fh.write(b"cccc")
    os.utime(f, (old, old))
    third = await driver.checkpoint(h)
    assert third not in (first, second)
    restored, _ = await driver.create(third)
    assert (Path(restored.path) / "a.txt").read_text() == "cccc"
    monkeypatch.undo()
    write(Path(h.path) / "fresh.txt", "new")
    await driver.checkpoint(h)
    assert "fresh.txt" not in h._hashes  # written within the racy window: hashed again next time


async def test_special_files_and_bad_names_fail_the_capture(driver: LocalDirectory) -> None:
    h, _ = await driver.create()
    os.mkfifo(os.path.join(h.path, "pipe"))
    with pytest.raises(ValueError, match="FIFO"):
        await driver.checkpoint(h)
    os.unlink(os.path.join(h.path, "pipe"))
    with open(os.path.join(os.fsencode(h.path), b"bad\xffname"), "wb") as f:
        f.write(b"x")
    with pytest.raises(ValueError, match="UTF-8"):
        await driver.checkpoint(h)


async def test_checkpoint_of_a_removed_workspace(driver: LocalDirectory) -> None:
    h, _ = await driver.create()
    os.rmdir(h.path)
    with pytest.raises(FileNotFoundError):
        await driver.checkpoint(h)


async def test_a_capture_writes_manifest_bytes_of_its_entries(driver: LocalDirectory,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries serialised by earlier captures are spliced into the manifest:
    the bytes must stay those of manifest_bytes, whatever the names."""
    h, _ = await driver.create()
    root = Path(h.path)
    (root / "a").mkdir()
    os.chmod(root / "a", 0o755)
    # Names that sort between "a" and "a/..." bytewise, non-ASCII ones, and
    # ones JSON escapes.
    names = ("a/x", "a-b", "a.c", "b c", "é.txt", "日本/語.txt", "𝄞", 'quo"te\\back', "new\nline", "tab\tname")
    for name in names:
        write(root / name, name)
    os.symlink("a/x", root / "l")
    (root / "e").mkdir()
    monkeypatch.setattr(capture, "RACY_NS", 0)  # cache every file, so the next capture reuses entries
    refs = [await driver.checkpoint(h)]
    assert len(h._hashes) == 10
    refs.append(await driver.checkpoint(h))
    write(root / "a-b", "changed")
    refs.append(await driver.checkpoint(h))
    assert refs[0] == refs[1] != refs[2]
    for ref in refs:
        data = Path(driver.snapshot_path(ref)).read_bytes()
        assert "sha256:" + sha(data) == ref
        assert data == manifest_bytes(json.loads(data)["entries"])


def _objects_of(driver: LocalDirectory, h: LocalDirectoryHandle) -> dict[str, str]:
    return {rel: known.obj for rel, known in h._hashes.items()}


async def test_a_capture_sees_an_object_deleted_from_the_store(driver: LocalDirectory,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Cached files' objects are checked one stat per fan-out directory; a
    removal from a directory changes its times, so the next capture checks
    that directory's objects one by one and stores the missing one again."""
    h, _ = await driver.create()
    for i in range(40):
        write(Path(h.path) / f"f{i:02d}", f"content {i}")
    # Everything counts as settled, so the first capture caches every file.
    monkeypatch.setattr(capture, "RACY_NS", -10**9)
    calls: list[str] = []
    real_is_file = capture.is_file

    def counting_is_file(path: str) -> bool:
        calls.append(path)
        return real_is_file(path)

    monkeypatch.setattr(capture, "is_file", counting_is_file)
    ref = await driver.checkpoint(h)  # stores 40 objects
    assert len(h._hashes) == 40 and h._fans == {}  # the directories it stored into are looked at afresh
    # Put the directories' mtimes far back, so that a removal is bound to change them.
    fans = {os.path.dirname(obj) for obj in _objects_of(driver, h).values()}
    for fan in fans:
        os.utime(fan, (1_000_000_000, 1_000_000_000))
    calls.clear()
    assert await driver.checkpoint(h) == ref
    assert sorted(calls) == sorted(_objects_of(driver, h).values())  # changed directories: every object checked
    assert set(h._fans) == {os.path.basename(f) for f in fans}
    calls.clear()
    assert await driver.checkpoint(h) == ref
    assert calls == []  # unchanged directories: no object stat at all

    victim = _objects_of(driver, h)["f07"]
    os.unlink(victim)
    calls.clear()
    assert await driver.checkpoint(h) == ref  # the same tree
    same_fan = sorted(obj for obj in _objects_of(driver, h).values() if os.path.dirname(obj) == os.path.dirname(victim))
    assert sorted(set(calls)) == same_fan  # only the changed directory's objects were checked
    assert Path(victim).read_bytes() == b"content 7"  # and the missing one stored again
    restored, _ = await driver.create(ref)
    assert (Path(restored.path) / "f07").read_text() == "content 7"


async def test_a_file_changed_while_captured_fails_the_capture(driver: LocalDirectory,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    h, _ = await driver.create()
    write(Path(h.path) / "a.txt", "before")
    real_read = capture.read_upto

    def read_then_append(fd: int, limit: int) -> bytes:
        data = real_read(fd, limit)
        with open(Path(h.path) / "a.txt", "ab") as f:  # another writer, just after the read
            f.write(b" and after")
        return data

    monkeypatch.setattr(capture, "read_upto", read_then_append)
    with pytest.raises(ValueError, match="changed while it was captured"):
        await driver.checkpoint(h)
    assert os.listdir(driver.tmp) == [] and objects(driver) == [] and os.listdir(driver.snapshots) == []
    monkeypatch.undo()
    ref = await driver.checkpoint(h)
    restored, _ = await driver.create(ref)
    assert (Path(restored.path) / "a.txt").read_text() == "before and after"


async def test_files_larger_than_a_chunk(driver: LocalDirectory, monkeypatch: pytest.MonkeyPatch) -> None:
    for streaming in (capture, restore):  # files over 64 bytes are streamed, as above 1 MiB
        monkeypatch.setattr(streaming, "CHUNK", 64)
    h, _ = await driver.create()
    big = bytes(range(256)) * 3
    write(Path(h.path) / "big.bin", big)
    write(Path(h.path) / "copy.bin", big)
    write(Path(h.path) / "small.txt", "small")
    ref = await driver.checkpoint(h)
    assert len(objects(driver)) == 2 and Path(driver.object_path(sha(big))).read_bytes() == big
    restored, _ = await driver.create(ref)
    assert tree(restored.path) == tree(h.path)
    Path(driver.object_path(sha(big))).chmod(0o644)
    Path(driver.object_path(sha(big))).write_bytes(big[:-1] + b"\x00")
    await assert_unavailable(driver, ref, "is damaged")


# ------------------------------------------------------------------- create


async def test_each_create_makes_a_fresh_directory(driver: LocalDirectory) -> None:
    h1, b1 = await driver.create()
    h2, b2 = await driver.create()
    assert b1 == {"path": h1.path} and b2 == {"path": h2.path} and h1.path != h2.path
    for h in (h1, h2):
        assert os.path.isabs(h.path) and os.path.dirname(h.path) == driver.workspaces
        assert os.listdir(h.path) == []


async def test_a_template_is_the_initial_environment(tmp_path: Path) -> None:
    tpl = tmp_path / "tpl"
    write(tpl / "README.md", "# hi\n", 0o600)
    write(tpl / "bin" / "run.sh", "#!/bin/sh\n", 0o755)
    os.symlink("README.md", tpl / "link")
    (tpl / "empty").mkdir()
    d = LocalDirectory(tmp_path / "res", template=tpl)
    h, _ = await d.create()
    assert tree(h.path) == tree(str(tpl))
    h2, _ = await d.create()
    assert h2.path != h.path and tree(h2.path) == tree(str(tpl))


async def test_special_permission_bits_are_left_out(driver: LocalDirectory) -> None:
    # A workspace under a set-group-ID directory hands that bit to its
    # folders: the manifest keeps the permission bits only, so the checkpoint
    # restores (a manifest mode above 0o777 is refused as damage).
    h, _ = await driver.create()
    root = Path(h.path)
    (root / "shared").mkdir()
    os.chmod(root / "shared", 0o2775)
    write(root / "shared" / "run", "#!/bin/sh\n", 0o755)
    os.chmod(root / "shared" / "run", 0o4755)
    ref = await driver.checkpoint(h)
    restored, _ = await driver.create(ref)
    assert stat.S_IMODE(os.stat(os.path.join(restored.path, "shared")).st_mode) == 0o775
    assert stat.S_IMODE(os.stat(os.path.join(restored.path, "shared", "run")).st_mode) == 0o755


async def test_a_restore_reproduces_the_checkpoint_exactly(driver: LocalDirectory) -> None:
    h, _ = await driver.create()
    root = Path(h.path)
    write(root / "a.txt", "one")
    write(root / "secret", "s", 0o600)
    write(root / "tools" / "run", "#!/bin/sh\n", 0o755)
    write(root / "data.bin", bytes(range(256)) * 10)
    (root / "empty").mkdir()
    (root / "locked").mkdir()
    write(root / "locked" / "f", "inside")
    os.chmod(root / "locked", 0o500)
    os.symlink("a.txt", root / "link")
    os.symlink("../outside", root / "dangling")
    write(root / "ünïcode name.txt", "ü")
    ref = await driver.checkpoint(h)
    expected = tree(h.path)
    write(root / "a.txt", "changed later")  # does not affect the checkpoint
    restored, binding = await driver.create(ref)
    assert restored.path != h.path and binding == {"path": restored.path}
    assert tree(restored.path) == expected
    # Copies, never links: writing a restored file leaves the store intact.
    digest = sha(b"one")
    assert os.stat(os.path.join(restored.path, "a.txt")).st_ino != os.stat(driver.object_path(digest)).st_ino
    await restored.files.write("a.txt", "edited")
    assert Path(driver.object_path(digest)).read_bytes() == b"one"
    again, _ = await driver.create(ref)
    assert tree(again.path) == expected
    assert os.listdir(driver.tmp) == []


# ----------------------------------------------------- missing or damaged


def plant(driver: LocalDirectory, doc: Any) -> str:
    """Store a hand-made manifest under its own hash; return its ref."""
    data = doc if isinstance(doc, bytes) else json.dumps(doc, separators=(",", ":")).encode()
    digest = sha(data)
    os.makedirs(driver.snapshots, exist_ok=True)
    Path(driver.snapshots, digest + ".json").write_bytes(data)
    return "sha256:" + digest


def manifest(*entries: dict[str, Any], fmt: str = "rebuno.local_directory.v1") -> dict[str, Any]:
    return {"entries": list(entries), "format": fmt}


def file_entry(path: str, digest: str | None = None, **kw: Any) -> dict[str, Any]:
    e = {"mode": 420, "path": path, "sha256": digest or sha(b"x"), "size": 1, "type": "file"}
    e.update(kw)
    return e


async def assert_unavailable(driver: LocalDirectory, ref: Any, detail: str) -> None:
    before = os.listdir(driver.workspaces) if os.path.isdir(driver.workspaces) else []
    with pytest.raises(CheckpointUnavailable) as info:
        await driver.create(ref)
    message = str(info.value)
    assert message.startswith(f"local snapshot {ref} is missing or damaged: "), message
    assert detail in message, message
    assert os.listdir(driver.workspaces) == before and os.listdir(driver.tmp) == []


@pytest.mark.parametrize("ref", ["sha256:" + "A" * 64, "sha256:abc", "md5:" + "a" * 64, "a" * 64, "",
                                 "sha256:" + "a" * 64 + "\n"])
async def test_malformed_refs(driver: LocalDirectory, ref: str) -> None:
    await driver.create()
    await assert_unavailable(driver, ref, "the ref is not")


async def test_missing_and_damaged_snapshots(driver: LocalDirectory) -> None:
    h, ref = await golden(driver)
    path = driver.snapshot_path(ref)
    data = Path(path).read_bytes()
    os.unlink(path)
    await assert_unavailable(driver, ref, "the manifest does not exist")
    Path(path).write_bytes(data.replace(b'"size":3', b'"size":4'))
    await assert_unavailable(driver, ref, "does not match its hash")
    os.unlink(path)
    Path(path).write_bytes(data)
    obj = driver.object_path(sha(b"hi\n"))
    os.unlink(obj)
    await assert_unavailable(driver, ref, "does not exist")
    Path(obj).write_bytes(b"ho\n")  # same size, other bytes
    await assert_unavailable(driver, ref, "is damaged")
    Path(obj).write_bytes(b"hi\n")
    restored, _ = await driver.create(ref)  # repaired: restorable again
    assert (Path(restored.path) / "hello.txt").read_text() == "hi\n"


@pytest.mark.parametrize("doc,detail", [
    (b"not json", "not valid JSON"),
    (manifest(fmt="other.v1"), "format"),
    ({"entries": [], "format": "rebuno.local_directory.v1", "extra": 1}, "format"),
    ({"entries": {}, "format": "rebuno.local_directory.v1"}, "not a list"),
    (manifest(file_entry("../escape")), "invalid path"),
    (manifest(file_entry("/abs")), "invalid path"),
    (manifest(file_entry("a//b")), "invalid path"),
    (manifest(file_entry("a/./b")), "invalid path"),
    (manifest(file_entry("")), "invalid path"),
    (manifest(file_entry("nul\u0000byte")), "invalid path"),
    (manifest({"path": "l", "target": "/etc", "type": "symlink"}, file_entry("l/x")), "below a symlink"),
    (manifest(file_entry("f"), file_entry("f/x")), "below a file"),
    (manifest(file_entry("f"), file_entry("f")), "duplicate path"),
    (manifest(file_entry("f", mode=0o1000)), "invalid mode"),
    (manifest(file_entry("f", mode=True)), "invalid mode"),
    (manifest(file_entry("f", digest="A" * 64)), "invalid object hash"),
    (manifest(file_entry("f", size=-1)), "invalid size"),
    (manifest({**file_entry("f"), "extra": 1}), "invalid entry"),
    (manifest({"path": "d", "type": "fifo"}), "invalid entry"),
    (manifest({"path": "d", "type": ["dir"]}), "invalid entry"),
    (manifest("not an entry"), "invalid entry"),
    (manifest({"path": "l", "target": "", "type": "symlink"}), "invalid symlink target"),
])
async def test_invalid_manifests(driver: LocalDirectory, doc: Any, detail: str) -> None:
    await driver.create()
    Path(driver.objects, sha(b"x")[:2]).mkdir(parents=True, exist_ok=True)
    Path(driver.object_path(sha(b"x"))).write_bytes(b"x")
    ref = plant(driver, doc)
    await assert_unavailable(driver, ref, detail)


async def test_a_size_mismatch_is_damage(driver: LocalDirectory) -> None:
    await driver.create()
    Path(driver.objects, sha(b"x")[:2]).mkdir(parents=True, exist_ok=True)
    Path(driver.object_path(sha(b"x"))).write_bytes(b"x")
    ref = plant(driver, manifest(file_entry("f", size=2)))
    await assert_unavailable(driver, ref, "is damaged")


# --------------------------------------------------------------- durability


def fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")


class Recorder:
    """Records fsync, rename and syncfs calls in order, and runs the real ones."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, syncfs: Callable[[int], int] | None) -> None:
        self.events: list[tuple[str, str]] = []
        self.snapshots: list[dict[str, Any]] = []  # tmp/'s tree at each syncfs
        real_fsync, real_rename, real_replace = os.fsync, os.rename, os.replace

        def fsync(fd: Any) -> None:
            self.events.append(("fsync", fd_path(fd)))
            real_fsync(fd)

        def rename(src: Any, dst: Any, **kw: Any) -> None:
            real_rename(src, dst, **kw)
            self.events.append(("rename", str(dst)))

        def replace(src: Any, dst: Any, **kw: Any) -> None:
            real_replace(src, dst, **kw)
            self.events.append(("rename", str(dst)))

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "rename", rename)
        monkeypatch.setattr(os, "replace", replace)
        if syncfs is None:
            monkeypatch.setattr(durable, "_syncfs", lambda: None)
        else:
            def recording_syncfs(fd: int) -> int:
                self.events.append(("syncfs", fd_path(fd)))
                self.snapshots.append(tree(fd_path(fd)))
                return syncfs(fd)

            monkeypatch.setattr(durable, "_syncfs", lambda: recording_syncfs)

    def index(self, kind: str, path: str) -> int:
        return self.events.index((kind, path))


def real_or_no_syncfs(fd: int) -> int:
    fn = durable._load_syncfs()
    return 0 if fn is None else fn(fd)


async def big_checkpoint(driver: LocalDirectory, n: int = 80) -> tuple[LocalDirectoryHandle, str, dict[str, Any]]:
    """A checkpoint of more files than _FSYNC_MAX and _PARALLEL_MIN."""
    h, _ = await driver.create()
    root = Path(h.path)
    for i in range(n):
        write(root / ("d1" if i % 2 else "d2") / f"f{i:03d}", f"file {i}\n" * (i + 1), 0o640 if i % 3 else 0o755)
    os.chmod(root / "d1", 0o750)
    os.symlink("d1/f001", root / "link")
    ref = await driver.checkpoint(h)
    return h, ref, tree(h.path)


@linux_only
async def test_a_restore_is_durable_before_it_is_renamed_into_place(driver: LocalDirectory,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Large trees: one syncfs once every file is written, then an fsync
    (which flushes the disk's cache after the metadata syncfs wrote), then
    the rename, then an fsync of workspaces/ for the rename."""
    _h, ref, expected = await big_checkpoint(driver)
    rec = Recorder(monkeypatch, real_or_no_syncfs)
    restored, _ = await driver.create(ref)
    assert tree(restored.path) == expected
    assert [e for e in rec.events if e[0] == "syncfs"] == [("syncfs", driver.tmp)]
    [staging] = [k for k in rec.snapshots[0] if "/" not in k]  # tmp/ held the staged tree alone
    assert {k[len(staging) + 1:]: v for k, v in rec.snapshots[0].items() if k != staging} == expected  # complete
    sync_at = rec.index("syncfs", driver.tmp)
    assert rec.events[sync_at + 1:] == [("fsync", driver.tmp), ("rename", restored.path),
                                        ("fsync", driver.workspaces)]


@linux_only
async def test_without_syncfs_a_restore_fsyncs_every_file_and_directory(driver: LocalDirectory,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _h, ref, expected = await big_checkpoint(driver)
    rec = Recorder(monkeypatch, None)
    restored, _ = await driver.create(ref)
    assert tree(restored.path) == expected
    renamed = rec.index("rename", restored.path)
    assert rec.events[renamed + 1:] == [("fsync", driver.workspaces)]
    before = {path for kind, path in rec.events[:renamed] if kind == "fsync"}
    [name] = {p[len(driver.tmp) + 1:].split("/")[0] for p in before if p.startswith(driver.tmp + "/")}
    staging = os.path.join(driver.tmp, name)
    assert {staging} | {os.path.join(staging, rel) for rel, v in expected.items() if v[0] != "symlink"} <= before


@linux_only
async def test_a_capture_stores_durably_before_it_refers(driver: LocalDirectory,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Temp files are durable before they are renamed into the store, and
    the renames before the ref is returned: by fsync for a few files, by
    syncfs for many."""
    h, ref, _expected = await big_checkpoint(driver, n=4)
    write(Path(h.path) / "d1" / "f001", "changed")
    fan = os.path.dirname(driver.object_path(sha(b"changed")))
    new_fan = not os.path.isdir(fan)  # then its entry in objects/ is made durable too
    rec = Recorder(monkeypatch, real_or_no_syncfs)
    ref = await driver.checkpoint(h)
    renames = [i for i, (kind, _p) in enumerate(rec.events) if kind == "rename"]
    assert [rec.events[i][1] for i in renames] == [driver.object_path(sha(b"changed")), driver.snapshot_path(ref)]
    temp_fsyncs = [i for i, (kind, p) in enumerate(rec.events) if kind == "fsync" and os.path.dirname(p) == driver.tmp]
    assert len(temp_fsyncs) == 2 and max(temp_fsyncs) < min(renames)
    assert rec.events[max(renames) + 1:] == [("fsync", d) for d in sorted([fan, driver.snapshots] +
                                                                          ([driver.objects] if new_fan else []))]
    assert not [e for e in rec.events if e[0] == "syncfs"]

    rec.events.clear()
    for i in range(20):
        write(Path(h.path) / "new" / f"n{i}", f"new {i}")
    ref = await driver.checkpoint(h)
    renames = [i for i, (kind, _p) in enumerate(rec.events) if kind == "rename"]
    assert len(renames) == 21 and rec.events[renames[-1]] == ("rename", driver.snapshot_path(ref))
    assert rec.events[:2] == [("syncfs", driver.tmp), ("fsync", driver.tmp)] and min(renames) == 2
    assert rec.events[max(renames) + 1:] == [("syncfs", driver.tmp), ("fsync", driver.tmp)]
    assert os.listdir(driver.tmp) == []


def failing_syncfs(err: int) -> Callable[[int], int]:
    def syncfs(fd: int) -> int:
        ctypes.set_errno(err)
        return -1
    return syncfs


async def test_a_syncfs_error_fails_the_call(driver: LocalDirectory, monkeypatch: pytest.MonkeyPatch) -> None:
    h, ref, _expected = await big_checkpoint(driver)
    for i in range(20):
        write(Path(h.path) / "new" / f"n{i}", f"new {i}")
    before = objects(driver)
    monkeypatch.setattr(durable, "_syncfs", lambda: failing_syncfs(errno.EIO))
    with pytest.raises(OSError, match="syncfs"):
        await driver.create(ref)
    with pytest.raises(OSError, match="syncfs"):
        await driver.checkpoint(h)
    assert os.listdir(driver.workspaces) == [os.path.basename(h.path)] and os.listdir(driver.tmp) == []
    assert objects(driver) == before
    monkeypatch.undo()
    ref2 = await driver.checkpoint(h)
    assert ref2 != ref and len(objects(driver)) == len(before) + 20


async def test_a_refused_syncfs_falls_back_to_fsync(driver: LocalDirectory, monkeypatch: pytest.MonkeyPatch) -> None:
    _h, ref, expected = await big_checkpoint(driver)
    monkeypatch.setattr(durable, "_syncfs_refused", False)
    monkeypatch.setattr(durable, "_load_syncfs", lambda: failing_syncfs(errno.ENOSYS))
    restored, _ = await driver.create(ref)
    assert tree(restored.path) == expected
    assert durable._syncfs_refused and durable._syncfs() is None


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o027, 0o077])
async def test_restored_modes_do_not_depend_on_the_umask(driver: LocalDirectory, umask: int) -> None:
    """Files are created with their mode and fixed only when the umask took
    bits away: the result is the captured mode either way."""
    _h, ref, expected = await big_checkpoint(driver)
    old = os.umask(umask)
    try:
        if sys.platform.startswith("linux"):
            assert restore._umask() == umask
        restored, _ = await driver.create(ref)
    finally:
        os.umask(old)
    assert tree(restored.path) == expected


async def test_an_unreadable_umask_still_restores_modes(driver: LocalDirectory, monkeypatch: pytest.MonkeyPatch) -> None:
    _h, ref, expected = await big_checkpoint(driver)
    monkeypatch.setattr(restore, "_umask", lambda: None)
    old = os.umask(0o077)
    try:
        restored, _ = await driver.create(ref)
    finally:
        os.umask(old)
    assert tree(restored.path) == expected


async def test_a_folder_at_an_objects_path_is_a_missing_object(driver: LocalDirectory) -> None:
    _h, ref = await golden(driver)
    obj = Path(driver.object_path(sha(b"hi\n")))
    obj.unlink()
    obj.mkdir()
    await assert_unavailable(driver, ref, "does not exist")


async def test_bytes_past_an_objects_size_are_not_restored(driver: LocalDirectory) -> None:
    """What is restored is what the hash names; trailing bytes are never read."""
    _h, ref = await golden(driver)
    obj = Path(driver.object_path(sha(b"hi\n")))
    obj.chmod(0o644)
    obj.write_bytes(b"hi\ntrailing")
    restored, _ = await driver.create(ref)
    assert (Path(restored.path) / "hello.txt").read_bytes() == b"hi\n"


async def test_a_damaged_object_among_many_fails_the_restore(driver: LocalDirectory) -> None:
    _h, ref, _expected = await big_checkpoint(driver)
    victim = Path(driver.object_path(sha(b"file 40\n" * 41)))
    victim.chmod(0o644)
    victim.write_bytes(victim.read_bytes().replace(b"file", b"FILE"))
    await assert_unavailable(driver, ref, "is damaged")


@linux_only
async def test_staged_workspaces_are_spread_over_the_disk(driver: LocalDirectory) -> None:
    """tmp/ asks ext2/3/4 to place each staged workspace on its own (chattr +T)."""
    import array
    import fcntl
    import platform

    numbers = durable._FS_IOC_FLAGS.get(platform.machine())
    if numbers is None:
        pytest.skip("no FS_IOC_GETFLAGS number for this machine")
    await driver.create()
    fd = os.open(driver.tmp, os.O_RDONLY)
    try:
        flags = array.array("i", [0])
        try:
            fcntl.ioctl(fd, numbers[0], flags, True)
        except OSError:
            pytest.skip("the filesystem has no inode flags")
    finally:
        os.close(fd)
    probe = Path(driver.root) / "probe"
    probe.mkdir()
    durable.spread_subdirectories(str(probe))
    fd = os.open(probe, os.O_RDONLY)
    try:
        probe_flags = array.array("i", [0])
        fcntl.ioctl(fd, numbers[0], probe_flags, True)
    finally:
        os.close(fd)
    if not probe_flags[0] & durable._FS_TOPDIR_FL:
        pytest.skip("the filesystem does not keep FS_TOPDIR_FL")
    assert flags[0] & durable._FS_TOPDIR_FL


# --------------------------------------------------------------------- open


async def test_open(driver: LocalDirectory) -> None:
    h, binding = await driver.create()
    again = await driver.open(binding)
    assert isinstance(again, LocalDirectoryHandle) and again.path == h.path
    os.rmdir(h.path)
    with pytest.raises(FileNotFoundError):
        await driver.open(binding)
    with pytest.raises(ValueError):
        await driver.open({"sandbox_id": "x"})


async def test_open_removes_writes_a_crash_cut_short(driver: LocalDirectory) -> None:
    # A kill -9 between a write's temporary file and its rename leaves the
    # temporary file; the reopened workspace must not keep it (nor capture it).
    h, binding = await driver.create()
    await h.files.write("deep/notes.txt", "kept")
    left = [_temp_path(h.path, "a.txt"), _temp_path(os.path.join(h.path, "deep"), "notes.txt")]
    users = [os.path.join(h.path, n) for n in (".a.txt.rebuno-tmp", "b.rebuno-tmp", ".a.txt.1234.rebuno-tmp")]
    for p in left + users:
        with open(p, "w") as f:
            f.write("x")
    await driver.open(binding)
    assert not any(os.path.exists(p) for p in left)
    assert all(os.path.exists(p) for p in users)
    assert await h.files.read("deep/notes.txt") == "kept"


# -------------------------------------------------------------------- files


async def test_files_api(driver: LocalDirectory) -> None:
    h, _ = await driver.create()
    files = h.files
    await files.write("notes.txt", "héllo")
    await files.write("/deep/er/data.bin", b"\x00\x01")
    assert await files.read("notes.txt") == "héllo"
    assert await files.read("/notes.txt", format="bytes") == "héllo".encode()
    assert await files.read("deep/er/data.bin", format="bytes") == b"\x00\x01"
    assert await files.read("deep/../notes.txt") == "héllo"  # a '..' that stays inside is fine
    assert await files.list() == ["deep", "notes.txt"] and await files.list("/deep") == ["er"]
    assert await files.exists("notes.txt") and not await files.exists("nope.txt")
    assert await files.make_dir("made/sub") is True and await files.make_dir("made/sub") is False
    os.chmod(os.path.join(h.path, "notes.txt"), 0o600)
    await files.write("notes.txt", "again")  # atomic replace keeps the mode
    assert stat.S_IMODE(os.stat(os.path.join(h.path, "notes.txt")).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.join(h.path, "deep/er/data.bin")).st_mode) == 0o644
    await files.remove("made")
    await files.remove("notes.txt")
    assert await files.list() == ["deep"]
    assert [n for n in os.listdir(os.path.join(h.path, "deep", "er")) if "rebuno-tmp" in n] == []
    with pytest.raises(FileNotFoundError):
        await files.read("notes.txt")
    with pytest.raises(FileNotFoundError):
        await files.remove("notes.txt")
    with pytest.raises(ValueError):
        await files.read("deep/er/data.bin", format="stream")
    with pytest.raises(TypeError):
        await files.write("x", 5)  # type: ignore[arg-type]


async def test_files_stay_inside_the_workspace(tmp_path: Path, driver: LocalDirectory) -> None:
    h, _ = await driver.create()
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    os.symlink(str(outside), os.path.join(h.path, "escape"))
    os.symlink(str(tmp_path), os.path.join(h.path, "updir"))
    for call in (lambda: h.files.read("../../../outside.txt"), lambda: h.files.read("escape"),
                 lambda: h.files.write("escape", "x"), lambda: h.files.write("updir/new.txt", "x"),
                 lambda: h.files.list("updir"), lambda: h.files.exists("/../x"), lambda: h.files.remove("/"),
                 lambda: h.files.write("..", "x")):
        with pytest.raises(PermissionError):
            await call()
    assert outside.read_text() == "secret" and not (tmp_path / "new.txt").exists()
