"""Fault injection: lost answers after a commit, errors before applying, delays and rate limits."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import requests
from github import Auth, Github, GithubException, GithubRetry

from tests.support.forge import Team, branch_with, git


def test_drop_after_apply_leaves_exactly_one_issue(team: Team) -> None:
    team.forge.set_faults({"method": "POST", "path_regex": r"/repos/alice/shop/issues$", "action": "drop_after_apply"})
    with pytest.raises(requests.exceptions.ConnectionError):
        team.shop.create_issue("lost answer")
    assert [i.title for i in team.shop.get_issues()] == ["lost answer"]
    assert team.forge.faults() == []


def test_drop_after_apply_on_a_claim_ref_then_retry_sees_it_taken(team: Team) -> None:
    repo = team.shop
    main = repo.get_branch("main").commit.sha
    team.forge.set_faults({"method": "POST", "path_regex": r"/git/refs$", "action": "drop_after_apply"})
    with pytest.raises(requests.exceptions.ConnectionError):
        repo.create_git_ref("refs/durafix/claims/run-1", main)
    with pytest.raises(GithubException) as err:
        repo.create_git_ref("refs/durafix/claims/run-1", main)
    assert err.value.data["message"] == "Reference already exists"
    assert [r.ref for r in repo.get_git_matching_refs("durafix/claims/")] == ["refs/durafix/claims/run-1"]


@pytest.mark.parametrize("status", [500, 502, 503])
def test_status_fault_answers_before_applying(team: Team, status: int) -> None:
    team.forge.set_faults({"method": "POST", "path_regex": r"/issues$", "action": "status", "status": status})
    with pytest.raises(GithubException) as err:
        team.shop.create_issue("never stored")
    assert err.value.status == status
    assert list(team.shop.get_issues(state="all")) == []
    assert team.shop.create_issue("stored").number == 1


def test_fault_count_and_method_limit_what_it_hits(team: Team) -> None:
    team.forge.set_faults({"method": "GET", "path_regex": r"/repos/alice/shop$", "action": "status", "count": 2})
    assert team.forge.faults()[0]["count"] == 2
    for _ in range(2):
        with pytest.raises(GithubException):
            team.gh(team.alice).get_repo("alice/shop")
    assert team.forge.faults() == []
    assert team.gh(team.alice).get_repo("alice/shop").name == "shop"


def test_clear_faults_removes_all_rules(team: Team) -> None:
    team.forge.set_faults({"path_regex": ".", "action": "status", "count": 100})
    team.forge.clear_faults()
    assert team.forge.faults() == []
    assert team.shop.name == "shop"


def test_delay_makes_a_client_time_out_although_the_write_lands(team: Team) -> None:
    team.forge.set_faults({"method": "POST", "path_regex": r"/issues$", "action": "delay", "seconds": 2})
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{team.forge.api_url}/repos/alice/shop/issues",
            json={"title": "late"},
            headers={"Authorization": f"token {team.alice}"},
            timeout=0.5,
        )
    titles: list[str] = []
    deadline = time.monotonic() + 15
    while not titles and time.monotonic() < deadline:
        time.sleep(0.1)
        titles = [i.title for i in team.shop.get_issues()]
    assert titles == ["late"]


def test_secondary_rate_limit_is_403_with_retry_after(team: Team) -> None:
    team.forge.set_faults({"path_regex": r"/issues$", "action": "secondary_rate_limit", "retry_after": 7})
    resp = httpx.post(
        f"{team.forge.api_url}/repos/alice/shop/issues",
        json={"title": "x"},
        headers={"Authorization": f"token {team.alice}"},
    )
    assert resp.status_code == 403
    assert resp.headers["retry-after"] == "7"
    assert resp.json()["message"].startswith("You have exceeded a secondary rate limit.")
    assert list(team.shop.get_issues()) == []


def test_pygithub_waits_out_a_secondary_rate_limit_and_succeeds(team: Team) -> None:
    team.forge.set_faults(
        {"method": "GET", "path_regex": r"/repos/alice/shop$", "action": "secondary_rate_limit", "retry_after": 1}
    )
    gh = Github(
        base_url=team.forge.api_url,
        auth=Auth.Token(team.alice),
        seconds_between_requests=None,
        retry=GithubRetry(total=3, secondary_rate_wait=1),
    )
    assert gh.get_repo("alice/shop").name == "shop"
    assert team.forge.faults() == []


def test_rate_limit_429_carries_retry_after(team: Team) -> None:
    team.forge.set_faults({"path_regex": r"/user$", "action": "rate_limit_429", "retry_after": 3})
    resp = httpx.get(f"{team.forge.api_url}/user", headers={"Authorization": f"token {team.alice}"})
    assert (resp.status_code, resp.headers["retry-after"]) == (429, "3")


def test_primary_rate_limit_reports_zero_remaining_and_a_reset(team: Team) -> None:
    team.forge.set_faults({"path_regex": r"/user$", "action": "primary_rate_limit", "reset_in": 120})
    resp = httpx.get(f"{team.forge.api_url}/user", headers={"Authorization": f"token {team.alice}"})
    assert resp.status_code == 403
    assert resp.headers["x-ratelimit-remaining"] == "0"
    assert int(resp.headers["x-ratelimit-reset"]) > time.time()
    assert resp.json()["message"].startswith("API rate limit exceeded")


def test_error_fault_answers_its_status_and_message_before_applying(team: Team) -> None:
    repo = team.shop
    head = branch_with(repo, "later", {"l.txt": "l\n"})
    pull = repo.create_pull(title="l", body="", head="later", base="main")
    moved = "Base branch was modified. Review and try the merge again."
    team.forge.set_faults(
        {"method": "PUT", "path_regex": r"/merge$", "action": "error", "status": 405, "message": moved}
    )
    with pytest.raises(GithubException) as err:
        pull.merge(sha=head)
    assert (err.value.status, err.value.data["message"]) == (405, moved)
    assert "documentation_url" in err.value.data
    assert repo.get_pull(pull.number).state == "open"
    assert pull.merge(sha=head).merged


@pytest.mark.parametrize("rule", [{"status": 200, "message": "fine"}, {"status": 405}, {"status": 405, "message": ""}])
def test_an_error_fault_needs_an_error_status_and_a_message(team: Team, rule: dict[str, object]) -> None:
    resp = httpx.post(
        f"{team.forge.api_url}/admin/faults",
        json={"path_regex": ".", "action": "error", **rule},
        headers={"Authorization": f"token {team.forge.admin_token}"},
    )
    assert resp.status_code == 422


def test_invalid_fault_rule_is_422(team: Team) -> None:
    resp = httpx.post(
        f"{team.forge.api_url}/admin/faults",
        json={"path_regex": "(", "action": "status"},
        headers={"Authorization": f"token {team.forge.admin_token}"},
    )
    assert resp.status_code == 422
    resp = httpx.post(
        f"{team.forge.api_url}/admin/faults",
        json={"path_regex": ".", "action": "explode"},
        headers={"Authorization": f"token {team.forge.admin_token}"},
    )
    assert resp.status_code == 422


def test_dropped_receive_pack_still_accepts_the_push(team: Team, tmp_path: Path) -> None:
    wc = tmp_path / "wc"
    git("clone", "-q", team.forge.clone_url("alice/shop", team.alice), str(wc))
    (wc / "new.txt").write_text("new\n")
    git("add", "new.txt", cwd=wc)
    git("commit", "-qm", "new", cwd=wc)
    sha = git("rev-parse", "HEAD", cwd=wc).stdout.strip()
    team.forge.set_faults({"method": "POST", "path_regex": r"/git-receive-pack$", "action": "drop_after_apply"})
    pushed = git("push", "origin", "main", cwd=wc, check=False)
    assert pushed.returncode != 0
    assert team.shop.get_branch("main").commit.sha == sha


def test_status_fault_on_upload_pack_fails_one_clone(team: Team, tmp_path: Path) -> None:
    team.forge.set_faults({"method": "POST", "path_regex": r"/git-upload-pack$", "action": "status", "status": 502})
    url = team.forge.clone_url("alice/shop")
    assert git("clone", "-q", url, str(tmp_path / "a"), check=False).returncode != 0
    assert git("clone", "-q", url, str(tmp_path / "b"), check=False).returncode == 0
