"""``durafix forge create-repo | add-collaborator | add-webhook | tokens`` against a real emulator over HTTP,
and ``durafix forge serve`` still being the emulator's own command line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import run_command
from pipeline.cli.command import CliError
from pipeline.config import load_config
from tests.support.github_emulator import WEBHOOK_SECRET, Emulator, configured_emulator, record_stack, signed_with


@pytest.fixture
def emulator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Emulator]:
    with configured_emulator(tmp_path, monkeypatch) as handle:
        yield handle


def as_json(emulator: Emulator, capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    assert emulator.durafix("forge", *args, "--json") == 0
    return json.loads(capsys.readouterr().out)


def test_create_repo_creates_it_empty_once(emulator: Emulator, capsys: pytest.CaptureFixture[str]) -> None:
    first = as_json(emulator, capsys, "create-repo", "acme-dev/shop")
    again = as_json(emulator, capsys, "create-repo", "acme-dev/shop")

    assert (first["created"], again["created"]) == (True, False)
    assert first["html_url"] == f"{emulator.forge.base_url}/acme-dev/shop"
    repo = emulator.api("GET", "/repos/acme-dev/shop")
    assert (repo["owner"]["login"], repo["private"]) == ("acme-dev", False)
    # Empty, so any history can be pushed into it.
    assert emulator.api("GET", "/repos/acme-dev/shop/branches") == []

    assert emulator.durafix("forge", "create-repo", "acme-dev/shop") == 0
    assert capsys.readouterr().out.startswith("exists  acme-dev/shop  ")


def test_add_collaborator_sets_the_permission_and_changes_it_on_a_second_call(
    emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    emulator.durafix("forge", "create-repo", "acme-dev/shop")

    assert emulator.durafix("forge", "add-collaborator", "acme-dev/shop", "alice", "--permission", "admin") == 0
    assert capsys.readouterr().out.splitlines()[-1] == "alice has admin on acme-dev/shop"
    # Only callers with push access may read a permission (as on GitHub): ask as the owner.
    owner = emulator.forge.create_token("acme-dev")
    permission = "/repos/acme-dev/shop/collaborators/alice/permission"
    assert emulator.api("GET", permission, owner)["permission"] == "admin"

    result = as_json(emulator, capsys, "add-collaborator", "acme-dev/shop", "alice", "--permission", "push")
    assert result == {"repository": "acme-dev/shop", "login": "alice", "permission": "push", "invited": False}
    assert emulator.api("GET", permission, owner)["permission"] == "write"


def test_add_webhook_keeps_one_hook_per_url_and_signs_with_the_configured_secret(
    emulator: Emulator, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    emulator.durafix("forge", "create-repo", "acme-dev/shop")
    capsys.readouterr()
    url = "http://127.0.0.1:9/webhook"

    first = as_json(emulator, capsys, "add-webhook", "acme-dev/shop", "--url", url)
    # The secret is rotated: the same hook takes the new one.
    monkeypatch.setenv("DURAFIX_WEBHOOK_SECRET", "rotated-secret")
    again = as_json(emulator, capsys, "add-webhook", "acme-dev/shop", "--url", url)
    other = as_json(emulator, capsys, "add-webhook", "acme-dev/shop", "--url", "http://127.0.0.1:10/webhook")

    assert (first["created"], again["created"], other["created"]) == (True, False, True)
    assert again["hook_id"] == first["hook_id"] != other["hook_id"]
    assert first["events"] == ["issues", "issue_comment", "pull_request", "pull_request_review"]
    owner = emulator.forge.create_token("acme-dev")
    hooks = emulator.api("GET", "/repos/acme-dev/shop/hooks", owner)
    assert sorted(h["config"]["url"] for h in hooks) == sorted([url, "http://127.0.0.1:10/webhook"])

    emulator.api("POST", "/repos/acme-dev/shop/issues", owner, {"title": "t", "body": "b"})
    deliveries = emulator.forge.wait_for_deliveries()
    ping, opened = (
        next(d for d in deliveries if d["hook_id"] == first["hook_id"] and d["event"] == event)
        for event in ("ping", "issues")
    )
    assert signed_with(WEBHOOK_SECRET, ping["request"]["body"].encode(), ping["request"]["headers"])
    assert signed_with("rotated-secret", opened["request"]["body"].encode(), opened["request"]["headers"])


def test_a_token_of_the_owner_from_the_environment_acts_where_durafix_cannot_mint_one(
    emulator: Emulator, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = emulator.forge.create_user("alice")
    monkeypatch.delenv("DURAFIX_FORGE_ADMIN_TOKEN")

    with pytest.raises(CliError, match=r"no token to act as alice .*set \$DURAFIX_FORGE_OWNER_TOKEN") as refused:
        emulator.durafix("forge", "create-repo", "alice/shop")
    assert refused.value.code == 2

    monkeypatch.setenv("DURAFIX_FORGE_OWNER_TOKEN", alice)
    assert as_json(emulator, capsys, "create-repo", "alice/shop")["created"] is True
    assert as_json(emulator, capsys, "add-collaborator", "alice/shop", "durafix-bot")["permission"] == "push"
    assert emulator.api("GET", "/repos/alice/shop/collaborators/durafix-bot/permission", alice)["permission"] == "write"


def test_a_refusal_of_the_forge_is_exit_1_with_its_message(emulator: Emulator) -> None:
    with pytest.raises(CliError, match="acme-dev is not a user of the emulator at") as unknown:
        emulator.durafix("forge", "add-collaborator", "acme-dev/nothing", "bob")
    assert unknown.value.code == 1
    emulator.forge.create_user("acme-dev")
    with pytest.raises(CliError, match=r"PUT .*/repos/acme-dev/nothing/collaborators/bob -> 404: Not Found") as err:
        emulator.durafix("forge", "add-collaborator", "acme-dev/nothing", "bob")
    assert err.value.code == 1
    with pytest.raises(CliError, match="'shop' is not OWNER/NAME") as usage:
        emulator.durafix("forge", "create-repo", "shop")
    assert usage.value.code == 2


def test_tokens_says_which_token_of_the_local_stack_is_whose(
    emulator: Emulator, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DURAFIX_FORGE_ADMIN_TOKEN")
    state = record_stack(emulator)

    tokens = as_json(emulator, capsys, "tokens")

    assert tokens["forge"] == {
        "api_url": emulator.forge.api_url,
        "source": f"the local stack in {emulator.state_dir}",
        "running": True,
    }
    assert {role: (t["login"], t["token"]) for role, t in tokens.items() if role != "forge"} == {
        "admin": (None, state.admin_token),
        "bot": ("durafix-bot", load_config(emulator.state_dir).forge_token),
        "reviewer": ("reviewer", state.reviewer_token),
    }
    for role in ("bot", "reviewer"):
        assert emulator.api("GET", "/user", tokens[role]["token"])["login"] == tokens[role]["login"]

    assert emulator.durafix("forge", "tokens") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"forge     {emulator.forge.api_url}  (the local stack in {emulator.state_dir}; running)"
    assert lines[1].startswith(f"admin     -             {state.admin_token}")
    assert lines[2].startswith(f"bot       durafix-bot   {emulator.bot_token}")
    assert lines[3].startswith(f"reviewer  reviewer      {state.reviewer_token}")
    assert "approves draft PRs" in lines[3]


def test_tokens_without_a_local_stack_is_not_found(emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DURAFIX_FORGE_ADMIN_TOKEN")

    with pytest.raises(CliError, match=r"no local stack in .*`durafix dev up`") as refused:
        emulator.durafix("forge", "tokens")

    assert refused.value.code == 3


def test_forge_help_lists_the_setup_commands_and_serve_is_still_the_emulators(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        run_command(["--state-dir", str(tmp_path), "forge", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for command in ("serve", "create-repo", "add-collaborator", "add-webhook", "tokens"):
        assert f"    {command}" in out

    with pytest.raises(SystemExit) as exited:
        run_command(["--state-dir", str(tmp_path), "forge", "serve", "--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage: forge serve ")
