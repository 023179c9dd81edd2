"""Connection and policy settings for the forge adapter."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator


class ForgeConfig(BaseModel):
    """How to reach one repository on GitHub or GitHub Enterprise.

    `api_url` is the REST base PyGithub is given (`https://api.github.com` or `https://HOST/api/v3`);
    PyGithub derives the GraphQL endpoint from it. `git_url` is the clone URL pushes go to.

    Retries: only reads (GET/HEAD) are retried inside the client, on 500/502/504 and on network errors;
    connection attempts that never reached the server are retried for every method because nothing was
    sent. Mutations are never re-sent by the client: a mutation whose outcome is unknown surfaces as
    `ForgeAmbiguousError` and each operation reconciles it against GitHub's state. Rate limits are not
    slept on here: they surface as `ForgeTransientError.retry_after_s` for the caller's retry policy.
    """

    api_url: str
    token: SecretStr
    repository: str = Field(description="OWNER/REPO")
    git_url: str
    bot_login: str | None = Field(
        default=None,
        description="login whose marked comments and PRs count as ours; defaults to the token's user",
    )
    request_timeout_s: int = 15
    read_retries: int = 3
    retry_backoff_s: float = 0.5
    seconds_between_requests: float = 0.0
    # GitHub asks integrators to space mutations by at least one second to stay clear of secondary limits.
    seconds_between_writes: float = 1.0
    claim_lease_s: float = 120.0
    claim_wait_s: float = 15.0
    claim_poll_s: float = 0.5
    push_timeout_s: float = 300.0
    push_attempts: int = Field(default=2, ge=1)
    # GitHub answers 405 "Base branch was modified" when a push to the base lands during a merge; the merge
    # is read again and re-sent up to this many times in all, waiting `merge_retry_wait_s` times the attempt.
    merge_attempts: int = Field(default=3, ge=1)
    merge_retry_wait_s: float = 1.0
    # `mergeable` is null while GitHub computes it after a push; a PR read is repeated (conditionally, so an
    # unchanged answer is a 304 that costs no rate limit) up to this many times in all, `mergeable_poll_s` apart.
    mergeable_reads: int = Field(default=5, ge=1)
    mergeable_poll_s: float = 1.0

    @field_validator("repository")
    @classmethod
    def _owner_and_name(cls, value: str) -> str:
        owner, sep, name = value.partition("/")
        if not sep or not owner or not name or "/" in name:
            raise ValueError(f"repository must be OWNER/REPO, got {value!r}")
        return value

    @model_validator(mode="after")
    def _lease_outlives_requests(self) -> Self:
        # A holder sends its create only while less than half the lease has passed since it fenced the
        # claim; the lease must also cover that request's own timeout, or a successor could take over
        # while the create is still in flight.
        if self.claim_lease_s <= 2 * self.request_timeout_s:
            raise ValueError("claim_lease_s must exceed twice request_timeout_s")
        return self

    @property
    def owner(self) -> str:
        return self.repository.split("/", 1)[0]
