"""Reading a reproduction's log back: pairing checks with their stored screenshots, and naming moments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evidence.bundle import RevisionEvidence
from evidence.interface import ArtifactKind
from evidence.local import LocalArtifactStore
from evidence.observations import moment_of, read_observations, screenshot_named


@pytest.mark.parametrize(
    ("name", "key", "label"),
    [
        ("reproduce-base-run-1-step-3.png", "run-1-step-3.png", "run 1: after step 3"),
        ("reproduce-candidate-2-run-2-step-1-failed.png", "run-2-step-1-failed.png", "run 2: step 1 failed"),
        ("reproduce-base-run-1-assert-2.png", "run-1-assert-2.png", "run 1: check 2"),
        ("run-10-assert-1-element.png", "run-10-assert-1-element.png", "run 10: check 1, the element it read"),
        ("base-total.png", "base-total.png", "base-total.png"),
    ],
)
def test_a_screenshot_is_named_by_the_moment_the_runner_took_it(name: str, key: str, label: str) -> None:
    moment = moment_of(name)
    assert (moment.key, moment.label) == (key, label)


def test_a_check_is_paired_with_its_own_screenshots_behind_any_prefix(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    names = [f"reproduce-base-{n}" for n in ("run-11-assert-1.png", "run-1-assert-11.png", "run-1-assert-1.png")]
    refs = [
        store.put_bytes(name.encode(), kind=ArtifactKind.SCREENSHOT, run_id="r", name=name, media_type="image/png")
        for name in names
    ]
    found = screenshot_named(refs, "run-1-assert-1.png")
    assert found is not None and found.name == "reproduce-base-run-1-assert-1.png"
    assert screenshot_named(refs, "run-1-assert-2.png") is None
    assert screenshot_named(refs, None) is None


def test_fields_of_the_wrong_type_are_ignored_not_trusted(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    log = {
        "runs": [
            {"run": 1, "outcome": {"bug_present": True, "assertions": [{"index": 0, "holds": "yes", "actual": 42}]}},
            {"run": "2", "outcome": {}},
            "not a run",
        ]
    }
    ref = store.put_bytes(json.dumps(log).encode(), kind=ArtifactKind.LOG, run_id="r", name="log.json")
    observations = read_observations(RevisionEvidence.from_refs("base", "b", "reproduced", [ref]), store)

    assert observations.runs == [1]
    (seen,) = observations.for_check(0)
    assert (seen.run, seen.holds, seen.actual, seen.run_bug_present) == (1, None, None, True)
