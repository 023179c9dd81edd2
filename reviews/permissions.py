"""Repository permissions and roles as GitHub's collaborator-permission API names them, ordered least first."""

from __future__ import annotations

from typing import Literal, get_args

# A user's permission on a repository as GitHub's collaborator-permission API names it (maintain is
# reported as write, triage as read), listed from least to most, so an index compares two of them.
RepoPermission = Literal["none", "read", "write", "admin"]
REPO_PERMISSIONS: tuple[RepoPermission, ...] = get_args(RepoPermission)
# A user's role on a repository as the same API's `role_name` names it (GitHub's five base roles), least first.
RepoRole = Literal["none", "read", "triage", "write", "maintain", "admin"]
REPO_ROLES: tuple[RepoRole, ...] = get_args(RepoRole)
# The base role a legacy permission guarantees at least (a custom role names its base permission only).
ROLE_OF_PERMISSION: dict[RepoPermission, RepoRole] = {
    "none": "none",
    "read": "read",
    "write": "write",
    "admin": "admin",
}


def role_at_least(role: RepoRole, required: RepoRole) -> bool:
    """Whether `role` includes everything `required` may do (GitHub's roles are ordered)."""
    return REPO_ROLES.index(role) >= REPO_ROLES.index(required)


def permission_at_least(permission: RepoPermission, required: RepoPermission) -> bool:
    """Whether `permission` includes everything `required` may do."""
    return REPO_PERMISSIONS.index(permission) >= REPO_PERMISSIONS.index(required)
