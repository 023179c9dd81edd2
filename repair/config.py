"""Which OpenAI-compatible endpoint and model the repair engine uses, read from the environment.

- ``OPENAI_BASE_URL``: the endpoint's base URL, ending in ``/v1`` (default: OpenAI's own).
- ``OPENAI_API_KEY``: sent as ``Authorization: Bearer``; required.
- ``DURAFIX_MODEL``: the model name the endpoint serves; required.
- ``DURAFIX_MODEL_TIMEOUT_S``: seconds one model request may take before it counts as a transient failure.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, Field

DEFAULT_BASE_URL = "https://api.openai.com/v1"


class ModelConfig(BaseModel):
    base_url: str = DEFAULT_BASE_URL
    api_key: str = Field(min_length=1, repr=False)
    model: str = Field(min_length=1)
    timeout_s: float = Field(default=120.0, gt=0)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ModelConfig:
        """Read the variables above from ``env`` (default ``os.environ``); ``ValueError`` names what is missing."""
        source = os.environ if env is None else env
        missing = [name for name in ("OPENAI_API_KEY", "DURAFIX_MODEL") if not source.get(name)]
        if missing:
            raise ValueError(f"model configuration incomplete: set {' and '.join(missing)}")
        values = {
            "base_url": source.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL,
            "api_key": source["OPENAI_API_KEY"],
            "model": source["DURAFIX_MODEL"],
        }
        if timeout := source.get("DURAFIX_MODEL_TIMEOUT_S"):
            values["timeout_s"] = timeout
        return cls.model_validate(values)
