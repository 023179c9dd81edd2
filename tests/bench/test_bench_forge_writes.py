"""The forge-writes benchmark at its smallest: what it counts holds (never how fast it is)."""

from __future__ import annotations

import pytest

from tests.bench import bench_forge_writes

pytestmark = pytest.mark.slow


def test_one_run_counts_three_writes_per_object_and_more_for_the_previous_protocol() -> None:
    new, old = bench_forge_writes.bench(runs=1, spacing=0.0, old=True)

    assert {label: s.writes for label, s in new.items()} == {
        "ticket comment": [3],
        "ticket issue": [3],
        "keyed comment": [3],
        "branch push": [1],
        "draft PR": [1],
    }
    assert all(len(s.seconds) == 1 and s.seconds[0] > 0 for s in new.values())
    # The previous protocol is read from history in a full clone; when it is, it wrote more per object.
    if old is not None:
        assert all(old[label].writes[0] > 3 for label in ("ticket comment", "ticket issue", "keyed comment"))
