"""Which worker variables setup commands may see: the operator's patterns, and durafix's own secrets never."""

from __future__ import annotations

import pytest

from environments.passthrough import (
    DEFAULT_PATTERNS,
    PassthroughError,
    check_patterns,
    never_passed,
    parse_patterns,
    passed_through,
)

WORKER_VARS = {
    "PIP_INDEX_URL": "https://pypi.internal.example/simple",
    "HTTPS_PROXY": "http://proxy.internal.example:3128",
    "npm_config_registry": "https://npm.internal.example/",
    "PIP_PASSWORD": "pip-secret",
    "npm_config__authToken": "npm-secret",
    "DURAFIX_FORGE_TOKEN": "forge-secret",
    "OPENAI_API_KEY": "model-secret",
    "UNRELATED_SETTING": "not asked for",
}


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("*", "DURAFIX_"),
        ("*_PROXY", "DURAFIX_"),
        ("D*", "DURAFIX_"),
        ("DURAFIX_STATE_DIR", "DURAFIX_"),
        ("?URAFIX_*", "DURAFIX_"),
        ("[DX]URAFIX_*", "DURAFIX_"),
        ("OPENAI_*", "OPENAI_"),
        ("openai_*", "OPENAI_"),
        ("NPM_TOKEN", "credential"),
        ("GITHUB_TOKEN", "credential"),
        ("PIP_PASSWORD", "credential"),
        ("AWS_SECRET_ACCESS_KEY", "credential"),
        ("npm_config__auth", "credential"),
        ("PIP INDEX", "not a variable-name glob"),
    ],
)
def test_patterns_that_could_reach_durafixs_secrets_are_refused(pattern: str, why: str) -> None:
    with pytest.raises(PassthroughError, match=why):
        parse_patterns(f"PIP_*,{pattern}")


def test_the_default_patterns_and_the_variables_form_are_accepted() -> None:
    assert check_patterns(DEFAULT_PATTERNS) == DEFAULT_PATTERNS
    assert parse_patterns(" PIP_*, HTTPS_PROXY,,PIP_* ") == ("PIP_*", "HTTPS_PROXY")
    assert parse_patterns("none") == ()
    assert parse_patterns("") == ()


def test_matching_variables_pass_but_never_durafixs_own_or_credentials() -> None:
    passed = passed_through(["PIP_*", "HTTPS_PROXY", "npm_config_*"], {**WORKER_VARS, "GIT_AUTHOR_NAME": "x"})
    assert passed == {
        "PIP_INDEX_URL": WORKER_VARS["PIP_INDEX_URL"],
        "HTTPS_PROXY": WORKER_VARS["HTTPS_PROXY"],
        "npm_config_registry": WORKER_VARS["npm_config_registry"],
    }
    assert never_passed("UV_INDEX_PRIVATE_PASSWORD") and never_passed("durafix_x") and not never_passed("UV_CACHE_DIR")
