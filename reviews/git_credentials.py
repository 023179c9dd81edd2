"""Where git over HTTPS gets its token: a fixed token (personal, fine-grained or classic), or a GitHub App's
installation tokens, which expire and are asked for afresh each time git needs one.

Contract: `token_for(clone_url)` is called right before each git command that talks to the forge and answers the
token to send for that repository (None: anonymous). `known_tokens()` lists every token value handed out so
far that may still be valid, so output can be redacted of them. Implementations are thread-safe.
"""

from __future__ import annotations

from typing import Protocol


class GitCredentials(Protocol):
    def token_for(self, clone_url: str) -> str | None: ...

    def known_tokens(self) -> list[str]: ...


class StaticGitToken:
    """One token for every repository (``DURAFIX_FORGE_TOKEN``), or none."""

    def __init__(self, token: str | None) -> None:
        self._token = token or None

    def token_for(self, clone_url: str) -> str | None:
        return self._token

    def known_tokens(self) -> list[str]:
        return [self._token] if self._token else []


NO_GIT_CREDENTIALS = StaticGitToken(None)
