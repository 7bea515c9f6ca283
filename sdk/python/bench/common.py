"""What the SDK's benchmarks share: the percentile they report and the
kernel binary they start."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def pct(values: list[float], p: float) -> float:
    """The p-th percentile of values (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def use_kernel(binary: str | None) -> None:
    """Point the test harness at the kernel to start: `binary`, else
    `$REBUNO_BIN`, else the repository's `bin/rebuno` when it was built."""
    if binary:
        os.environ["REBUNO_BIN"] = binary
    elif not os.environ.get("REBUNO_BIN"):
        default = REPO / "bin" / "rebuno"
        if default.exists():
            os.environ["REBUNO_BIN"] = str(default)
