"""The environments queue's activities on real parts: a real git repository, the local provider, a real store.

What a failed setup or an app that never got ready leaves behind: the environment's log stored as evidence
(so a run that ends here still has it after cleanup) and a failure that names it instead of quoting it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from environments.interface import NO_APP_MESSAGE
from evidence.interface import ArtifactKind, ArtifactRef
from evidence.local import LocalArtifactStore
from pipeline.activities.environments import EnvironmentActivities
from pipeline.config import DurafixConfig
from pipeline.failures import FailureClass
from pipeline.services import Services
from pipeline.state import EnvironmentFailureFact
from pipeline.steps import BaselineInput, CaptureHeadInput, PrepareSpecInput, ProvisionInput
from tests.support.gitrepo import git, make_repo

PRINTED = "installer printed this line"
# Printed by computing it, so the command's own text (which a failure may name) does not hold it.
PRINT = "python3 -c \"print('installer ' + 'printed this line')\""


def changed_cart(
    tmp_path: Path, change: dict[str, object], **settings: object
) -> tuple[EnvironmentActivities, LocalArtifactStore, ArtifactRef]:
    """The environments activities on a real store, and the spec of the cart sample with ``change`` made to its
    recipe (a field changed to ``None`` is taken out)."""
    repo = make_repo(tmp_path / "repo")
    recipe = yaml.safe_load((repo.work / "durafix.yaml").read_text())
    recipe.update(change)
    recipe = {name: value for name, value in recipe.items() if value is not None}
    (repo.work / "durafix.yaml").write_text(yaml.safe_dump(recipe))
    git("commit", "-qam", "a recipe that cannot start", cwd=repo.work)
    git("push", "-q", "origin", "HEAD:main", cwd=repo.work)
    base = git("rev-parse", "HEAD", cwd=repo.work)

    root = tmp_path / "evidence"
    store = LocalArtifactStore(root)
    config = DurafixConfig(state_dir=tmp_path / "state", evidence_url=root.as_uri(), **settings)  # type: ignore[arg-type]
    activities = Services(config).environment_activities()
    env = ActivityEnvironment()
    spec_ref = env.run(
        activities.prepare_spec,
        PrepareSpecInput(run_id="r1", op_id="r1:spec", repository="o/cart", clone_url=repo.url, base_revision=base),
    )
    return activities, store, spec_ref


def failed_provision(
    tmp_path: Path, change: dict[str, object], **settings: object
) -> tuple[ApplicationError, LocalArtifactStore]:
    """Provision the cart sample with ``change`` made to its recipe, expecting it to fail; the failure and the
    store."""
    activities, store, spec_ref = changed_cart(tmp_path, change, **settings)
    with pytest.raises(ApplicationError) as raised:
        ActivityEnvironment().run(
            activities.provision,
            ProvisionInput(run_id="r1", op_id="r1:env-base:1", spec_ref=spec_ref, patch_ref=None, provider="local"),
        )
    return raised.value, store


@pytest.mark.slow
@pytest.mark.parametrize(
    ("change", "said", "failed"),
    [
        ({"setup": [f"{PRINT}; exit 3"]}, "setup failed: setup command", ("setup", f"{PRINT}; exit 3", 3, "")),
        (
            {"start": f"{PRINT}; sleep 30", "readiness": {"path": "/healthz", "deadline_s": 2}},
            "did not answer",
            ("start", f"{PRINT}; sleep 30", None, "not-listening"),
        ),
        (
            {"start": "python3 -m http.server $PORT", "readiness": {"path": "/healthz", "deadline_s": 2}},
            "did not answer",
            ("start", "python3 -m http.server $PORT", None, "readiness-status"),
        ),
    ],
    ids=["setup-fails", "never-ready", "readiness-404"],
)
def test_an_environment_that_cannot_start_keeps_its_log_as_evidence_and_names_it(
    tmp_path: Path, change: dict[str, object], said: str, failed: tuple[str, str, int | None, str]
) -> None:
    """The failure names the stored log and the command that failed, with the cause recognised in its log: an
    app that never listened on its port, a readiness path answering 404 (the provider's readiness verdict)."""
    err, store = failed_provision(tmp_path, change)
    assert err.type == FailureClass.NOT_READY.value and err.non_retryable
    assert said in err.message and "its output is in environment.log" in err.message
    assert PRINTED not in err.message  # the repository's output is not quoted into the run's state
    (details,) = err.details
    assert isinstance(details, dict)
    log_ref = ArtifactRef.model_validate(details["log_ref"])
    assert log_ref.kind == ArtifactKind.LOG and log_ref.revision is not None and len(log_ref.revision) == 40
    log = store.read_bytes(log_ref).decode()
    assert PRINTED in log or failed[3] == "readiness-status"
    fact = EnvironmentFailureFact.model_validate(details["environment_failure"])
    assert (fact.stage, fact.command, fact.exit_code, fact.cause) == failed, fact
    assert fact.log_ref == log_ref and fact.log_url == store.url_for(log_ref)
    assert PRINTED not in fact.hint
    if fact.cause == "readiness-status":
        assert "# readiness: GET /healthz answered 404, expected 200" in log, log
        assert "GET /healthz with 404" in fact.hint
    if fact.cause == "not-listening":
        assert "# readiness: nothing answered on $PORT" in log, log
        assert "`$PORT`" in fact.hint


def test_a_recipe_without_start_fails_provisioning_before_a_workspace_and_its_tests_still_run(tmp_path: Path) -> None:
    """The cart's recipe without ``start`` and ``readiness``: provisioning fails NotReady (not retried) naming
    the missing ``start`` and the hint, before a workspace is built or anything started; the baseline (setup
    and tests, no app) runs as before."""
    activities, _, spec_ref = changed_cart(tmp_path, {"start": None, "readiness": None})
    with pytest.raises(ApplicationError) as raised:
        ActivityEnvironment().run(
            activities.provision,
            ProvisionInput(run_id="r1", op_id="r1:env-base:1", spec_ref=spec_ref, patch_ref=None, provider="local"),
        )
    err = raised.value
    assert err.type == FailureClass.NOT_READY.value and err.non_retryable
    assert err.message == NO_APP_MESSAGE
    (details,) = err.details
    assert isinstance(details, dict) and "log_ref" not in details
    fact = EnvironmentFailureFact.model_validate(details["environment_failure"])
    assert (fact.stage, fact.command, fact.exit_code, fact.log_ref, fact.cause) == ("start", "", None, None, "no-app")
    assert "add `start`" in fact.hint
    assert activities.workspaces.list_owned("r1") == []
    assert activities.provider_for("local").list_owned("r1") == []

    baseline = ActivityEnvironment().run(
        activities.run_baseline, BaselineInput(run_id="r1", op_id="r1:baseline", spec_ref=spec_ref)
    )
    assert baseline.runnable and baseline.passed, baseline.summary


# Tests that fetch from the network: in the sandbox the name does not resolve.
NETWORK_TEST = "python3 -c \"import urllib.request; urllib.request.urlopen('https://pypi.org/simple/six/')\""


@pytest.mark.slow
def test_a_baseline_whose_tests_need_the_network_names_the_command_its_log_and_the_hint(tmp_path: Path) -> None:
    """The baseline's tests fail with a network error in the sandbox: its result names the test command, the
    stored log (with its link) and the hint that tests never have the network."""
    activities, store, spec_ref = changed_cart(tmp_path, {"test": NETWORK_TEST})
    result = ActivityEnvironment().run(
        activities.run_baseline, BaselineInput(run_id="r1", op_id="r1:baseline", spec_ref=spec_ref)
    )
    assert result.runnable and not result.passed, result
    failed = result.environment_failure
    assert failed is not None and (failed.stage, failed.command, failed.exit_code) == ("tests", NETWORK_TEST, 1)
    assert failed.cause == "tests-need-network" and "never have the network" in failed.hint, failed
    assert failed.log_ref == result.test_output_ref and failed.log_url == store.url_for(result.test_output_ref)
    assert "name resolution" in store.read_bytes(result.test_output_ref).decode()


SECRET = "cart-secret-value-4242"


@pytest.mark.slow
def test_a_secret_the_app_prints_is_redacted_from_the_stored_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CART_SECRET", SECRET)
    change: dict[str, object] = {
        "secrets": {"CART_TOKEN": "env:CART_SECRET"},
        "start": 'echo "the token is $CART_TOKEN"; sleep 30',
        "readiness": {"path": "/healthz", "deadline_s": 2},
    }
    # The operator lets the recipe's secret reach the app (the sandbox gives it nothing else).
    err, store = failed_provision(tmp_path, change, secret_allowlist=["CART_SECRET"])
    log = store.read_bytes(ArtifactRef.model_validate(err.details[0]["log_ref"])).decode()
    assert "the token is [redacted CART_TOKEN]" in log
    assert SECRET not in log and SECRET not in err.message


def test_redaction_catches_values_across_chunks_and_prefers_the_longest(tmp_path: Path) -> None:
    from environments import redaction

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(redaction, "_CHUNK", 7)
    try:
        redactor = redaction.Redactor({"SHORT": "abcdefgh", "LONG": "abcdefgh-and-more", "TINY": "xy"})
        source = tmp_path / "in.log"
        source.write_bytes(b"1234abcdefgh-and-more 56abcdefgh 78 xy\n" * 3)
        out = redactor.file(source, tmp_path / "out.log").read_text()
        assert out == "1234[redacted LONG] 56[redacted SHORT] 78 xy\n" * 3
        assert redactor.text("-abcdefgh-") == "-[redacted SHORT]-"
    finally:
        monkeypatch.undo()
    found = redaction.worker_secrets({"A": "env:APP_A"}, {"APP_A": "value-of-a", "GITHUB_TOKEN": "ghp_x", "HOME": "/r"})
    assert found == {"A": "value-of-a", "GITHUB_TOKEN": "ghp_x"}


def test_a_captured_head_is_stored_as_its_patch_from_the_base_tagged_with_the_head(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    base = git("rev-parse", "HEAD", cwd=repo.work)
    (repo.work / "PUSHED.md").write_text("pushed by someone else\n")
    git("add", "PUSHED.md", cwd=repo.work)
    git("commit", "-qm", "a push the run did not make", cwd=repo.work)
    git("push", "-q", "origin", "HEAD:refs/heads/fix", cwd=repo.work)
    head = git("rev-parse", "HEAD", cwd=repo.work)

    root = tmp_path / "evidence"
    store = LocalArtifactStore(root)
    activities = Services(
        DurafixConfig(state_dir=tmp_path / "state", evidence_url=root.as_uri())
    ).environment_activities()
    env = ActivityEnvironment()
    spec_ref = env.run(
        activities.prepare_spec,
        PrepareSpecInput(run_id="r1", op_id="r1:spec", repository="o/cart", clone_url=repo.url, base_revision=base),
    )
    captured = env.run(
        activities.capture_head, CaptureHeadInput(run_id="r1", spec_ref=spec_ref, head_sha=head, base_revision=base)
    )

    ref = captured.patch_ref
    assert (ref.kind, ref.media_type, ref.name, ref.revision, ref.run_id) == (
        ArtifactKind.PATCH,
        "text/x-diff",
        "head.patch",
        head,
        "r1",
    )
    patch = store.read_bytes(ref).decode()
    assert "+++ b/PUSHED.md" in patch and "+pushed by someone else" in patch
    assert captured.descends_from_base and not captured.empty
