"""``env.reproduction_seed`` on real git: a test reproduction's files become the patch repair starts from, and a
link in the repository never carries a write outside the workspace."""

from __future__ import annotations

from pathlib import Path

from temporalio.testing import ActivityEnvironment

from environments.reproduction import parse_reproduction, stored_form
from environments.workspace import WorkspaceManager
from evidence.interface import ArtifactKind, ArtifactRef
from evidence.local import LocalArtifactStore
from pipeline.activities.reproduction_seed import ReproductionSeedActivities
from pipeline.steps import ReproductionSeedInput, ReproductionSeedResult
from reviews.git_credentials import NO_GIT_CREDENTIALS
from tests.support.agent_steps import spec_of
from tests.support.gitrepo import Repo, git, make_repo

RUN = "repair:shop/cart#24"
TEST_REPRO = """\
version: 1
kind: test
name: the cart total counts quantities
files:
  tests/test_issue_24.py: |
    from cart import total

    def test_quantities_count():
        assert total([("tea", 2, 5.0)]) == 10.0
tests:
  - tests/test_issue_24.py
"""
COMMAND_REPRO = """\
version: 1
kind: command
name: total
files:
  repro/show.py: print(1)
steps:
  - run: python3 repro/show.py
bug_present:
  - {check: stdout, equals: "1"}
"""


def seed(tmp_path: Path, repo: Repo, reproduction: str) -> tuple[ReproductionSeedResult, LocalArtifactStore]:
    store = LocalArtifactStore(tmp_path / "evidence")
    workspaces = WorkspaceManager(cache_dir=tmp_path / "cache", root=tmp_path / "workspaces")
    acts = ReproductionSeedActivities(store, workspaces, NO_GIT_CREDENTIALS)
    procedure_ref = store.put_bytes(
        stored_form(parse_reproduction(reproduction)), kind=ArtifactKind.PROCEDURE, run_id=RUN, name="procedure.json"
    )
    inp = ReproductionSeedInput(
        run_id=RUN, op_id=f"{RUN}:reproduction-seed", spec_ref=spec_of(store, repo, RUN), procedure_ref=procedure_ref
    )
    result = ActivityEnvironment().run(acts.reproduction_seed, inp)
    # The scratch workspace is removed (its lock files stay, as every workspace's do).
    assert [p for p in (tmp_path / "workspaces").glob("*/*") if p.is_dir()] == []
    return result, store


def test_a_test_reproduction_s_files_become_a_patch_that_applies_on_the_base(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")

    result, store = seed(tmp_path, repo, TEST_REPRO)

    assert (result.files, result.tests, result.refused) == (["tests/test_issue_24.py"], ["tests/test_issue_24.py"], "")
    assert isinstance(result.patch_ref, ArtifactRef)
    assert (result.patch_ref.kind, result.patch_ref.name) == (ArtifactKind.PATCH, "reproduction-seed.patch")
    patch = store.read_bytes(result.patch_ref).decode()
    checkout = tmp_path / "checkout"
    git("clone", "-q", repo.url, str(checkout))
    git("apply", "--index", "-", cwd=checkout, stdin=patch)
    written = (checkout / "tests" / "test_issue_24.py").read_text()
    assert written == parse_reproduction(TEST_REPRO).files["tests/test_issue_24.py"]  # type: ignore[union-attr]
    # The same reproduction on the same base: the same patch, stored once.
    again, _ = seed(tmp_path, repo, TEST_REPRO)
    assert again.patch_ref == result.patch_ref


def test_command_and_fileless_test_reproductions_seed_nothing(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    fileless = "version: 1\nkind: test\nname: t\ntests: [tests/test_cart.py]\n"

    assert seed(tmp_path / "a", repo, COMMAND_REPRO)[0] == ReproductionSeedResult()
    assert seed(tmp_path / "b", repo, fileless)[0] == ReproductionSeedResult()
    assert not (tmp_path / "a" / "workspaces").exists()  # nothing was checked out


def test_a_tests_directory_that_links_outside_gets_no_file_written_through_it(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    repo = make_repo(tmp_path / "repo")
    # Committed as a link: every checkout of the base holds it.
    git("rm", "-q", "-r", "tests", cwd=repo.work)
    (repo.work / "tests").symlink_to(outside)
    git("add", "tests", cwd=repo.work)
    git("commit", "-q", "-m", "tests live elsewhere", cwd=repo.work)
    git("push", "-q", "origin", "HEAD:main", cwd=repo.work)
    repo.base = git("rev-parse", "HEAD", cwd=repo.work)

    result, _ = seed(tmp_path, repo, TEST_REPRO)

    assert result.patch_ref is None and result.files == []
    assert result.refused.startswith("not written: tests/test_issue_24.py"), result.refused
    assert list(outside.iterdir()) == []
