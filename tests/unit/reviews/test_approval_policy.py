"""The approval policy's rules (pure: every input is given), the forge check counting approvals against it,
and the configuration that sets it."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from pipeline.config import DurafixConfig, load_config
from reviews.approval_policy import ApprovalPolicy, stricter
from reviews.approvals import forge_approval
from reviews.models import PullState, ReviewInfo

BOT = "durafix-bot"
HEAD = "a" * 40
OLD = "b" * 40
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def nobody(team: str) -> bool:
    return False


def test_the_default_policy_admits_any_writer_and_refuses_a_reader() -> None:
    policy = ApprovalPolicy()
    assert (policy.version, policy.min_permission, policy.required_approvals, policy.expiry_s) == (1, "write", 1, None)
    assert policy.refusal("alice", "write", nobody) is None
    assert policy.refusal("alice", "maintain", nobody) is None
    assert policy.refusal("bob", "triage", nobody) == (
        "bob has the triage role on the repository; approval policy v1 requires write or more"
    )


def test_maintain_is_told_from_write() -> None:
    policy = ApprovalPolicy(version=4, min_permission="maintain")
    assert policy.refusal("alice", "maintain", nobody) is None
    assert policy.refusal("alice", "admin", nobody) is None
    refused = policy.refusal("bob", "write", nobody)
    assert refused is not None and "approval policy v4 requires maintain" in refused


def test_allow_lists_admit_named_users_and_active_team_members_only() -> None:
    policy = ApprovalPolicy(allowed_users=("Alice",), allowed_teams=("acme/release",))
    asked: list[str] = []

    def member_of(team: str) -> bool:
        asked.append(team)
        return team == "acme/release"

    assert policy.refusal("alice", "write", nobody) is None  # logins compare without case, as on GitHub
    assert asked == []
    assert policy.refusal("carol", "write", member_of) is None
    assert asked == ["acme/release"]
    refused = policy.refusal("dave", "admin", nobody)
    assert refused == (
        "dave is not among the approvers approval policy v1 allows (users Alice; members of acme/release)"
    )


def test_the_permission_is_checked_before_any_membership_is_read() -> None:
    def unread(team: str) -> bool:
        raise AssertionError("a membership read for a reviewer without the permission")

    policy = ApprovalPolicy(allowed_teams=("acme/release",))
    refused = policy.refusal("reader", "read", unread)
    assert refused is not None and "requires write" in refused


def test_a_membership_read_that_fails_fails_the_check() -> None:
    def unanswered(team: str) -> bool:
        raise TimeoutError("the forge did not answer")

    with pytest.raises(TimeoutError):
        ApprovalPolicy(allowed_teams=("acme/release",)).refusal("carol", "write", unanswered)


@pytest.mark.parametrize(
    "fields",
    [
        {"required_approvals": 0},
        {"version": 0},
        {"expiry_s": 0},
        {"min_permission": "triage"},
        {"allowed_teams": ["release"]},
        {"required_approval": 2},
    ],
)
def test_a_malformed_or_misspelt_policy_is_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ApprovalPolicy.model_validate(fields)


def test_expiry_bounds_how_long_an_approval_stands_and_is_stamped_on_it() -> None:
    policy = ApprovalPolicy(version=3, expiry_s=3600)
    submitted = NOW - timedelta(minutes=30)
    assert policy.stands(submitted, NOW)
    assert not policy.stands(NOW - timedelta(hours=1), NOW)
    assert not policy.stands(None, NOW)  # its age is unknown
    assert ApprovalPolicy().stands(None, NOW)
    assert policy.stamp("2026-03-01T11:30:00Z") == {"policy_version": 3, "expires_at": NOW + timedelta(minutes=30)}
    assert policy.stamp(None, now=NOW) == {"policy_version": 3, "expires_at": NOW + timedelta(hours=1)}
    assert ApprovalPolicy().stamp("2026-03-01T11:30:00Z") == {"policy_version": 1, "expires_at": None}


def test_stricter_takes_the_stricter_of_each_rule_whichever_side_it_is_on() -> None:
    run = ApprovalPolicy(version=2, min_permission="maintain", required_approvals=1, expiry_s=600)
    worker = ApprovalPolicy(version=5, min_permission="write", required_approvals=3, expiry_s=None)
    for combined in (stricter(run, worker), stricter(worker, run)):
        assert (combined.version, combined.min_permission, combined.required_approvals, combined.expiry_s) == (
            5,
            "maintain",
            3,
            600,
        )
        assert not combined.restricted
        assert combined.refusal("alice", "maintain", nobody) is None
        refused = combined.refusal("bob", "write", nobody)
        assert refused is not None and "requires maintain" in refused
        assert not combined.stands(NOW - timedelta(minutes=11), NOW)
    assert stricter(worker, worker) is worker
    assert stricter(ApprovalPolicy(expiry_s=60), ApprovalPolicy(expiry_s=30)).expiry_s == 30


def test_stricter_keeps_the_one_allow_list_and_admits_only_whom_both_lists_admit() -> None:
    open_run = ApprovalPolicy()
    release = ApprovalPolicy(version=3, allowed_users=("Alice", "bob"), allowed_teams=("acme/release",))
    only_worker = stricter(open_run, release)
    assert (only_worker.allowed_users, only_worker.allowed_teams) == (("Alice", "bob"), ("acme/release",))
    assert only_worker.refusal("carol", "admin", nobody) is not None
    assert only_worker.refusal("alice", "write", nobody) is None

    security = ApprovalPolicy(version=4, allowed_users=("ALICE", "dave"), allowed_teams=("acme/security",))
    both = stricter(release, security)
    assert (both.allowed_users, both.allowed_teams) == (("Alice",), ())
    assert both.label == "approval policy v3 with approval policy v4"

    def member_of(login: str) -> Callable[[str], bool]:
        teams = {"bob": {"acme/security"}, "erin": {"acme/release"}, "frank": {"acme/release", "acme/security"}}
        return lambda team: team in teams.get(login, set())

    # Each admitted by both lists (alice named twice; bob named by one and a member of the other's team; frank
    # a member of both teams), where the intersection of the names alone would admit only alice.
    for login in ("alice", "bob", "frank"):
        assert both.refusal(login, "write", member_of(login)) is None, login
    # Admitted by one list only: refused, naming the policy that refuses.
    for login in ("dave", "erin"):
        refused = both.refusal(login, "admin", member_of(login))
        assert refused is not None and "is not among the approvers approval policy v" in refused, login

    # Lists with nobody in common admit nobody (an empty intersection never reads as "anyone").
    disjoint = stricter(ApprovalPolicy(allowed_users=("alice",)), ApprovalPolicy(allowed_users=("bob",)))
    assert disjoint.restricted
    assert disjoint.refusal("alice", "admin", nobody) is not None
    assert disjoint.refusal("bob", "admin", nobody) is not None
    assert disjoint.refusal("carol", "admin", nobody) is not None


def test_forge_approval_under_the_stricter_policy_needs_the_workers_count() -> None:
    run, worker = ApprovalPolicy(version=2), ApprovalPolicy(version=6, required_approvals=2)
    one = forge_approval(
        pull(review(1, "alice")), HEAD, bot_login=BOT, policy=stricter(run, worker), refusal=writers_only, now=NOW
    )
    assert not one.approved
    assert one.detail == f"1 of 2 approvals of {HEAD[:12]} on the forge (approved by alice)"


def review(review_id: int, user: str, state: str = "APPROVED", commit: str = HEAD, minutes_ago: int = 5) -> ReviewInfo:
    return ReviewInfo(
        id=review_id, user=user, state=state, commit_id=commit, submitted_at=NOW - timedelta(minutes=minutes_ago)
    )


def pull(*reviews: ReviewInfo, author: str = BOT) -> PullState:
    return PullState(
        number=7,
        state="open",
        draft=False,
        merged=False,
        merge_commit_sha=None,
        head_ref="durafix/fix",
        base_ref="main",
        head_sha=HEAD,
        mergeable=True,
        reviews=list(reviews),
        run_id="repair:o/r#1",
        author=author,
    )


def writers_only(login: str) -> str | None:
    return None if login in ("alice", "bob", "carol") else f"{login} has the read role"


def test_two_distinct_approvals_are_needed_when_the_policy_requires_two() -> None:
    policy = ApprovalPolicy(version=2, required_approvals=2)
    one = forge_approval(
        pull(review(1, "alice"), review(2, "alice", minutes_ago=1)),
        HEAD,
        bot_login=BOT,
        policy=policy,
        refusal=writers_only,
        now=NOW,
    )
    assert not one.approved and one.approved_by == ("alice",)
    assert one.detail == f"1 of 2 approvals of {HEAD[:12]} on the forge (approved by alice)"

    two = forge_approval(
        pull(review(1, "alice"), review(3, "bob")), HEAD, bot_login=BOT, policy=policy, refusal=writers_only, now=NOW
    )
    assert two.approved and two.detail == "approved on the forge by alice, bob (2 of 2 approvals)"


def test_only_permitted_standing_approvals_of_the_head_count() -> None:
    policy = ApprovalPolicy(required_approvals=2, expiry_s=600)
    check = forge_approval(
        pull(
            review(1, "alice"),
            review(2, "bob", commit=OLD),
            review(3, "carol", minutes_ago=20),
            review(4, "reader"),
            review(5, BOT),
            review(6, "dave"),
            review(7, "dave", state="DISMISSED", minutes_ago=1),
        ),
        HEAD,
        bot_login=BOT,
        policy=policy,
        refusal=writers_only,
        now=NOW,
    )
    assert check.approved_by == ("alice",) and check.counted == "1 of 2 approvals"
    assert check.reasons == (
        f"bob approved {OLD[:12]}, not this head",
        "carol's approval expired (approval policy v1 lets one stand 600s)",
        "dave's latest review is dismissed",
        f"{BOT}'s own review does not count",
        "reader lacks the permission to approve: reader has the read role",
    )


def test_nothing_on_another_authors_pr_counts() -> None:
    check = forge_approval(
        pull(review(1, "alice"), author="mallory"),
        HEAD,
        bot_login=BOT,
        policy=ApprovalPolicy(),
        refusal=writers_only,
        now=NOW,
    )
    assert not check.approved
    assert check.detail.startswith(f"no approving review of {HEAD[:12]} on the forge (PR #7 is authored by 'mallory'")
    assert check.detail.endswith("; 0 of 1 approvals)")


def test_the_configuration_takes_a_policy_as_json_and_keeps_the_permission_shorthand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert DurafixConfig(state_dir=tmp_path).approval_policy_in_force() == ApprovalPolicy()
    shorthand = DurafixConfig(state_dir=tmp_path, approver_permission="admin")
    assert shorthand.approval_policy_in_force() == ApprovalPolicy(min_permission="admin")

    monkeypatch.setenv("DURAFIX_APPROVAL_POLICY", json.dumps({"version": 5, "required_approvals": 2}))
    monkeypatch.setenv("DURAFIX_APPROVER_PERMISSION", "admin")
    loaded = load_config(tmp_path)
    # A policy naming no min_permission takes the shorthand's.
    assert loaded.approval_policy_in_force() == ApprovalPolicy(version=5, required_approvals=2, min_permission="admin")

    monkeypatch.setenv("DURAFIX_APPROVAL_POLICY", json.dumps({"version": 6, "min_permission": "maintain"}))
    assert load_config(tmp_path).approval_policy_in_force().min_permission == "maintain"

    monkeypatch.setenv("DURAFIX_APPROVAL_POLICY", json.dumps({"versoin": 6}))
    with pytest.raises(ValidationError):
        load_config(tmp_path)


def test_a_saved_configuration_keeps_its_policy(tmp_path: Path) -> None:
    policy = ApprovalPolicy(version=2, allowed_teams=("acme/release",), expiry_s=86400)
    DurafixConfig(state_dir=tmp_path, approval_policy=policy).save()
    assert load_config(tmp_path).approval_policy_in_force() == policy
