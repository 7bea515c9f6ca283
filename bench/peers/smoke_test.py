"""Smoke test of the peers benchmark (`make bench-peers-smoke`; not part of
`make test`, because it downloads the peers): run.py --quick against every
system, then check that each one was measured — its executions completed
(every client checks each result), every process it involves used CPU, and
its durable writes reached the disk (fsyncs counted)."""

import json
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROLES = {
    "rebuno-py": {"kernel", "agent", "client"},
    "rebuno-ts": {"kernel", "agent", "client"},
    "restate-ts": {"server", "service", "client"},
    "restate-py": {"server", "service", "client"},
    "dbos-ts": {"app", "postgres"},
    "dbos-py": {"app"},
}


class PeersSmokeTest(unittest.TestCase):
    def test_every_system_is_measured(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "peers.json"
            subprocess.run([sys.executable, str(HERE / "run.py"), "--quick", "--json", str(out)], check=True)
            report = json.loads(out.read_text())
        self.assertEqual(set(report["results"]), set(ROLES))
        for system, rounds in report["results"].items():
            with self.subTest(system=system):
                self.assertEqual(len(rounds), 1)
                windows = list(rounds[0].values())
                for window in windows:
                    self.assertGreater(window["seconds"], 0)
                    self.assertEqual(set(window["cpu"]), ROLES[system])
                    self.assertGreater(window["fsyncs"], 0)
                for role in ROLES[system]:  # CPU is read in clock ticks: both windows together
                    self.assertGreater(sum(w["cpu"][role] for w in windows), 0, role)


if __name__ == "__main__":
    unittest.main()
