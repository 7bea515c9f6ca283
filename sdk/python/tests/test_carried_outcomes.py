"""Carried outcomes on the wire (docs/protocol/steps.md §13): the bodies the
SDK writes match docs/protocol/vectors/carried-outcomes.json byte for byte
(the TypeScript SDK's tests read the same file)."""

from __future__ import annotations

from typing import Any

import pytest

from rebuno._kernel import Outcome, finish_body
from rebuno.execution import submit_body

from .vectors import load

CASES = load("carried-outcomes")["cases"]


def _outcome(o: dict[str, Any]) -> Outcome:
    return Outcome(o["step_id"], o["succeeded"], o["value"], o["captures"], o["capture_failures"])


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_carrier_bodies_match_the_vectors(case: dict[str, Any]) -> None:
    outcome = _outcome(case["outcome"])
    if case["carrier"] == "submit":
        s = case["submit"]
        body = submit_body(s["kind"], s["target"], s["args"], s["idempotency"], s["resources"]) + outcome.carried() + "}"
    elif case["carrier"] == "complete":
        body = finish_body(output_json=case["output"], carried=outcome)
    else:
        body = finish_body(reason=case["reason"], carried=outcome)
    assert body == case["body"]


def test_an_outcome_alone_has_the_members_it_would_carry() -> None:
    o = _outcome(CASES[1]["outcome"])
    carried = o.carried()
    assert carried == ',"outcome":{"step_id":"' + o.step_id + '",' + o.members() + "}"
    assert o.members().startswith('"error":')
