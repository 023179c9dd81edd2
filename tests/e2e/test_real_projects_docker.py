"""The real-project tests (:mod:`tests.e2e.test_real_projects`) with the Docker provider: the npm and pip projects
onboarded, their first report merged and their second ended honestly, with the app, setup and tests in containers
on the stack's own engine. Setup is real: ``npm ci`` and ``pip install`` from the registries, in setup containers
whose one way out is the egress proxy, trusting the worker's CA bundle through the image's CA layer (on a host
behind a TLS-inspecting proxy they fail without it).

What is asserted beyond the shared flow is read from the worker's state and the evidence store: the first
provision's image build log (the CA layer, the registry reached through the egress proxy, setup's commands run),
the later builds reusing the CA layer and setup's result (no setup command ran again: the baseline's and the
candidate's checks, and the second run's environment), and nothing in the local dependency cache.

Expensive (two image builds with real installs, two whole runs per project): marked ``real_docker``, left out of
``make test`` and run by ``make test-docker-real``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from environments.docker.images import base_recipe
from environments.files import path_key
from environments.interface import AppRecipe
from environments.run_dirs import RunDirs
from pipeline.ids import op_id
from pipeline.services import Services
from tests.e2e.test_real_projects import checks_logs, entries_of, merge_then_find_fixed
from tests.support.docker import docker_e2e_stack
from tests.support.e2e_stack import E2EStack
from tests.support.real_projects import PROJECTS, Project, model_script

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.docker, pytest.mark.real_docker]

# Where each project's setup reaches: npm's registry, or PyPI's index and file host.
REGISTRIES = {"tally": ["registry.npmjs.org:443"], "leaderboard": ["pypi.org:443", "files.pythonhosted.org:443"]}


def recipe_of(project: Project) -> AppRecipe:
    """The recipe the project's history commits."""
    [text] = [files["durafix.yaml"] for _, files in project.commits if "durafix.yaml" in files]
    return AppRecipe.model_validate(yaml.safe_load(text))


@pytest.fixture(scope="module")
def docker_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2EStack]:
    """One embedded stack on its own Docker engine for both projects, answering from their model script."""
    images = [base_recipe(recipe_of(project)) for project in PROJECTS]
    with docker_e2e_stack(tmp_path_factory, model_script, images) as e2e:
        e2e.spawn_worker()
        yield e2e


def image_log(stack: E2EStack, run_id: str, label: str) -> str:
    """The image build log the Docker provider kept for the run's environment ``label`` (first attempt)."""
    runs = RunDirs(stack.state_dir / "environments" / "runs")
    return (runs.run_dir(run_id) / f"{path_key(op_id(run_id, label, 1))}.image.log").read_text()


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("project", PROJECTS, ids=lambda p: p.name)
async def test_on_docker_an_onboarded_project_merges_a_fix_then_finds_the_report_again_fixed(
    docker_stack: E2EStack, project: Project, tmp_path: Path
) -> None:
    stack = docker_stack
    done = await merge_then_find_fixed(stack, project, tmp_path)
    assert done.merged.environment is not None and done.merged.environment.provider == "docker"

    # The first provision built the app image: the CA layer (added, or reused from the other project's build on
    # the same base), then setup in setup containers that reached the registry through the egress proxy.
    first = image_log(stack, done.wf, "env-base")
    assert "# trust: adding CA bundle " in first or "# trust: reusing CA layer " in first, first
    for registry in REGISTRIES[project.name]:
        assert f"# egress: reached {registry}" in first, first
    assert all(f"$ {command}" in first for command in done.recipe.setup), first
    # Later builds reused the CA layer and setup's result: no setup command ran again, neither for the baseline's
    # and the candidate's checks nor for the second run's environment on the moved main.
    for log in [*checks_logs(stack, done.merged), image_log(stack, done.wf2, "env-base")]:
        assert "# trust: reusing CA layer durafix/trust:" in log, log
        assert not any(f"$ {command}" in log for command in done.recipe.setup), log
    cache = Services(stack.config).setup.cache
    assert cache is not None and entries_of(cache, done.repository) == []
