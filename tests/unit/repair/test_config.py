"""``ModelConfig.from_env`` reads the endpoint, key and model, and names what is missing."""

from __future__ import annotations

import pytest

from repair.config import DEFAULT_BASE_URL, ModelConfig


def test_reads_endpoint_key_model_and_timeout() -> None:
    config = ModelConfig.from_env(
        {
            "OPENAI_BASE_URL": "http://127.0.0.1:9999/v1",
            "OPENAI_API_KEY": "k",
            "DURAFIX_MODEL": "small-model",
            "DURAFIX_MODEL_TIMEOUT_S": "2.5",
        }
    )
    assert config == ModelConfig(base_url="http://127.0.0.1:9999/v1", api_key="k", model="small-model", timeout_s=2.5)
    assert "k" not in repr(config).replace("base_url", "").replace("model", "").replace("timeout_s", "")


def test_base_url_defaults_to_openai() -> None:
    assert ModelConfig.from_env({"OPENAI_API_KEY": "k", "DURAFIX_MODEL": "m"}).base_url == DEFAULT_BASE_URL


def test_missing_key_and_model_are_named() -> None:
    with pytest.raises(ValueError, match="OPENAI_API_KEY and DURAFIX_MODEL"):
        ModelConfig.from_env({"OPENAI_BASE_URL": "http://x/v1"})


def test_non_positive_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        ModelConfig.from_env({"OPENAI_API_KEY": "k", "DURAFIX_MODEL": "m", "DURAFIX_MODEL_TIMEOUT_S": "0"})
