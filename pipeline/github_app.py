"""The GitHub App settings, checked: ``github_app_id``, ``github_app_private_key_file`` (an absolute path to the
App's PEM private key) and the optional ``github_app_installation_id``.

Contract: `installation_tokens(config)` is None when no App is configured (``forge_token`` is used, unchanged),
else the worker's one `reviews.app_tokens.InstallationTokens`. A half or unusable configuration raises
`GitHubAppSettingsError` naming the setting (variable and ``config.json`` key) and what to do: an App ID
without a key file (or a key file without an App ID), a key path that is not absolute, a file that is missing or
unreadable, a file that holds no unencrypted PEM private key. Messages name paths, never key material.
"""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives.serialization import load_pem_private_key
from pydantic import SecretStr

from pipeline.config import DurafixConfig, SettingsError
from reviews.app_tokens import InstallationTokens

APP_ID = "DURAFIX_GITHUB_APP_ID (github_app_id)"
KEY_FILE = "DURAFIX_GITHUB_APP_PRIVATE_KEY_FILE (github_app_private_key_file)"


class GitHubAppSettingsError(SettingsError):
    """The GitHub App settings are incomplete or name a key file that cannot be used."""


def installation_tokens(config: DurafixConfig) -> InstallationTokens | None:
    if config.github_app_id is None:
        if config.github_app_private_key_file:
            raise GitHubAppSettingsError(
                f"{KEY_FILE} is set but {APP_ID} is not: set it to the App's ID (the App's settings page shows it)"
            )
        return None
    return InstallationTokens(
        config.forge_api_url,
        config.github_app_id,
        SecretStr(_private_key(config.github_app_private_key_file)),
        config.github_app_installation_id,
    )


def _private_key(path_text: str) -> str:
    if not path_text:
        raise GitHubAppSettingsError(
            f"{APP_ID} is set but {KEY_FILE} is not: set it to the absolute path of the App's private key (the "
            "PEM file GitHub lets you generate on the App's settings page)"
        )
    path = Path(path_text)
    if not path.is_absolute():
        raise GitHubAppSettingsError(f"{KEY_FILE} must be an absolute path, got {path_text!r}")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise GitHubAppSettingsError(
            f"{KEY_FILE}: cannot read {path}: {reason}; make the file readable by the worker's user"
        ) from exc
    try:
        load_pem_private_key(text.encode(), password=None)
    except (ValueError, TypeError):
        # Not chained: the parser's message could quote the file; only the path is named.
        raise GitHubAppSettingsError(
            f"{KEY_FILE}: {path} holds no unencrypted PEM private key; use the .pem file GitHub generated for the App"
        ) from None
    return text
