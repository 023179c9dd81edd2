"""The critical-path benchmark at its smallest size: what it measures is real (never how fast it is).

One run of each project (the sample app, the npm and the pip test projects) on one stack: each run awaited
review with exactly one PR from its branch on the forge, a draft, after the forge received writes; the
draft PR came before awaiting review and the phases add up to the run's time; every part of the floor took time
(setup only where the recipe has some: the sample app's has none), and the floor's reproduction found the bug,
as the run's did.
"""

from __future__ import annotations

import asyncio
import math
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.bench import bench_critical_path as bench
from tests.conftest import require

pytestmark = [pytest.mark.slow, pytest.mark.browser]  # and `bench`, as every test under tests/bench/


@pytest.mark.timeout(3600)  # three whole runs and their floors on a busy two-core host; it asserts no timing
def test_each_project_awaits_review_with_one_draft_pr_and_every_floor_part_took_time() -> None:
    for tool in ("git", "chromium", "node", "npm"):
        require(shutil.which(tool) is not None, f"{tool} is not installed")
    with (
        tempfile.TemporaryDirectory(prefix="durafix-bench-critical-") as tmp,
        bench.bench_stack(Path(tmp), bench.SPACING_DEFAULT) as stack,
    ):
        results = asyncio.run(bench.on_stack(stack, 1, bench.PROJECTS, bench.SPACING_DEFAULT, Path(tmp), warm=False))

    assert [m.project for m in results] == list(bench.PROJECTS)
    for m in results:
        assert m.pending_pr, f"{m.project}: the run did not await review"
        assert (m.open_prs, m.draft_prs) == (1, 1), m
        # The ticket, the branch's push and the draft PR at least: more than the label the bench added.
        assert m.writes >= 3 and m.writes_by_kind["push"] >= 1, m
        assert 0 < m.to_draft_pr_s < m.to_awaiting_review_s, m
        assert m.phases["label -> run started (webhook)"] > 0, m
        assert "publish" in m.phases and "repair" in m.phases, m.phases
        assert math.isclose(sum(m.phases.values()), m.to_awaiting_review_s, abs_tol=0.01), m
        floor = m.floor
        assert floor.reproduced, m
        assert floor.tests_s > 0 and floor.app_start_s > 0 and floor.procedure_s > 0, floor
        assert floor.forge_s == m.writes * bench.SPACING_DEFAULT > 0, floor
        if m.project == "cart":
            assert not floor.has_setup
        else:
            assert floor.has_setup and floor.setup_cold_s > 0 and floor.setup_warm_s > 0, floor
        assert m.ratio > 0
