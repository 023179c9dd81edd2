"""The one table from capability exceptions to failure classes: subclasses before their bases, retry-after
carried, unknown errors left alone."""

from __future__ import annotations

from datetime import timedelta

import pytest
from temporalio.exceptions import ApplicationError

from browser.results import BrowserInfraError
from environments.checks import SetupError
from environments.git import GitError, GitInterrupted, GitProtocolError, GitTransportError
from environments.interface import FixtureError, NoAppError, RunFencedError
from pipeline.activities.classify import RULES, as_failure, classified
from pipeline.failures import NON_RETRYABLE, FailureClass
from repair.interface import ModelTransientError, NoPatchError, RepairError
from repair.procedure_draft import ProcedureDraftError
from reviews.claims import ClaimLostError
from reviews.errors import ForgeNotFoundError, ForgeTransientError


@pytest.mark.parametrize(
    ("err", "failure", "text"),
    [
        (GitProtocolError(["fetch"], 128, "fatal: Repository not found", 404), FailureClass.PERMANENT, "git: "),
        (GitTransportError(["fetch"], 128, "Connection refused"), FailureClass.TRANSIENT, "git: "),
        (GitError(["fetch"], 1, "something"), FailureClass.TRANSIENT, "git: "),
        (GitInterrupted(["read-tree", "b" * 40], -9), FailureClass.TRANSIENT, "git: "),
        (FixtureError("seed failed"), FailureClass.NOT_READY, "seed failed"),
        (SetupError("npm ci exited 1"), FailureClass.NOT_READY, "setup failed: "),
        (NoAppError(), FailureClass.NOT_READY, "durafix.yaml declares no `start`"),
        (RunFencedError("tombstoned"), FailureClass.POLICY, "run fenced: "),
        (ClaimLostError("lost"), FailureClass.POLICY, "forge conflict: "),
        (ForgeNotFoundError("gone"), FailureClass.PERMANENT, "forge: "),
        (BrowserInfraError("crashed"), FailureClass.INFRASTRUCTURE, "browser failed: "),
        (
            ProcedureDraftError("no procedure", rounds=3, last_error="-", prompt_tokens=1, completion_tokens=1),
            FailureClass.PROCEDURE_INVALID,
            "no valid procedure drafted: ",
        ),
        (NoPatchError("empty"), FailureClass.NO_PATCH, "no patch: "),
        (RepairError("odd answer"), FailureClass.PERMANENT, "model: "),
    ],
)
def test_each_capability_error_becomes_its_failure_class(err: Exception, failure: FailureClass, text: str) -> None:
    out = as_failure(err)
    assert isinstance(out, ApplicationError)
    assert out.type == failure.value and out.message.startswith(text)
    assert out.non_retryable == (failure.value in NON_RETRYABLE) == (not failure.retryable)


def test_a_named_wait_becomes_the_next_retry_delay() -> None:
    forge = as_failure(ForgeTransientError("rate limited", status=403, retry_after_s=7))
    model = as_failure(ModelTransientError("429", retry_after=3))
    assert isinstance(forge, ApplicationError) and forge.next_retry_delay == timedelta(seconds=7)
    assert isinstance(model, ApplicationError) and model.next_retry_delay == timedelta(seconds=3)


def test_an_error_no_rule_names_propagates_unchanged() -> None:
    with pytest.raises(KeyError), classified():
        raise KeyError("a bug")


def test_no_rule_is_shadowed_by_an_earlier_rule_for_a_base_class() -> None:
    for i, later in enumerate(RULES):
        for earlier in RULES[:i]:
            for kind in later.errors:
                assert not issubclass(kind, earlier.errors), f"{kind.__name__} is caught earlier as {earlier.errors}"
