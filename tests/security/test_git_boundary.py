"""Git on the host never trusts a workspace's metadata: attacks through ``.git`` from sandboxed code, and after it.

Two walls, each attacked here with real git and real bubblewrap:

1. The sandbox sees the workspace's ``.git`` read-only: a setup command, a model-written test (through the real
   verification activity) and an agent's test run all try to plant a ``[filter]``, an attributes line, hooks,
   ``core.fsmonitor``, an ``[include]`` and a moved ``HEAD``; every write fails, and the worker's git, run on the
   workspace afterwards (dependency-cache status, snapshot, regression proof), runs none of it.
2. Were the first wall bypassed (the unsandboxed mode, or a hole in it), the worker's own git still reads none of
   it: the same plants written straight into ``.git`` leave the snapshot, the regression proof and the status
   check untouched, and the bundle holds the commit the worker made, not the one ``HEAD`` was moved to.

Each planted command would create a canary file in a directory the sandbox cannot see, so the canary can only
appear if the host ran it. A last test keeps the list of every host-side git call site in the product honest.
"""

from __future__ import annotations

import ast
import contextlib
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from temporalio.testing import ActivityEnvironment

from environments.checks import run_tests
from environments.depcache import DependencyCache
from environments.git import GitError, isolated_git
from environments.interface import AppRecipe, EnvironmentError, TestRunResult
from environments.regression import prove_regression
from environments.sandbox import Sandbox
from environments.workspace import WorkspaceManager
from evidence.interface import ArtifactKind
from evidence.local import LocalArtifactStore
from pipeline.config import DurafixConfig
from pipeline.services import Services
from pipeline.steps import AgentRunInput, AgentToolCall, PrepareSpecInput
from repair.agent_command import ShellAgent
from tests.integration.repair.test_command_engine import activity_env, attempt_input
from tests.integration.repair.test_command_engine import engine as command_engine
from tests.support.gitrepo import CART_APP, Repo, fixed_cart_source, git, make_repo, write_files
from tests.support.modelserver import Serve, serve
from tests.support.repair import CART_SCRIPTS
from tests.support.step_inputs import first_verify

__all__ = ["serve"]

ROOT = Path(__file__).resolve().parents[2]
RUN = "repair:acme/cart#7"


def plant_script(canary: Path, *, break_objects: bool = True) -> str:
    """A shell script that tries every git entry point a repository's metadata offers; each names ``canary``.

    Every write is allowed to fail (``|| true``) and says what happened, so the command itself succeeds and the
    only question is whether git on the host ever runs what was planted. ``break_objects`` also tries to cut
    the workspace off from the mirror's objects (the sandbox must refuse it; unsandboxed it would only break
    the run, not run anything)."""
    cmd = f"touch {canary}"
    return "\n".join(
        [
            "set -u",
            'try() { if sh -c "$1" 2>/dev/null; then echo "PLANTED: $2"; else echo "REFUSED: $2"; fi; }',
            f'try \'printf "[filter \\"x\\"]\\n\\tclean = {cmd}; cat\\n\\tsmudge = {cmd}; cat\\n'
            f"[core]\\n\\tfsmonitor = {cmd}\\n\\tpager = {cmd}\\n[diff]\\n\\texternal = {cmd}\\n"
            "[include]\\n\\tpath = ../evil.cfg\\n\" >> .git/config' config",
            f'try \'printf "[core]\\n\\thooksPath = .git/evilhooks\\n[filter \\"y\\"]\\n\\tclean = {cmd}\\n"'
            " > .git/../evil.cfg' include-target",
            "try 'mkdir -p .git/info && printf \"* filter=x diff=x\\n\" > .git/info/attributes' attributes",
            "try 'printf \"* filter=x diff=x\\n\" > .gitattributes' worktree-attributes",
            f'try \'mkdir -p .git/hooks && printf "#!/bin/sh\\n{cmd}\\n" > .git/hooks/post-checkout'
            " && chmod +x .git/hooks/post-checkout'"
            " hook",
            f"try 'mkdir -p .git/evilhooks && printf \"#!/bin/sh\\n{cmd}\\n\" > .git/evilhooks/post-checkout'"
            " hooks-path",
            "try 'printf \"0000000000000000000000000000000000000001\\n\" > .git/HEAD' head",
            *(["try 'rm -rf .git/objects/info' objects"] if break_objects else []),
            "exit 0",
        ]
    )


