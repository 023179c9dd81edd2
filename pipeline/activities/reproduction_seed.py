"""The environments queue's steps on a run's reproduction that need its checkout, and run nothing of it.

``env.draft_context``: what a drafter of a reproduction is told (the kinds the recipe can run, and the
repository's top-level entries and test files at the base revision, by name: no file of the checkout is read or
run; the names are listed by a git of the worker's own, :func:`environments.git.isolated_git`). Idempotent.

``env.reproduction_seed``: a test reproduction's files as the patch repair starts from.

A ``test`` reproduction (reported, or drafted from the report's prose) may write its test files with ``files``.
For the repair to keep that test (its candidate, its pull request, and the regression proof, which runs the
patch's test files on the base and on the candidate: :mod:`environments.regression`), the files are written
into a fresh workspace at the base revision and the change is stored as a patch; every repair attempt that
would start from nothing starts from it.

The files are untrusted (a report or a model wrote them) and so is the checkout they land in (a repository may
hold a link where a file is to be written): they are written with
:func:`environments.untrusted_files.write_beneath`, which follows no link. A file whose path a link or a
non-directory blocks is not written; the step then seeds nothing and says why (``refused``), and the run goes
on without a seed. Paths were already held to plain relative paths outside ``.git`` when the reproduction
was validated (:mod:`environments.reproduction`).

Idempotent: the same reproduction on the same base gives the same patch, stored by content. Nothing is run:
the reproduction's commands and tests run only in the sandbox, in their own steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from temporalio import activity

from environments.git import isolated_git
from environments.reproduction import TestProcedure, load_reproduction
from environments.untrusted_files import UntrustedFileError, write_beneath
from environments.workspace import WorkspaceManager
from evidence.interface import ArtifactStore
from pipeline import steps
from pipeline.activities.classify import classified
from pipeline.activities.environments import put_patch
from pipeline.activities.heartbeat import Heartbeat
from pipeline.activities.workspace import open_spec, rebuild
from pipeline.steps import DraftContext, DraftContextInput, ReproductionSeedInput, ReproductionSeedResult
from repair.patch import workspace_patch
from repair.procedure_draft import recipe_kinds, repository_facts
from reviews.git_credentials import GitCredentials

SEED_PATCH_NAME = "reproduction-seed.patch"


class ReproductionSeedActivities:
    def __init__(self, store: ArtifactStore, workspaces: WorkspaceManager, git_token: GitCredentials) -> None:
        self.store = store
        self.workspaces = workspaces
        self.git_token = git_token

    def all(self) -> Sequence[Callable[..., object]]:
        return [self.reproduction_seed, self.draft_context]

    @activity.defn(name=steps.DRAFT_CONTEXT.name)
    def draft_context(self, inp: DraftContextInput) -> DraftContext:
        """The kinds the recipe can run and the repository's facts at the base revision (see the module docstring)."""
        spec = open_spec(self.store, inp.spec_ref, inp.run_id, f"to describe the repository for {inp.op_id}")
        with Heartbeat("listing the repository's files for the drafter"), classified():
            ws = rebuild(self.workspaces, self.git_token, inp.run_id, inp.op_id, spec.clone_url, spec.base_revision)
            try:
                with isolated_git(ws.path, head=spec.base_revision) as git:
                    listed = git.run(["ls-tree", "-r", "-z", "--name-only", "--full-tree", spec.base_revision])
            finally:
                self.workspaces.remove(ws)
        paths = [p for p in listed.split("\0") if p]
        return DraftContext(kinds=list(recipe_kinds(spec.recipe)), facts=repository_facts(spec.recipe, paths))

    @activity.defn(name=steps.REPRODUCTION_SEED.name)
    def reproduction_seed(self, inp: ReproductionSeedInput) -> ReproductionSeedResult:
        """The stored reproduction's test files as a patch against the base revision; an empty result (no
        workspace built) for a browser or command reproduction and for a test one that writes no files."""
        reproduction = load_reproduction(self.store.read_bytes(inp.procedure_ref))
        if not isinstance(reproduction, TestProcedure) or not reproduction.files:
            return ReproductionSeedResult()
        spec = open_spec(self.store, inp.spec_ref, inp.run_id, f"to write the reproduction's tests for {inp.op_id}")
        with Heartbeat(f"writing the reproduction's {len(reproduction.files)} file(s)"), classified():
            ws = rebuild(self.workspaces, self.git_token, inp.run_id, inp.op_id, spec.clone_url, spec.base_revision)
            try:
                try:
                    for path, text in sorted(reproduction.files.items()):
                        write_beneath(ws.path, path, text.encode())
                except UntrustedFileError as err:
                    return ReproductionSeedResult(tests=list(reproduction.tests), refused=f"not written: {err}")
                patch, files = workspace_patch(ws.path, base=spec.base_revision)
            finally:
                self.workspaces.remove(ws)
        if not patch:
            # Every file already held exactly this text (or is ignored by the repository): nothing to carry.
            return ReproductionSeedResult(tests=list(reproduction.tests))
        ref = put_patch(self.store, patch, run_id=inp.run_id, name=SEED_PATCH_NAME, revision=spec.base_revision)
        return ReproductionSeedResult(patch_ref=ref, files=files, tests=list(reproduction.tests))
