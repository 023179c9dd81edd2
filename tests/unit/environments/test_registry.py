from __future__ import annotations

from pathlib import Path

import pytest

from environments.local import LocalProcessProvider
from environments.registry import ProviderUnavailableError, get_provider


def test_the_local_provider_is_available_by_name(tmp_path: Path) -> None:
    provider = get_provider("local", tmp_path / "state")
    assert isinstance(provider, LocalProcessProvider)
    assert provider.name == "local" and provider.state_dir == tmp_path / "state"


def test_an_unknown_provider_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown environment provider 'kubernetes'"):
        get_provider("kubernetes", tmp_path)


def test_the_docker_provider_needs_an_engine_address(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    with pytest.raises(ProviderUnavailableError, match="docker_host"):
        get_provider("docker", tmp_path)
