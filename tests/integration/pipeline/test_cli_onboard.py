"""``durafix dev onboard DIR`` against a real emulator over HTTP: a git checkout with several commits and
tags becomes a repository durafix repairs, checked on the emulator and through the webhooks it sends."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli.command import CliError
from tests.support.github_emulator import (
    RECIPE,
    WEBHOOK_SECRET,
    Emulator,
    commit,
    configured_emulator,
    git,
    record_stack,
    running_receiver,
    signed_with,
)


@pytest.fixture
def emulator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Emulator]:
    with configured_emulator(tmp_path, monkeypatch) as handle:
        yield handle


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """``shop``: three commits on ``trunk`` (a lightweight tag on the first, an annotated one on the second),
    and a tag on a side branch that is no part of trunk's history."""
    repo = tmp_path / "shop"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "trunk")
    commit(repo, {"app.py": "print('shop')\n"}, "Shop")
    git(repo, "tag", "v0.1")
    commit(repo, {"durafix.yaml": RECIPE}, "Recipe")
    git(repo, "tag", "-a", "v0.2", "-m", "Second release")
    git(repo, "checkout", "-q", "-b", "side")
    commit(repo, {"side.txt": "side\n"}, "Side work")
    git(repo, "tag", "side-only")
    git(repo, "checkout", "-q", "trunk")
    commit(repo, {"cart.py": "TOTAL = 0\n"}, "Cart")
    return repo


