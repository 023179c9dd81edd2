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
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, field_validator

from reviews.permissions import RepoRole, role_at_least

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
