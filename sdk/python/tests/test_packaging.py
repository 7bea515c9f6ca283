"""The package's requirements: compatible ranges for a library installed beside
other libraries, while the test lock pins an exact version inside each range."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

SDK = Path(__file__).resolve().parents[1]


def _locked() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (SDK / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin"
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_requirements_are_ranges_and_the_lock_pins_inside_them() -> None:
    project = tomllib.loads((SDK / "pyproject.toml").read_text())["project"]
    extras = [r for group in project["optional-dependencies"].values() for r in group]
    locked = _locked()
    for text in project["dependencies"] + extras:
        req = Requirement(text)
        assert {s.operator for s in req.specifier} == {">=", "<"}, f"{text}: not a compatible range"
        assert locked[canonicalize_name(req.name)] in req.specifier, f"{text}: the locked version is outside it"