def patch_of(repo: Repo, files: dict[str, str]) -> str:
    """A patch (git's binary diff) adding or changing ``files`` on the base revision."""
    write_files(repo.work, files)
    git("add", "-A", cwd=repo.work)
    patch = git("diff", "--cached", "--binary", cwd=repo.work) + "\n"
    git("reset", "-q", "--hard", "HEAD", cwd=repo.work)
    return patch


# A test that passes and, as it runs, tries every plant of the repository's ``tools/plant.sh``.
HOSTILE_TEST = (
    "import subprocess\nimport unittest\n\n\n"
    "class Hostile(unittest.TestCase):\n"
    "    def test_plants(self) -> None:\n"
    "        out = subprocess.run(['sh', 'tools/plant.sh'], capture_output=True, text=True)\n"
    "        print('from the test:', out.stdout, flush=True)\n"
)


def assert_no_canary(canary: Path) -> None:
    assert not canary.exists(), "git on the host ran a command planted in the workspace's metadata"


def test_git_commands_on_a_tampered_workspace_run_nothing_it_planted(tmp_path: Path) -> None:
    """The second wall: plants written straight into ``.git`` (as if the sandbox were bypassed) are never read by
    the worker's snapshot, status check or regression proof; the bundle holds the worker's commit."""
    canary = tmp_path / "canary"
    repo = make_repo(tmp_path / "repo")
    patch = patch_of(repo, {"cart.py": fixed_cart_source(repo), "tests/test_more.py": "import unittest\n"})
    manager = WorkspaceManager(tmp_path / "cache", tmp_path / "workspaces")
    ws = manager.rebuild(run_id=RUN, op_id=f"{RUN}:verify", clone_url=repo.url, base_revision=repo.base, patch=patch)
    commit = manager.commit(ws, "Fix the cart total", timestamp=1_700_000_000)
    cache = DependencyCache(tmp_path / "deps")
    before = cache.checkout_state(ws.path)

    done = subprocess.run(
        ["sh", "-c", plant_script(canary, break_objects=False)], cwd=ws.path, capture_output=True, text=True, check=True
    )
    assert "REFUSED" not in done.stdout, done.stdout  # unsandboxed: every plant is really there
    # Plain git in the workspace would run them: the attack is real, not a typo in the plants.
    probe = subprocess.run(["git", "status"], cwd=ws.path, capture_output=True, text=True, check=False)
    assert canary.exists(), f"the plants are not live; git status said {probe.stderr[-300:]}"
    canary.unlink()
    # Put HEAD back to a readable commit ID (but not the worker's), so the status check has something to read.
    (ws.path / ".git" / "HEAD").write_text(repo.base + "\n")

    after = cache.checkout_state(ws.path)
    assert before is not None and after is not None
    assert ("??", "evil.cfg") in after - before  # it sees the working tree as it is
    assert_no_canary(canary)

    bundle = manager.snapshot(ws, tmp_path / "candidate.bundle", commit)
    assert_no_canary(canary)
    heads = git("bundle", "list-heads", str(bundle), cwd=tmp_path)
    assert heads.split()[0] == commit

    recipe = AppRecipe.model_validate(yaml.safe_load((CART_APP / "durafix.yaml").read_text()))
    ran: list[str] = []

    def run(command: str, log: Path, setup_first: bool) -> TestRunResult:
        ran.append(command)
        return run_tests(ws.path, recipe, 60, log_path=log, command=command, sandbox=Sandbox.detect())

    proof = prove_regression(
        ws.path, repo.base, recipe, run=run, log_dir=tmp_path / "logs", candidate_cases=None, candidate=commit
    )
    assert_no_canary(canary)
    assert proof.test_files == ["tests/test_more.py"]
    # The proof put the base's cart.py back through the worker's git, not the planted filter.
    assert (ws.path / "cart.py").read_text() == git("show", f"{repo.base}:cart.py", cwd=repo.work) + "\n"


