"""``durafix start --report FILE``: the issue it opens, on the GitHub emulator over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from infra.forge.testing import ForgeHandle, running_forge
from infra.forge.testing import client as forge_client
from pipeline.cli.runs import open_report_issue
from pipeline.config import DurafixConfig


@contextmanager
def shop_of_alice(tmp_path: Path) -> Iterator[tuple[ForgeHandle, str]]:
    """A forge emulator where ``alice`` owns ``alice/shop``: the emulator and her token."""
    with running_forge(tmp_path / "forge") as forge:
        token = forge.create_user("alice")
        forge.create_repo(token, "shop")
        yield forge, token


def test_a_report_file_becomes_one_labelled_issue_titled_by_its_first_line(tmp_path: Path) -> None:
    report = tmp_path / "REPORT.md"
    report.write_text("# Cart total ignores quantities\n\nAdd two of one item: the total counts one.\n\n")
    with shop_of_alice(tmp_path) as (forge, token):
        config = DurafixConfig(
            state_dir=tmp_path / "state",
            forge_api_url=forge.api_url,
            forge_git_base=forge.base_url,
            forge_token=token,
        )

        number = open_report_issue(config, "alice/shop", report, label="durafix")

        repo = forge_client(forge.api_url, token).get_repo("alice/shop")
        issue = repo.get_issue(number)
        assert issue.title == "Cart total ignores quantities"
        assert issue.body == "Add two of one item: the total counts one.\n"
        assert [label.name for label in issue.labels] == ["durafix"]
        assert [i.number for i in repo.get_issues(state="all")] == [number]


def test_a_report_without_a_title_opens_nothing(tmp_path: Path) -> None:
    report = tmp_path / "REPORT.md"
    report.write_text("#\nno title above\n")
    with shop_of_alice(tmp_path) as (forge, token):
        config = DurafixConfig(state_dir=tmp_path / "state", forge_api_url=forge.api_url, forge_token=token)

        with pytest.raises(ValueError, match="the first line must be the report's title"):
            open_report_issue(config, "alice/shop", report, label="durafix")

        repo = forge_client(forge.api_url, token).get_repo("alice/shop")
        assert list(repo.get_issues(state="all")) == []
