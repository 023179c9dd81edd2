"""The spacing between a worker's forge writes: GitHub's one second unless the operator sets another
(``DURAFIX_FORGE_SECONDS_BETWEEN_WRITES``), and the worker's adapter keeps what is set."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from pipeline.config import DurafixConfig, load_config
from pipeline.services import Services
from reviews.config import ForgeConfig
from reviews.transport import Transport


def sleeps_between_two_writes(spacing: float, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """What the adapter's client slept for around two writes sent one after the other."""
    slept: list[float] = []
    monkeypatch.setattr("reviews.transport.time.sleep", slept.append)
    client = Transport(
        ForgeConfig(
            api_url="http://127.0.0.1:9/api/v3",
            token=SecretStr("t"),
            repository="alice/shop",
            git_url="http://127.0.0.1:9/alice/shop.git",
            seconds_between_writes=spacing,
        )
    )
    for _ in range(2):
        with client.write_slot():
            pass
    return slept


def test_the_second_write_waits_out_the_spacing_and_none_waits_without_one(monkeypatch: pytest.MonkeyPatch) -> None:
    [waited] = sleeps_between_two_writes(30.0, monkeypatch)
    assert 29.0 < waited <= 30.0
    assert sleeps_between_two_writes(0.0, monkeypatch) == []


def test_the_setting_comes_from_the_environment_and_reaches_the_workers_forge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert DurafixConfig(state_dir=tmp_path).forge_seconds_between_writes == 1.0
    monkeypatch.setenv("DURAFIX_FORGE_SECONDS_BETWEEN_WRITES", "0")
    monkeypatch.setenv("DURAFIX_FORGE_TOKEN", "t")
    config = load_config(tmp_path / "state")
    assert config.forge_seconds_between_writes == 0.0
    assert Services(config).forge("alice/shop").config.seconds_between_writes == 0.0