def test_a_sandboxed_command_cannot_change_the_workspaces_git_metadata(tmp_path: Path) -> None:
    """The first wall: inside bubblewrap, ``.git`` is read-only; the working tree is still writable."""
    canary = tmp_path / "canary"
    repo = make_repo(tmp_path / "repo")
    manager = WorkspaceManager(tmp_path / "cache", tmp_path / "workspaces")
    ws = manager.rebuild(run_id=RUN, op_id=f"{RUN}:run", clone_url=repo.url, base_revision=repo.base)
    dot_git = ws.path / ".git"
    before = {p.relative_to(dot_git): p.read_bytes() for p in dot_git.rglob("*") if p.is_file()}
    script = tmp_path / "plant.sh"
    script.write_text(plant_script(canary))
    shutil.copy(script, ws.path / "plant.sh")
    recipe = AppRecipe.model_validate(yaml.safe_load((CART_APP / "durafix.yaml").read_text()))
    result = run_tests(
        ws.path, recipe, 60, log_path=tmp_path / "plant.log", command="sh plant.sh", sandbox=Sandbox.detect()
    )
    said = (tmp_path / "plant.log").read_text()
    assert result.exit_code == 0, said
    for what in ("config", "attributes", "hook", "hooks-path", "head", "objects"):
        assert f"REFUSED: {what}" in said, said
    assert "PLANTED: worktree-attributes" in said  # the working tree is the repository's to write
    after = {p.relative_to(dot_git): p.read_bytes() for p in dot_git.rglob("*") if p.is_file()}
    assert after == before
    with isolated_git(ws.path) as g:
        assert g.run(["status", "--porcelain"]).splitlines() == ["?? .gitattributes", "?? evil.cfg", "?? plant.sh"]
    assert_no_canary(canary)