def onboard_json(emulator: Emulator, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert emulator.durafix("dev", "onboard", *args, "--json") == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def test_a_checkout_becomes_a_repository_with_its_history_tags_collaborators_and_signed_webhook(
    emulator: Emulator, checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    head = git(checkout, "rev-parse", "HEAD")
    with running_receiver() as receiver:
        result = onboard_json(emulator, capsys, str(checkout), "--receiver-url", receiver.url)

        assert (result["repository"], result["created"]) == ("maintainer/shop", True)
        assert result["pushed"] == {
            "branch": "trunk",
            "as": "main",
            "head": head,
            "commits": 3,
            "tags": ["v0.1", "v0.2"],
        }
        refs = emulator.remote_refs("maintainer/shop")
        # trunk's whole history as main, with the tags in it (the annotated one as a tag object); nothing else.
        assert set(refs) == {"HEAD", "refs/heads/main", "refs/tags/v0.1", "refs/tags/v0.2", "refs/tags/v0.2^{}"}
        assert refs["refs/heads/main"] == head
        assert refs["refs/tags/v0.1"] == git(checkout, "rev-parse", "v0.1")
        assert refs["refs/tags/v0.2"] == git(checkout, "rev-parse", "v0.2")
        assert refs["refs/tags/v0.2^{}"] == git(checkout, "rev-parse", "v0.2^{commit}")
        commits = emulator.api("GET", "/repos/maintainer/shop/commits?sha=main", result["tokens"]["owner"]["token"])
        assert [c["sha"] for c in commits] == git(checkout, "rev-list", "HEAD").splitlines()
        # The checkout itself is untouched: no remote was added, no ref moved.
        assert git(checkout, "remote") == ""
        assert git(checkout, "rev-parse", "--abbrev-ref", "HEAD") == "trunk"

        for login in ("durafix-bot", "reviewer"):
            permission = emulator.api(
                "GET", f"/repos/maintainer/shop/collaborators/{login}/permission", result["tokens"]["owner"]["token"]
            )
            assert permission["permission"] == "write", login
        assert result["collaborators"] == {"durafix-bot": "push", "reviewer": "push"}
        hooks = emulator.api("GET", "/repos/maintainer/shop/hooks", result["tokens"]["owner"]["token"])
        assert [(h["config"]["url"], h["config"]["content_type"], h["events"]) for h in hooks] == [
            (receiver.url, "json", ["issues", "issue_comment", "pull_request", "pull_request_review"])
        ]
        assert result["receiver"] == {"url": receiver.url, "answering": True}
        assert result["label"] == {"name": "durafix", "created": True}

        # Whose each token is: the forge says so.
        for role, login in (("owner", "maintainer"), ("bot", "durafix-bot"), ("reviewer", "reviewer")):
            entry = result["tokens"][role]
            assert entry["login"] == login
            assert emulator.api("GET", "/user", entry["token"])["login"] == login
        assert result["tokens"]["bot"]["token"] == emulator.bot_token
        assert result["tokens"]["admin"]["token"] == emulator.forge.admin_token

        # A labelled issue reaches the receiver, signed with the configured secret.
        emulator.api(
            "POST",
            "/repos/maintainer/shop/issues",
            result["tokens"]["owner"]["token"],
            {"title": "Cart total is wrong", "body": "steps", "labels": ["durafix"]},
        )
        emulator.forge.wait_for_deliveries()
    issues = [d for d in receiver.received if d.headers.get("X-GitHub-Event") == "issues"]
    assert [json.loads(d.body)["action"] for d in issues] == ["opened"]
    assert all(signed_with(WEBHOOK_SECRET, d.body, d.headers) for d in receiver.received)
    assert json.loads(issues[0].body)["issue"]["labels"][0]["name"] == "durafix"
    assert result["next"][-1] == "durafix status maintainer/shop#<issue number> --watch"


def test_onboarding_again_pushes_new_commits_and_tags_and_creates_nothing_twice(
    emulator: Emulator, checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = onboard_json(emulator, capsys, str(checkout), "--name", "store")
    again = onboard_json(emulator, capsys, str(checkout), "--name", "store")
    assert (first["created"], again["created"]) == (True, False)
    assert (first["webhook"]["created"], again["webhook"]["created"]) == (True, False)
    assert again["webhook"]["id"] == first["webhook"]["id"]
    assert again["label"]["created"] is False

    newer = commit(checkout, {"cart.py": "TOTAL = 1\n"}, "Cart counts")
    git(checkout, "tag", "v0.3")
    third = onboard_json(emulator, capsys, str(checkout), "--name", "store")

    refs = emulator.remote_refs("maintainer/store")
    assert refs["refs/heads/main"] == newer and refs["refs/tags/v0.3"] == newer
    assert third["pushed"]["commits"] == 4
    token = third["tokens"]["owner"]["token"]
    assert len(emulator.api("GET", "/repos/maintainer/store/hooks", token)) == 1
    collaborators = emulator.api("GET", "/repos/maintainer/store/collaborators", token)
    assert sorted(c["login"] for c in collaborators) == ["durafix-bot", "maintainer", "reviewer"]


def test_a_main_that_moved_on_the_forge_is_never_overwritten(
    emulator: Emulator, checkout: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = onboard_json(emulator, capsys, str(checkout))
    owner = result["tokens"]["owner"]["token"]
    # A merged fix: main moves on the forge, and the checkout never pulled it.
    clone = tmp_path / "clone"
    url = emulator.clone_url("maintainer/shop").replace("://", f"://x-access-token:{owner}@")
    git(tmp_path, "clone", "-q", url, str(clone))
    merged = commit(clone, {"cart.py": "TOTAL = 2\n"}, "Merged fix")
    git(clone, "push", "-q", "origin", "HEAD:main")
    commit(checkout, {"notes.txt": "local\n"}, "Local work")

    with pytest.raises(CliError, match=r"nothing was overwritten: main \(fetch first\) refused") as refused:
        emulator.durafix("dev", "onboard", str(checkout))

    assert refused.value.code == 1
    assert f"git pull {emulator.clone_url('maintainer/shop')} main" in str(refused.value)
    assert emulator.remote_refs("maintainer/shop")["refs/heads/main"] == merged


def test_the_text_output_names_the_repository_the_tokens_and_how_to_start_the_receiver(
    emulator: Emulator, checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Nothing listens there: the hook is installed all the same, and the output says how to start it.
    assert emulator.durafix("dev", "onboard", str(checkout), "--receiver-url", "http://127.0.0.1:9/webhook") == 0

    out = capsys.readouterr().out
    assert f"repository    maintainer/shop  {emulator.forge.base_url}/maintainer/shop  (created)" in out
    assert "pushed        main = " in out and "(branch trunk, 3 commits); tags: v0.1, v0.2" in out
    assert "nothing answers at http://127.0.0.1:9/webhook" in out
    assert "  durafix serve --port 9   # in a terminal of its own: the receiver\n" in out
    assert f"  bot       durafix-bot   {emulator.bot_token}" in out
    assert "  durafix start --repo maintainer/shop --report REPORT.md" in out
    assert "  durafix status maintainer/shop#<issue number> --watch" in out


def test_a_checkout_without_a_committed_valid_recipe_is_refused_before_anything_is_created(
    emulator: Emulator, tmp_path: Path
) -> None:
    repo = tmp_path / "bare-app"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    commit(repo, {"app.py": "print()\n"}, "App")

    with pytest.raises(CliError, match=rf"has no durafix.yaml: .*`durafix init {repo}` writes a starter") as none:
        emulator.durafix("dev", "onboard", str(repo))
    assert none.value.code == 2

    (repo / "durafix.yaml").write_text(RECIPE)
    with pytest.raises(CliError, match=r"durafix\.yaml is not committed on HEAD"):
        emulator.durafix("dev", "onboard", str(repo))

    commit(repo, {"durafix.yaml": RECIPE + "tests: typo\n"}, "Recipe with a typo")
    with pytest.raises(CliError, match=r"bare-app: the committed durafix.yaml is refused: unknown keys: tests$"):
        emulator.durafix("dev", "onboard", str(repo))

    commit(repo, {"durafix.yaml": RECIPE}, "Recipe")
    (repo / "sub").mkdir()
    (repo / "sub" / "durafix.yaml").write_text(RECIPE)
    with pytest.raises(CliError, match="is not the root of a git repository"):
        emulator.durafix("dev", "onboard", str(repo / "sub"))
    with pytest.raises(CliError, match="'bare app' is not a repository name"):
        emulator.durafix("dev", "onboard", str(repo), "--name", "bare app")

    # Nothing was created for any of them, not even the owner's account.
    with pytest.raises(RuntimeError, match="-> 404"):
        emulator.api("GET", "/users/maintainer")


def test_without_an_emulator_to_administer_it_points_at_dev_up(
    emulator: Emulator, checkout: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DURAFIX_FORGE_ADMIN_TOKEN")

    with pytest.raises(CliError, match=r"works against the local stack.*`durafix dev up`") as refused:
        emulator.durafix("dev", "onboard", str(checkout))

    assert refused.value.code == 2


def test_on_the_local_stack_its_admin_and_reviewer_tokens_come_from_its_state(
    emulator: Emulator, checkout: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DURAFIX_FORGE_ADMIN_TOKEN")
    state = record_stack(emulator)

    result = onboard_json(emulator, capsys, str(checkout))

    assert result["tokens"]["admin"]["token"] == state.admin_token
    # The stack's reviewer keeps the token the stack recorded; no new one is minted for it.
    assert (result["tokens"]["reviewer"]["login"], result["tokens"]["reviewer"]["token"]) == (
        "reviewer",
        state.reviewer_token,
    )
    assert emulator.remote_refs("maintainer/shop")["refs/heads/main"] == git(checkout, "rev-parse", "HEAD")


def test_a_stack_whose_emulator_died_is_named_and_nothing_is_tried(
    emulator: Emulator, checkout: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DURAFIX_FORGE_ADMIN_TOKEN")
    dead = subprocess.Popen(["true"])
    dead.wait()
    record_stack(emulator, pid=dead.pid)

    with pytest.raises(
        CliError, match=r"the local stack's emulator \(.*\) is not running: `durafix dev up`"
    ) as refused:
        emulator.durafix("dev", "onboard", str(checkout))

    assert refused.value.code == 2
    with pytest.raises(RuntimeError, match="-> 404"):
        emulator.api("GET", "/users/maintainer")
