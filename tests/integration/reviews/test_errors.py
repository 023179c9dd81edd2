"""GitHub's answers (and missing answers) become the four failure classes, with status, message and waits."""

from __future__ import annotations

import socket

import pytest

from reviews.errors import (
    ForgeAmbiguousError,
    ForgeConflictError,
    ForgeNotFoundError,
    ForgePermanentError,
    ForgeTransientError,
)
from reviews.interface import ForgePort
from reviews.transport import Transport
from tests.support.review_site import Site


def test_the_adapter_serves_the_port_the_workflow_depends_on(site: Site) -> None:
    port: ForgePort = site.adapter  # mypy checks the adapter against the Protocol here
    ticket = port.ensure_ticket("run-1:ticket", site.issue, "t", "Status")
    assert port.find_ticket("run-1:ticket") == ticket.model_copy(update={"created": False})


def test_bad_credentials_are_permanent_401(site: Site) -> None:
    with pytest.raises(ForgePermanentError) as raised:
        site.new_adapter(token="ghp_" + "0" * 36).get_branch_sha("main")
    assert raised.value.status == 401 and raised.value.github_message == "Bad credentials"


def test_missing_objects_and_invisible_private_repos_are_404(site: Site) -> None:
    with pytest.raises(ForgeNotFoundError):
        site.adapter.get_pr(999)
    secret_token = site.handle.create_user("alice")
    site.handle.create_repo(secret_token, "vault", private=True)
    hidden = site.new_adapter(repository="alice/vault")
    with pytest.raises(ForgeNotFoundError) as raised:
        hidden.get_pr(1)
    assert raised.value.status == 404 and raised.value.github_message == "Not Found"


def test_preconditions_are_conflicts_409_and_422(site: Site) -> None:
    transport = Transport(site.config())
    main = site.adapter.get_branch_sha("main")
    assert main is not None
    with pytest.raises(ForgeConflictError) as exists:
        transport.mutate("create ref", lambda: transport.repo.create_git_ref("refs/heads/main", main))
    assert exists.value.status == 422 and exists.value.github_message == "Reference already exists"

    first = site.commit("cart.py", "v1\n")
    site.adapter.publish_branch("feature", first, None, site.workdir)
    pr = site.repo().create_pull(base="main", head="feature", title="t", body="b")
    with pytest.raises(ForgeConflictError) as moved:
        transport.mutate("merge", lambda: transport.repo.get_pull(pr.number).merge(sha=main))
    assert moved.value.status == 409
    assert moved.value.github_message == "Head branch was modified. Review and try the merge again."


def test_merging_a_draft_outside_merge_is_a_permanent_405(site: Site) -> None:
    transport = Transport(site.config())
    sha = site.commit("cart.py", "v1\n")
    site.adapter.publish_branch("feature", sha, None, site.workdir)
    pr = site.repo().create_pull(base="main", head="feature", title="t", body="b", draft=True)
    with pytest.raises(ForgePermanentError) as raised:
        transport.mutate("merge", lambda: transport.repo.get_pull(pr.number).merge(sha=sha))
    assert raised.value.status == 405 and raised.value.github_message == "Pull Request is still a draft"


def test_server_errors_on_reads_are_retried_inside_the_client_then_transient(site: Site) -> None:
    site.fault("GET", r"/git/ref/heads/main$", "status", status=500)
    assert site.adapter.get_branch_sha("main") is not None
    assert site.handle.faults() == []

    site.fault("GET", r"/git/ref/heads/main$", "status", status=502, count=10)
    with pytest.raises(ForgeTransientError) as raised:
        site.new_adapter(read_retries=2).get_branch_sha("main")
    assert raised.value.status == 502 and raised.value.retry_after_s is None
    assert site.handle.faults()[0]["count"] == 7  # one try and two retries


def test_server_errors_on_mutations_are_transient_and_never_resent_by_the_client(site: Site) -> None:
    site.fault("POST", rf"/issues/{site.issue}/labels$", "status", status=500, count=2)
    with pytest.raises(ForgeTransientError) as raised:
        site.adapter.add_labels(site.issue, ["durafix"])
    assert raised.value.status == 500
    assert site.handle.faults()[0]["count"] == 1


@pytest.mark.parametrize(
    ("action", "status"),
    [("secondary_rate_limit", 403), ("rate_limit_429", 429)],
)
def test_secondary_rate_limits_are_transient_with_retry_after(site: Site, action: str, status: int) -> None:
    site.fault("POST", rf"/issues/{site.issue}/labels$", action, retry_after=7)
    with pytest.raises(ForgeTransientError) as raised:
        site.adapter.add_labels(site.issue, ["durafix"])
    assert raised.value.status == status and raised.value.retry_after_s == 7
    assert "secondary rate limit" in (raised.value.github_message or "")


def test_primary_rate_limit_waits_until_the_reset(site: Site) -> None:
    site.fault("GET", r"/git/ref/heads/main$", "primary_rate_limit", reset_in=90)
    with pytest.raises(ForgeTransientError) as raised:
        site.adapter.get_branch_sha("main")
    assert raised.value.status == 403
    assert raised.value.retry_after_s is not None and 80 <= raised.value.retry_after_s <= 90


def test_connection_refused_is_transient_even_for_mutations(site: Site) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    closed = site.new_adapter(api_url=f"http://127.0.0.1:{port}/api/v3", read_retries=0)
    with pytest.raises(ForgeTransientError):
        closed.add_labels(site.issue, ["durafix"])


def test_a_mutation_without_an_answer_is_ambiguous_and_a_read_is_transient(site: Site) -> None:
    site.fault("POST", rf"/issues/{site.issue}/labels$", "drop_after_apply")
    with pytest.raises(ForgeAmbiguousError):
        site.adapter.add_labels(site.issue, ["durafix"])
    assert [label.name for label in site.repo().get_issue(site.issue).labels] == ["durafix"]

    site.fault("GET", r"/git/ref/heads/main$", "delay", seconds=2.0)
    with pytest.raises(ForgeTransientError) as raised:
        site.new_adapter(request_timeout_s=1, read_retries=0).get_branch_sha("main")
    assert "Timeout" in str(raised.value)