def test_a_workspace_whose_git_is_a_link_is_refused_by_the_sandbox_and_the_worker(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (ws / ".git").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(EnvironmentError, match="not a directory the worker made"):
        Sandbox.detect().wrap(["true"], workspace=ws)
    with contextlib.ExitStack() as stack, pytest.raises(GitError, match="a link, or missing"):
        stack.enter_context(isolated_git(ws, head="0" * 40))


@pytest.mark.slow
def test_a_model_test_and_a_setup_that_plant_git_entry_points_run_nothing_on_the_host(tmp_path: Path) -> None:
    """Through the real verification activity (rebuild, commit, sandboxed setup and tests, snapshot, regression
    proof): the recipe's setup and the patch's passing test both try every plant; nothing runs on the host, the
    verification ends honestly (tests passed, the proof says what it found) and the bundle's commit is the
    worker's."""
    canary = tmp_path / "canary"
    repo = make_repo(tmp_path / "repo")
    recipe = yaml.safe_load((repo.work / "durafix.yaml").read_text())
    recipe["setup"] = ["sh tools/plant.sh"]
    (repo.work / "durafix.yaml").write_text(yaml.safe_dump(recipe))
    (repo.work / "tools").mkdir()
    (repo.work / "tools" / "plant.sh").write_text(plant_script(canary))
    git("add", "-A", cwd=repo.work)
    git("commit", "-qm", "a recipe whose setup plants git entry points", cwd=repo.work)
    git("push", "-q", "origin", "HEAD:main", cwd=repo.work)
    base = git("rev-parse", "HEAD", cwd=repo.work)
    repo = Repo(bare=repo.bare, work=repo.work, base=base)
    patch = patch_of(repo, {"cart.py": fixed_cart_source(repo), "tests/test_hostile.py": HOSTILE_TEST})

    root = tmp_path / "evidence"
    store = LocalArtifactStore(root)
    config = DurafixConfig(state_dir=tmp_path / "state", evidence_url=root.as_uri(), dependency_cache=False)
    activities = Services(config).environment_activities()
    env = ActivityEnvironment()
    spec_ref = env.run(
        activities.prepare_spec,
        PrepareSpecInput(
            run_id=RUN, op_id=f"{RUN}:spec", repository="acme/cart", clone_url=repo.url, base_revision=base
        ),
    )
    patch_ref = store.put_bytes(patch.encode(), kind=ArtifactKind.PATCH, run_id=RUN, name="candidate.patch")
    verified = env.run(
        activities.verify_candidate,
        first_verify(RUN, spec_ref, patch_ref, "Fix the cart total", 1_700_000_000),
    )
    assert_no_canary(canary)
    assert verified.tests_passed, verified.test_summary
    log = store.read_bytes(verified.test_output_ref).decode()
    for what in ("config", "attributes", "hook", "head"):
        assert f"REFUSED: {what}" in log, log[-2000:]
    assert "PLANTED: config" not in log
    assert verified.regression is not None and verified.regression.test_files == ["tests/test_hostile.py"]

    # The bundle's one head is the commit the worker made: base + patch, the worker's message and identity.
    bundle = tmp_path / "candidate.bundle"
    bundle.write_bytes(store.read_bytes(verified.bundle_ref))
    assert git("bundle", "list-heads", str(bundle), cwd=tmp_path).split()[0] == verified.commit
    check = tmp_path / "check"
    git("clone", "-q", repo.url, str(check))
    git("fetch", "-q", str(bundle), "HEAD", cwd=check)
    assert git("rev-parse", "FETCH_HEAD^", cwd=check) == base
    assert git("log", "-1", "--format=%an %s", "FETCH_HEAD", cwd=check) == "durafix Fix the cart total"
    git("apply", "--index", "-", cwd=check, stdin=patch)
    assert git("write-tree", cwd=check) == git("rev-parse", "FETCH_HEAD^{tree}", cwd=check)


# ---- the inventory of host-side git call sites ------------------------------------------------------------

# Every place product code runs git, and why it may: on a mirror or a scratch repository of the worker's, on a
# workspace before any untrusted code ran in it, or through ``isolated_git``. A new call site fails this test
# until it is listed here with its reason; a listed one that is gone fails it too, so the list stays true.
GIT_CALL_SITES: dict[str, str] = {
    "environments/git.py:run_git": "the helper itself: its callers are listed",
    "environments/git.py:run_git_bytes": "the helper itself: its callers are listed",
    "environments/git.py:has_commit": "mirror: presence check",
    "environments/git.py:IsolatedGit.run": "isolated: the worker's git directory",
    "environments/git.py:isolated_git": "isolated: builds the worker's git directory in its own temporary directory",
    "environments/mirror.py:*": "mirror: clone, fetch, bundle import in the worker's cache",
    "environments/staged_patch.py:*": "scratch: a bare repository of the worker's, in a temporary directory",
    "environments/head_capture.py:*": "mirror: diffs and merges of forge commits",
    "environments/workspace.py:WorkspaceManager.commit": "pristine workspace: before any untrusted code ran",
    "environments/workspace.py:WorkspaceManager.snapshot": "isolated (the named commit)",
    "environments/workspace.py:_build_tree": "pristine workspace: being built in a temporary directory",
    "environments/regression.py:*": "isolated (the candidate commit)",
    "environments/depcache.py:DependencyCache.checkout_state": "isolated (HEAD and index read as data)",
    "environments/checks.py:_is_base_tree": "isolated (HEAD and index read as data): is this a candidate?",
    "repair/patch.py:*": "isolated: a fresh GIT_DIR borrowing the mirror's objects",
    "reviews/claims.py:*": "mirror: claim refs on the forge",
    "reviews/branches.py:*": "mirror: pushes from the worker's repository",
    "reviews/leased_push.py:leased_push": "mirror: the conditional push of branches.py and claims.py",
    "pipeline/ops/forge_setup.py:*": "operator command: the operator's own checkout",
    "infra/cli/demo_run.py:DemoRun._fix_merged": "demo: a fresh clone of the forge's main",
    "infra/cli/onboard.py:*": "operator command: the operator's own checkout, before anything ran in it",
    "pipeline/activities/reproduction_seed.py:ReproductionSeedActivities.draft_context": "isolated (the base "
    "revision's files by name, in a pristine workspace)",
    "pipeline/recipe_check.py:*": "operator command (durafix check): the operator's own checkout, read only (its "
    "HEAD, status and origin), with the clean configuration; what runs, runs in a workspace cloned from it",
}
_GIT_FUNCS = {"run_git", "run_git_bytes", "_git", "git", "isolated_git"}
# The product, and the local stack's commands (which run git in an operator's checkout and the demo's clone).
_PRODUCT = ("environments", "repair", "reviews", "browser", "evidence", "pipeline", "infra/cli")


def _git_call_sites() -> set[str]:
    """``path:Qualified.function`` of every call that runs git in product code (through the helpers or a
    subprocess whose argv starts with ``"git"``)."""
    found: set[str] = set()
    for package in _PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            tree = ast.parse(path.read_text(), filename=rel)

            def visit(node: ast.AST, scope: list[str], rel: str = rel) -> None:
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                        visit(child, [*scope, child.name])
                        continue
                    if isinstance(child, ast.Call) and _runs_git(child):
                        found.add(f"{rel}:{'.'.join(scope) or '<module>'}")
                    visit(child, scope)

            visit(tree, [])
    return found


def _runs_git(call: ast.Call) -> bool:
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    if name in _GIT_FUNCS:
        return True
    if name in {"run", "Popen", "check_output", "check_call", "call"} and call.args:
        first = call.args[0]
        if isinstance(first, ast.List) and first.elts:
            head = first.elts[0]
            return isinstance(head, ast.Constant) and head.value == "git"
    return False


def _listed(site: str) -> bool:
    path, _, _ = site.partition(":")
    return site in GIT_CALL_SITES or f"{path}:*" in GIT_CALL_SITES


def test_every_host_side_git_call_site_is_listed_with_its_reason() -> None:
    sites = _git_call_sites()
    unlisted = sorted(site for site in sites if not _listed(site))
    assert not unlisted, (
        "git is run at call sites not listed in GIT_CALL_SITES; a workspace after untrusted code ran must go "
        f"through environments.git.isolated_git: {unlisted}"
    )
    files = {site.partition(":")[0] for site in sites}
    stale = sorted(
        key
        for key in GIT_CALL_SITES
        if (key.endswith(":*") and key[:-2] not in files) or (not key.endswith(":*") and key not in sites)
    )
    assert not stale, f"listed git call sites that no longer exist: {stale}"


def test_an_agent_cli_that_plants_git_entry_points_gets_only_its_file_changes_through(
    tmp_path: Path, serve: Serve
) -> None:
    """An external agent CLI (sandboxed, with the workspace writable) tries every plant and edits one file: its
    plants are refused, the worker's git (taking the patch, judging it) runs none of them, and the proposal is
    the file it changed."""
    canary = tmp_path / "canary"
    repo = make_repo(tmp_path / "repo")
    server = serve(CART_SCRIPTS / "mini-swe-agent-fix.yaml")
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "plant.sh").write_text(plant_script(canary))
    fix = tmp_path / "agent" / "fixed_cart.py"
    fix.write_text(fixed_cart_source(repo))
    # The working-tree plants are removed again: the patch policy would refuse a .gitattributes on its own.
    script = (
        f'sh {tmp_path / "agent" / "plant.sh"} > "$DURAFIX_SUMMARY_FILE"; rm -f .gitattributes evil.cfg; '
        f"cp {fix} cart.py"
    )
    acts = command_engine(tmp_path, server, ShellAgent(script, read_only=(tmp_path / "agent",)))

    proposal = activity_env().run(acts.agent_command, attempt_input(acts, repo))

    assert_no_canary(canary)
    assert proposal.files_changed == ["cart.py"]
    for what in ("config", "attributes", "hook", "head", "objects"):
        assert f"REFUSED: {what}" in proposal.summary, proposal.summary


