"""The wire test vectors of docs/protocol/vectors, the one set that the Go,
Python and TypeScript tests all read, so that the three cannot drift apart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DIR = Path(__file__).resolve().parents[3] / "docs" / "protocol" / "vectors"


def load(name: str) -> Any:
    """One vectors file, parsed (`canonical-json`, `step-ids`, `signatures`, `local-directory`,
    `carried-outcomes`)."""
    return json.loads((DIR / f"{name}.json").read_text(encoding="utf-8"))
