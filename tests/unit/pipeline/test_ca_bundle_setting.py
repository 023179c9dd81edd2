"""``DURAFIX_CA_BUNDLE``: the system bundle by default, a path, or ``none``."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import load_config


def test_the_setting_defaults_to_the_system_bundle_and_none_means_debians_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DURAFIX_CA_BUNDLE", raising=False)
    assert load_config(tmp_path).ca_bundle_path() == Path("/etc/ssl/certs/ca-certificates.crt")
    monkeypatch.setenv("DURAFIX_CA_BUNDLE", "none")
    assert load_config(tmp_path).ca_bundle_path() is None
    monkeypatch.setenv("DURAFIX_CA_BUNDLE", "/srv/ca.pem")
    assert load_config(tmp_path).ca_bundle_path() == Path("/srv/ca.pem")
