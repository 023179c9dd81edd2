"""The operator's patch policy: which changes a model-written patch may make to a repository.

The policy judges the patch as git sees it (:mod:`environments.staged_patch`: applied to a scratch index,
read back with ``git diff --cached --raw --numstat``), never its text. It comes from the operator's worker
configuration, per repository (:func:`policy_for`); nothing in the repository (``durafix.yaml``) or in the
issue can loosen it.

Refused by default, each with a reason naming the path:

- protected paths (:data:`DEFAULT_PROTECTED_PATHS`): CI and automation configuration, which the forge runs
  with the repository's secrets once the branch is pushed; durafix's own recipe; ``.gitattributes`` (it
  selects filters, drivers and line-ending conversions), ``.gitmodules``, ``.lfsconfig``; hook managers;
- deleting a test file (:func:`repair.test_files.is_test_file`, plus the operator's ``test_globs``), or
  leaving one with fewer test cases than on the base (:func:`repair.test_files.count_test_cases`);

and, whatever the policy says (:func:`environments.staged_patch.unsafe_changes`): symbolic links,
submodules, mode changes other than the executable bit, paths outside the tree or inside ``.git``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from environments.globs import matches_any
from environments.staged_patch import FileChange, unsafe_changes
from repair.test_files import count_test_cases, is_test_file

DEFAULT_MAX_PATCH_BYTES = 256 * 1024

DEFAULT_PROTECTED_PATHS: tuple[str, ...] = (
    # CI and automation run by the forge or a bot on push, with the repository's secrets.
    ".github/**",
    ".gitlab-ci.yml",
    ".gitlab/**",
    ".circleci/**",
    "**/Jenkinsfile",
    "Jenkinsfile.*",
    ".travis.yml",
    "azure-pipelines.yml",
    ".azure-pipelines/**",
    "bitbucket-pipelines.yml",
    ".buildkite/**",
    ".drone.yml",
    ".woodpecker.yml",
    ".woodpecker/**",
    "appveyor.yml",
    ".appveyor.yml",
    ".cirrus.yml",
    ".semaphore/**",
    "cloudbuild.yaml",
    "cloudbuild.yml",
    "buildspec.yml",
    ".teamcity/**",
    ".gitea/**",
    ".forgejo/**",
    "renovate.json",
    "renovate.json5",
    ".renovaterc*",
    ".mergify.yml",
    # Who must review: the forge reads CODEOWNERS at the root, in docs/ and in .github/.
    "CODEOWNERS",
    "docs/CODEOWNERS",
    # durafix's own recipe: the commands it runs, the secrets it passes.
    "**/durafix.yaml",
    "**/durafix.yml",
    # git's per-path behaviour and links to other repositories.
    "**/.gitattributes",
    ".gitmodules",
    ".lfsconfig",
    # Hooks and hook managers: code a developer's git runs on commit or checkout.
    ".githooks/**",
    ".husky/**",
    ".pre-commit-config.yaml",
    "lefthook.yml",
    ".lefthook.yml",
    ".lefthook/**",
)


class PatchPolicy(BaseModel):
    """What a patch may change in one repository. The defaults are the safe ones.

    ``protected_paths`` replaces the default list when given; ``allowed_paths`` lifts protection from the
    paths it matches (``[".github/workflows/test.yml"]`` lets a fix touch that one workflow). Globs follow
    :mod:`environments.globs`. ``protect_tests`` refuses deleting test files and lowering a test file's case
    count; ``test_globs`` names more test files than the conventions of :mod:`repair.test_files`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    protected_paths: tuple[str, ...] = DEFAULT_PROTECTED_PATHS
    allowed_paths: tuple[str, ...] = ()
    protect_tests: bool = True
    test_globs: tuple[str, ...] = ()
    max_bytes: int = Field(default=DEFAULT_MAX_PATCH_BYTES, gt=0)


def policy_for(policies: Mapping[str, PatchPolicy], repository: str) -> PatchPolicy:
    """The policy for ``repository`` (``OWNER/REPO``, compared case-insensitively, as GitHub does): its own
    entry, else the ``"*"`` entry, else the defaults."""
    by_name = {name.lower(): policy for name, policy in policies.items()}
    return by_name.get(repository.lower()) or by_name.get("*") or PatchPolicy()


def policy_violations(
    changes: Sequence[FileChange], policy: PatchPolicy, read_blob: Callable[[str], bytes]
) -> list[str]:
    """Why the changes break ``policy`` (or the rules no policy waives), one reason per finding.

    ``read_blob`` reads a blob of the base or of the patch (for counting test cases on both sides).
    """
    reasons = unsafe_changes(changes)
    for change in changes:
        protected = matches_any(change.path, policy.protected_paths)
        if protected is not None and matches_any(change.path, policy.allowed_paths) is None:
            reasons.append(
                f"{change.path}: protected path (matches {protected!r}); "
                "the operator's patch policy for this repository does not let a patch change it"
            )
        if policy.protect_tests and is_test_file(change.path, policy.test_globs):
            reasons += _test_weakening(change, read_blob)
    return reasons


def _test_weakening(change: FileChange, read_blob: Callable[[str], bytes]) -> list[str]:
    if change.status == "D":
        return [f"{change.path}: deletes a test file; fix the code, not the test that shows the bug"]
    if change.status == "A" or change.binary:
        return []
    before = count_test_cases(change.path, read_blob(change.old_blob))
    after = count_test_cases(change.path, read_blob(change.new_blob))
    if before is not None and after is not None and after < before:
        return [
            f"{change.path}: {after} test case(s) after the patch, {before} on the base; "
            "a patch may add tests but not remove, skip or break them"
        ]
    return []
