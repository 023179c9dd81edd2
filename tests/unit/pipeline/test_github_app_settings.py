"""The GitHub App settings: read from the environment, and every half or unusable configuration refused with a
message naming the setting and what to do, never the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from pipeline.config import DurafixConfig, load_config
from pipeline.github_app import GitHubAppSettingsError, installation_tokens


def _pem(path: Path) -> Path:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return path


def test_settings_come_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pem = _pem(tmp_path / "app.pem")
    monkeypatch.setenv("DURAFIX_GITHUB_APP_ID", "123")
    monkeypatch.setenv("DURAFIX_GITHUB_APP_PRIVATE_KEY_FILE", str(pem))
    monkeypatch.setenv("DURAFIX_GITHUB_APP_INSTALLATION_ID", "45")
    config = load_config(tmp_path / "state")
    assert (config.github_app_id, config.github_app_installation_id) == (123, 45)
    tokens = installation_tokens(config)
    assert tokens is not None and tokens.app_id == 123 and tokens.installation_for("any/repo") == 45
    assert config.forge_credentials_configured()


def test_no_app_means_the_token_is_used(tmp_path: Path) -> None:
    assert installation_tokens(DurafixConfig(state_dir=tmp_path)) is None


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"github_app_id": 1}, "DURAFIX_GITHUB_APP_PRIVATE_KEY_FILE (github_app_private_key_file) is not"),
        ({"github_app_private_key_file": "/k.pem"}, "DURAFIX_GITHUB_APP_ID (github_app_id) is not"),
        ({"github_app_id": 1, "github_app_private_key_file": "app.pem"}, "must be an absolute path"),
        ({"github_app_id": 1, "github_app_private_key_file": "/nonexistent/app.pem"}, "cannot read /nonexistent"),
    ],
)
def test_half_or_unusable_settings_name_the_setting(tmp_path: Path, settings: dict[str, object], expected: str) -> None:
    with pytest.raises(GitHubAppSettingsError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        installation_tokens(DurafixConfig.model_validate({"state_dir": tmp_path, **settings}))


def test_a_file_without_a_private_key_is_refused_without_quoting_it(tmp_path: Path) -> None:
    bad = tmp_path / "app.pem"
    bad.write_text("-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWJ1dC1ub3QtYS1rZXk=\n-----END PRIVATE KEY-----\n")
    with pytest.raises(GitHubAppSettingsError) as err:
        installation_tokens(DurafixConfig(state_dir=tmp_path, github_app_id=1, github_app_private_key_file=str(bad)))
    assert "holds no unencrypted PEM private key" in str(err.value)
    assert "c2VjcmV0" not in str(err.value) and err.value.__cause__ is None
