"""The forge adapter: tickets, branches, draft PRs, keyed comments, reviews and merges on GitHub."""

from reviews.adapter import GitHubForge
from reviews.config import ForgeConfig
from reviews.errors import (
    ForgeAmbiguousError,
    ForgeConflictError,
    ForgeError,
    ForgeNotFoundError,
    ForgePermanentError,
    ForgeTransientError,
)
from reviews.interface import ForgePort
from reviews.markers import run_branch_prefix
from reviews.models import (
    CommentRef,
    MergeResult,
    MergeStatus,
    PublishResult,
    PullRef,
    PullState,
    ReviewInfo,
    RunFootprint,
    Ticket,
)

__all__ = [
    "CommentRef",
    "ForgeAmbiguousError",
    "ForgeConfig",
    "ForgeConflictError",
    "ForgeError",
    "ForgeNotFoundError",
    "ForgePermanentError",
    "ForgePort",
    "ForgeTransientError",
    "GitHubForge",
    "MergeResult",
    "MergeStatus",
    "PublishResult",
    "PullRef",
    "PullState",
    "ReviewInfo",
    "RunFootprint",
    "Ticket",
    "run_branch_prefix",
]
