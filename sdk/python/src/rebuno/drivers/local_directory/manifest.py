"""The manifest of a snapshot: one JSON document listing every directory, file
and symlink of a tree, whose SHA-256 is the checkpoint ref.

Its bytes are fixed (keys sorted, no whitespace, non-ASCII raw, entries in
UTF-8 path order), so an unchanged tree always yields the same ref; a test
holds them to a golden vector.
"""

from __future__ import annotations

import json
import re
from typing import Any

# A manifest records the permission bits of an entry and nothing else: set-user-ID, set-group-ID
# and sticky bits describe the machine the tree came from, not the tree, and a restore never sets them.
PERMISSION_BITS = 0o777

__all__ = ["FORMAT", "REF", "Damaged", "manifest_bytes", "entry_bytes", "assemble", "utf8_name", "parse_manifest"]

FORMAT = "rebuno.local_directory.v1"
REF = re.compile(r"sha256:([0-9a-f]{64})")
_HEX = re.compile(r"[0-9a-f]{64}")
# The manifest around its entries: manifest_bytes with the entries spliced
# in, so that entries serialised by earlier captures can be reused.
_MANIFEST_HEAD = b'{"entries":['
_MANIFEST_TAIL = b'],"format":' + json.dumps(FORMAT).encode("utf-8") + b"}"

_ENTRY_KEYS = {
    "dir": {"mode", "path", "type"},
    "file": {"mode", "path", "sha256", "size", "type"},
    "symlink": {"path", "target", "type"},
}


class Damaged(Exception):
    """A snapshot that cannot be restored exactly (turned into CheckpointUnavailable)."""


def manifest_bytes(entries: list[dict[str, Any]]) -> bytes:
    """The manifest of a tree: keys sorted, no whitespace, non-ASCII raw,
    entries sorted by the UTF-8 bytes of their paths."""
    ordered = sorted(entries, key=lambda e: str(e["path"]).encode("utf-8"))
    doc = {"entries": ordered, "format": FORMAT}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def entry_bytes(entry: dict[str, Any]) -> bytes:
    """One entry exactly as manifest_bytes writes it inside the list."""
    return json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def assemble(parts: list[tuple[bytes, bytes]]) -> bytes:
    """The manifest of (UTF-8 path, serialised entry) pairs: the same bytes as
    manifest_bytes of the entries (a test holds the two together)."""
    parts.sort()
    return _MANIFEST_HEAD + b",".join([entry for _path, entry in parts]) + _MANIFEST_TAIL


def utf8_name(name: str, where: str) -> None:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{where}: file name is not valid UTF-8: {name!r}") from None


def parse_manifest(data: bytes) -> list[dict[str, Any]]:
    """Validate a manifest: its format, and every entry's shape, path, hash
    and mode; no entry may lie below a symlink or a file."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise Damaged("the manifest is not valid JSON") from None
    if not isinstance(doc, dict) or set(doc) != {"entries", "format"} or doc["format"] != FORMAT:
        raise Damaged(f"the manifest is not in the {FORMAT} format")
    entries = doc["entries"]
    if not isinstance(entries, list):
        raise Damaged("the manifest's entries are not a list")
    types: dict[str, str] = {}
    for e in entries:
        kind = e.get("type") if isinstance(e, dict) else None
        keys = _ENTRY_KEYS.get(kind) if isinstance(kind, str) else None
        if keys is None or e.keys() != keys:
            raise Damaged(f"invalid entry {e!r}")
        path = e["path"]
        if not isinstance(path, str) or not _valid_path(path):
            raise Damaged(f"invalid path {path!r}")
        if path in types:
            raise Damaged(f"duplicate path {path!r}")
        types[path] = e["type"]
        if kind in ("dir", "file"):
            mode = e["mode"]
            if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= PERMISSION_BITS:
                raise Damaged(f"invalid mode {mode!r} of {path!r}")
        if kind == "file":
            if not isinstance(e["sha256"], str) or _HEX.fullmatch(e["sha256"]) is None:
                raise Damaged(f"invalid object hash of {path!r}")
            size = e["size"]
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise Damaged(f"invalid size of {path!r}")
        elif kind == "symlink":
            target = e["target"]
            if not isinstance(target, str) or not target or "\x00" in target:
                raise Damaged(f"invalid symlink target of {path!r}")
    for path in types:
        # Up to the nearest listed ancestor: that one's own ancestors are checked in its turn.
        i = path.rfind("/")
        while i > 0:
            above = types.get(path[:i])
            if above is not None:
                if above != "dir":
                    raise Damaged(f"{path!r} lies below a {above}")
                break
            i = path.rfind("/", 0, i)
    return entries


def _valid_path(path: str) -> bool:
    if not path or path[0] == "/" or "\x00" in path:
        return False
    segments = path.split("/")
    return "" not in segments and "." not in segments and ".." not in segments
