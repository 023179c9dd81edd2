"""The approval policy: who may approve a durafix PR, how many of them must, and for how long an approval stands.

Pure and typed: the callers read what it needs from the forge (a reviewer's role, their team memberships) and
pass it in. A policy is versioned by the operator (``version``, an integer raised whenever the rules change), and
every approval the webhook receiver sends records the version that admitted it (``Approval.policy_version``), so
a run's history says under which rules it was approved.

The rules, applied to every reviewer whose decision (an approval or a request for changes) would count:

- the reviewer holds at least ``min_permission`` on the repository (``write``, ``maintain`` or ``admin``: the
  repository role, so ``maintain`` is told from ``write``);
- when ``allowed_users`` or ``allowed_teams`` names anyone, the reviewer is one of ``allowed_users`` (logins,
  compared as GitHub does, without case) or an active member of one of ``allowed_teams`` (``org/team-slug``);
  with both empty, anyone with the permission may approve;
- an approval stands for ``expiry_s`` seconds after it was submitted (None: until it is dismissed or superseded);
- a head is approved when ``required_approvals`` distinct permitted reviewers have a standing approval of it.

Two policies combine with :func:`stricter`: the merge applies the stricter of the run's (the one it started
with) and the merging worker's configured one, so a run started with a weaker policy in its input (by anyone who
can reach Temporal) merges nothing the worker's policy would refuse.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, field_validator

from reviews.permissions import REPO_ROLES, RepoRole, role_at_least

ApproverPermission = Literal["write", "maintain", "admin"]
# GitHub's team slugs and organisation logins: letters, digits and hyphens (slugs may also hold underscores).
_TEAM = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?/[A-Za-z0-9_-]+$")


class ApprovalStamp(TypedDict):
    """What an approval records of the policy that admitted it (the fields of ``Approval`` of the same names)."""

    policy_version: int
    expires_at: datetime | None


class ApprovalPolicy(BaseModel):
    """One version of the rules above. Immutable; an unknown key is refused, so a misspelt rule never loosens one."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = Field(default=1, ge=1)
    min_permission: ApproverPermission = "write"
    allowed_users: tuple[str, ...] = ()
    allowed_teams: tuple[str, ...] = ()
    required_approvals: int = Field(default=1, ge=1)
    expiry_s: float | None = Field(default=None, gt=0)

    @field_validator("allowed_teams")
    @classmethod
    def _teams(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for team in value:
            if not _TEAM.match(team):
                raise ValueError(f"allowed_teams: {team!r} is not an org/team-slug")
        return value

    @property
    def label(self) -> str:
        """How answers name the policy: ``approval policy v3``."""
        return f"approval policy v{self.version}"

    @property
    def restricted(self) -> bool:
        """Whether an allow-list narrows who may approve (beyond the permission)."""
        return bool(self.allowed_users or self.allowed_teams)

    def allows_user(self, login: str) -> bool:
        return login.casefold() in {user.casefold() for user in self.allowed_users}

    def refusal(self, reviewer: str, role: RepoRole, member_of: Callable[[str], bool]) -> str | None:
        """None when ``reviewer``, holding ``role`` on the repository, may approve under this policy; otherwise
        why not (a sentence naming the policy). ``member_of(team)`` answers whether the reviewer is an active
        member of ``team`` (``org/team-slug``); it is called only for the policy's teams, only when the
        permission holds and the reviewer is not an allowed user, and may raise (an unanswered read must not
        become a permission)."""
        if not role_at_least(role, self.min_permission):
            return (
                f"{reviewer} has the {role} role on the repository; {self.label} requires {self.min_permission} or more"
            )
        if not self.restricted or self.allows_user(reviewer):
            return None
        if any(member_of(team) for team in self.allowed_teams):
            return None
        return f"{reviewer} is not among the approvers {self.label} allows ({self._allowed()})"

    def _allowed(self) -> str:
        parts = []
        if self.allowed_users:
            parts.append("users " + ", ".join(self.allowed_users))
        if self.allowed_teams:
            parts.append("members of " + ", ".join(self.allowed_teams))
        return "; ".join(parts)

    def expires_at(self, approved_at: datetime) -> datetime | None:
        """When an approval submitted at ``approved_at`` stops standing (None: it does not expire)."""
        if self.expiry_s is None:
            return None
        return approved_at + timedelta(seconds=self.expiry_s)

    def stands(self, approved_at: datetime | None, now: datetime) -> bool:
        """Whether an approval submitted at ``approved_at`` still stands at ``now`` (one without a submission
        time stands only under a policy without expiry: its age is unknown)."""
        if self.expiry_s is None:
            return True
        if approved_at is None:
            return False
        end = self.expires_at(_aware(approved_at))
        return end is not None and now < end

    def stamp(self, submitted_at: str | datetime | None, now: datetime | None = None) -> ApprovalStamp:
        """What an approval submitted at ``submitted_at`` (an ISO 8601 time as a webhook carries it; None: ``now``)
        records: this policy's version, and when it expires under it."""
        when = _parse(submitted_at) if submitted_at else None
        return {"policy_version": self.version, "expires_at": self.expires_at(when or now or datetime.now(UTC))}


def _parse(value: str | datetime) -> datetime:
    return _aware(value if isinstance(value, datetime) else datetime.fromisoformat(value))


def _aware(value: datetime) -> datetime:
    # The forge's times are UTC; one read without an offset is taken as UTC rather than as local time.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class StricterPolicy(ApprovalPolicy):
    """Two policies at once (made by :func:`stricter`): a reviewer is admitted only when each of ``parts``
    admits them, and the scalar rules are the stricter of the two. ``allowed_users`` and ``allowed_teams`` show
    the allow-lists' intersection; :meth:`refusal` applies each part's own lists, which is exact where the
    intersection of the two ``users or teams`` rules cannot be written as one."""

    parts: tuple[ApprovalPolicy, ApprovalPolicy]

    @property
    def label(self) -> str:
        first, second = self.parts
        if first.label == second.label:
            return first.label
        return f"{first.label} with {second.label}"

    @property
    def restricted(self) -> bool:
        return any(part.restricted for part in self.parts)

    def allows_user(self, login: str) -> bool:
        return all(part.allows_user(login) for part in self.parts if part.restricted)

    def refusal(self, reviewer: str, role: RepoRole, member_of: Callable[[str], bool]) -> str | None:
        """The first refusal of the combined permission, then of each part (its allow-lists): None only when
        both policies admit ``reviewer``."""
        if not role_at_least(role, self.min_permission):
            return (
                f"{reviewer} has the {role} role on the repository; {self.label} requires {self.min_permission} or more"
            )
        for part in self.parts:
            refused = part.refusal(reviewer, role, member_of)
            if refused is not None:
                return refused
        return None


def stricter(a: ApprovalPolicy, b: ApprovalPolicy) -> ApprovalPolicy:
    """The policy that admits a merge only when both ``a`` and ``b`` would: the higher ``min_permission``, the
    larger ``required_approvals``, the shorter ``expiry_s`` (None only when both are None), the higher
    ``version``, and a reviewer admitted only when each policy's allow-lists admit them (where only one policy
    restricts, its lists; where both do, the intersection: see :class:`StricterPolicy`). Equal policies give
    ``a`` itself, so a run whose policy is the worker's reads exactly as before."""
    if a == b:
        return a
    permission = max(a.min_permission, b.min_permission, key=REPO_ROLES.index)
    expiries = [expiry for expiry in (a.expiry_s, b.expiry_s) if expiry is not None]
    if a.restricted and b.restricted:
        b_users = {user.casefold() for user in b.allowed_users}
        users = tuple(user for user in a.allowed_users if user.casefold() in b_users)
        b_teams = {team.casefold() for team in b.allowed_teams}
        teams = tuple(team for team in a.allowed_teams if team.casefold() in b_teams)
    else:
        users = a.allowed_users or b.allowed_users
        teams = a.allowed_teams or b.allowed_teams
    return StricterPolicy(
        version=max(a.version, b.version),
        min_permission=permission,
        allowed_users=users,
        allowed_teams=teams,
        required_approvals=max(a.required_approvals, b.required_approvals),
        expiry_s=min(expiries) if expiries else None,
        parts=(a, b),
    )