def test_a_stepped_agents_run_tests_that_plants_git_entry_points_runs_nothing_on_the_host(tmp_path: Path) -> None:
    """The built-in agent's ``run_tests`` tool runs the patch's tests in the sandbox on a rebuilt workspace: the
    model's test tries every plant, each is refused, and nothing runs on the host."""
    canary = tmp_path / "canary"
    repo = make_repo(tmp_path / "repo")
    (repo.work / "tools").mkdir()
    (repo.work / "tools" / "plant.sh").write_text(plant_script(canary))
    git("add", "-A", cwd=repo.work)
    git("commit", "-qm", "a planting script the model's test will run", cwd=repo.work)
    git("push", "-q", "origin", "HEAD:main", cwd=repo.work)
    repo = Repo(bare=repo.bare, work=repo.work, base=git("rev-parse", "HEAD", cwd=repo.work))
    patch = patch_of(repo, {"tests/test_hostile.py": HOSTILE_TEST})

    root = tmp_path / "evidence"
    store = LocalArtifactStore(root)
    services = Services(DurafixConfig(state_dir=tmp_path / "state", evidence_url=root.as_uri()))
    env = ActivityEnvironment()
    spec_ref = env.run(
        services.environment_activities().prepare_spec,
        PrepareSpecInput(
            run_id=RUN, op_id=f"{RUN}:spec", repository="acme/cart", clone_url=repo.url, base_revision=repo.base
        ),
    )
    put = store.put_bytes
    ran = env.run(
        services.agent_run_activities().agent_run,
        AgentRunInput(
            run_id=RUN,
            op_id=f"{RUN}:repair:1:turn:1:call-1",
            attempt=1,
            turn=1,
            spec_ref=spec_ref,
            transcript_ref=put(b"[]", kind=ArtifactKind.OTHER, run_id=RUN, name="transcript.json"),
            patch_ref=put(patch.encode(), kind=ArtifactKind.PATCH, run_id=RUN, name="so-far.patch"),
            call=AgentToolCall(id="call-1", name="run_tests", arguments="{}"),
        ),
    )
    assert_no_canary(canary)
    assert ran.output_ref is not None and not ran.interrupted and not ran.refused
    said = store.read_bytes(ran.output_ref).decode()
    for what in ("config", "attributes", "hook", "head", "objects"):
        assert f"REFUSED: {what}" in said, said[-2000:]
